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

So even an allowed Effect Set is previewed before its marque is issued.
:class:`EffectSetRequest` is the
:class:`~marque.harbour.request_change.RequestChange` of a submission; the
service (:mod:`marque.harbour.service`) calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from marque.change import Budget, EffectSetChange
from marque.effects.preview import EffectPreview, verify_preview
from marque.effects.request import EffectPreviewRequest, EffectSetSubmission
from marque.errors import (
    EffectPreviewInvalid,
    EffectUnsupported,
    InvalidInput,
    MarqueError,
    PreviewFailed,
    UnknownTarget,
)
from marque.harbour.identity import RequestIdentity, effect_request_identity
from marque.harbour.routing import Decision, RoutingConfig, evaluate_effects

if TYPE_CHECKING:
    from marque.harbour.store.base import PilotRecord

__all__ = ["EffectSetRequest", "effect_preview_mismatch", "effect_set_change", "is_effect_set"]


def is_effect_set(claim: Any) -> bool:
    """Whether a stored request change is an Effect Set's (``{effect_set, change_cid}``)."""
    return isinstance(claim, dict) and "effect_set" in claim


@dataclass(frozen=True)
class EffectSetRequest:
    """A request for an Effect Set: the
    :class:`~marque.harbour.request_change.RequestChange` of a submission."""

    submission: EffectSetSubmission

    marque_names_preview: ClassVar[bool] = True
    preview_refusals: ClassVar[tuple[type[MarqueError], ...]] = (
        PreviewFailed, EffectPreviewInvalid, EffectUnsupported, UnknownTarget)

    @classmethod
    def from_claim(cls, claim: Any) -> EffectSetRequest:
        """A stored ``{effect_set, change_cid}`` read back, bound and its CID rechecked."""
        return cls(EffectSetSubmission.from_claim(claim))

    @property
    def change_cid(self) -> str:
        """The submission's ``change_cid`` (before any preview)."""
        return self.submission.change_cid

    def to_claim(self) -> dict[str, Any]:
        """``{effect_set, change_cid}``."""
        return self.submission.to_claim()

    def identity(self, harbour_id: str, principal: str, request_id: str, budget: Budget,
                 ttl_seconds: int, pilot_id: str, target: str) -> RequestIdentity:
        """:func:`~marque.harbour.identity.effect_request_identity` of the submission."""
        return effect_request_identity(harbour_id, principal, request_id, self.submission,
                                       budget, ttl_seconds, pilot_id, target)

    def route(self, config: RoutingConfig, principal: str, target: str,
              dialect: str) -> Decision:
        """Every member routed by its kind and table."""
        return evaluate_effects(
            config, principal, target,
            [(m.kind.value, m.table) for m in self.submission.declaration.members], dialect)

    def routed(self, decision: Decision) -> EffectSetRequest:
        """The submission as it is: an Effect Set is never routed as a read."""
        return self

    @property
    def read_only(self) -> bool:
        """Never: an Effect Set always writes or commands."""
        return False

    def preview_change(self, logical_request_scope: str) -> EffectPreviewRequest:
        """The submission's preview request, bound to the request's scope and its Run."""
        return self.submission.preview_request(logical_request_scope)

    def previewed(self, answer: Any, pilot: PilotRecord,
                  target: str) -> tuple[dict[str, Any], str]:
        """The verified preview (as JSON) and its ``effect_preview_cid``, once it is shown
        to be this submission's on this Pilot and target (:func:`effect_preview_mismatch`)."""
        verified, mismatch = effect_preview_mismatch(answer, self.submission,
                                                     pilot_id=pilot.pilot_id, target=target)
        if verified is None:
            raise PreviewFailed(f"the Pilot's preview does not describe this Effect Set "
                                f"({mismatch})")
        return verified.to_json(), verified.effect_preview_cid

    def refused(self, exc: MarqueError, request_id: str) -> MarqueError:
        """The refusal itself (its message, SQLSTATE and detail), naming the request too."""
        return type(exc)(exc.message, sqlstate=exc.sqlstate,
                         detail={**exc.detail, "id": request_id})

    def marque_change(self, preview: dict[str, Any] | None) -> EffectSetChange:
        """The :class:`EffectSetChange` naming the stored preview."""
        return effect_set_change(preview)


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


def effect_set_change(preview: Any) -> EffectSetChange:
    """The :class:`EffectSetChange` naming a stored preview's ``effect_preview_cid``;
    ``InvalidInput`` if there is none."""
    if not isinstance(preview, dict) or not isinstance(preview.get("effect_preview_cid"), str):
        raise InvalidInput("an Effect Set request has no stored preview to issue")
    return EffectSetChange(preview["effect_preview_cid"])
