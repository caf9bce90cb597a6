"""Effect Set requests at the Harbourmaster (DESIGN §7, §11): what differs from statements.

An Effect Set request is a request like any other — the same scope, lifecycle,
routing, Checkpoint, Resolutions and marque — whose change is an Effect Set
(:class:`~marque.effects.request.EffectSetSubmission`: a declaration and its
captured inputs) until its Pilot previews it. From then on the one thing that
is approved and executed is that preview, named by its ``effect_preview_cid``:

* the Checkpoint seals ``preview_cid = effect_preview_cid`` and ``change_cid``
  = the marque's change, :class:`~marque.change.EffectSetChange` of that CID,
  so approving signs exactly the complete set preview — no subset can be
  released, since no other change exists to issue;
* the marque's ``change`` is ``{effect_preview_cid, change_cid}``, as ``marque
  issue --effects-preview`` makes it, with ``req`` and ``approval`` as for a
  statement marque.

This module holds the pure parts: reading a stored change back, checking that
a Pilot's answer is the preview of this request, and the change a marque
carries. The service (:mod:`marque.harbour.service`) calls them.
"""

from __future__ import annotations

from typing import Any

from marque.change import AnyChange, Change, EffectSetChange
from marque.effects.preview import EffectPreview, verify_preview
from marque.effects.request import EffectSetSubmission
from marque.errors import InvalidInput, MarqueError

__all__ = ["RequestChange", "stored_change", "effect_preview_mismatch", "marque_change",
           "is_effect_set"]

#: What a request asks for: statements, or an Effect Set before its preview.
RequestChange = Change | EffectSetSubmission


def is_effect_set(claim: Any) -> bool:
    """Whether a stored request change is an Effect Set's (``{effect_set, change_cid}``)."""
    return isinstance(claim, dict) and "effect_set" in claim


def stored_change(claim: Any) -> RequestChange:
    """A stored request change read back strictly (its CID rechecked)."""
    if is_effect_set(claim):
        return EffectSetSubmission.from_claim(claim)
    return Change.from_claim(claim)


def effect_preview_mismatch(preview: Any, submission: EffectSetSubmission, *, pilot_id: str,
                            target: str) -> tuple[EffectPreview | None, str]:
    """The verified preview if ``preview`` is this submission's on this Pilot and target,
    else ``(None, what differs)``.

    Its CIDs are recomputed (:func:`~marque.effects.preview.verify_preview`); it must
    name this Pilot and target, the submission's ``caller_input_intent_cid`` (so its
    inputs) and exactly the declared members with the strength asked. Its authoring
    context may name another request scope: the Pilot keeps the first preview of a CID
    (docs/effects.md, choice 28), and the keys are then that first request's.
    """
    try:
        verified = verify_preview(preview)
    except MarqueError as exc:
        return None, f"it is not a valid Effect preview ({exc.message})"
    if verified.pilot_id != pilot_id:
        return None, "another Pilot"
    if verified.target != target:
        return None, "another target"
    if verified.caller_input_intent_cid != submission.caller_input_intent_cid:
        return None, "another caller_input_intent_cid (other inputs)"
    declared = [(m.effect_id, m.kind.value, m.table, tuple(m.key), m.command,
                 m.failure_policy.value, m.max_items,
                 submission.strength.get(m.effect_id, "full_diff"))
                for m in submission.declaration.members]
    shown = [(m.effect_id, m.kind.value, m.table, tuple(m.key), m.command,
              m.failure_policy.value, m.max_items, m.strength.value)
             for m in verified.members]
    if [tuple(str(v) for v in d) for d in declared] != [tuple(str(v) for v in s)
                                                        for s in shown]:
        return None, "other members than the declaration's"
    return verified, ""


def marque_change(claim: Any, preview: Any) -> AnyChange:
    """The change a request's marque carries: its statements, or for an Effect Set the
    :class:`EffectSetChange` naming its stored preview's ``effect_preview_cid``."""
    if is_effect_set(claim):
        if not isinstance(preview, dict) or not isinstance(
                preview.get("effect_preview_cid"), str):
            raise InvalidInput("an Effect Set request has no stored preview to issue")
        return EffectSetChange(preview["effect_preview_cid"])
    return Change.from_claim(claim)
