"""Previews (DESIGN §10): what a change would do, measured on the target and rolled back.

A preview token (signed by a trusted issuer, ``typ: marque-preview+jwt``) asks
this Pilot to run a change's statements on one of its targets. Under the
target's preview mode from ``pilot.json`` (``previews``; default
``rollback``) the statements run in a transaction that is always rolled back,
giving the exact rows per statement, samples of any result set and the
changed rows' before- and after-images (:mod:`marque.target.row_images`,
named together by ``diff_cid``), or only ``EXPLAIN`` runs. A preview never
claims a nonce, stamps or spends budget; the token's ``jti`` is remembered
so it runs once, and each preview is logged to the Pilot's logbook
(``preview.run``).

Each statement carries its ``preview_caveats`` (``marque.preview_caveats``):
what the rolled-back preview cannot show — a sequence it advanced for good, a
notification, a volatile function, triggers, a foreign table, DDL that cannot
run in a transaction (not run at all) — and ``caveats`` lists their codes.

A preview token whose ``change`` is an Effect Set (``{effect_set: …}``,
DESIGN §7) is answered with the Effect Set's preview instead
(:func:`marque.pilot.effects.preview_effects`): the rows it changes read from
the target, the ``actql-effect-preview/0.1`` object stored in the ledger by its
``effect_preview_cid`` — what a marque then names.
"""

from __future__ import annotations

import time
from typing import Any

from marque.change import Change
from marque.cid import cid
from marque.effects.request import EffectPreviewRequest
from marque.pilot.config import PREVIEW_MODES
from marque.pilot.core import Pilot
from marque.preview_caveats import caveat_codes
from marque.target.row_images import diff_cid
from marque.timefmt import iso_time
from marque.token.service_tokens import PreviewToken, verify_preview_token

PREVIEW_VERSION = "marque-preview/0.1"


def preview_mode(pilot: Pilot, target: str, modes: dict[str, str] | None = None) -> str:
    """The preview mode of ``target``: ``modes`` (pilot.json ``previews``), else rollback."""
    configured = modes if modes is not None else getattr(pilot, "previews", None) or {}
    mode = configured.get(target, PREVIEW_MODES[0])
    return mode if mode in PREVIEW_MODES else PREVIEW_MODES[0]


def run_preview(
    pilot: Pilot, token: str, *, modes: dict[str, str] | None = None
) -> dict[str, Any]:
    """Verify ``token`` and preview its change; return the preview object.

    ``modes`` is ``pilot.json``'s ``previews`` (target → mode); when None the
    Pilot's ``previews`` attribute is used if it has one. Refusals are the
    marque refusals (``marque_invalid``, ``marque_expired``, ``wrong_pilot``,
    ``wrong_incarnation``, ``unknown_target``, ``pop_replayed``, ``target_replaced``); a statement
    error is ``preview_failed``. Nothing is claimed, stamped or spent.
    """
    now = pilot.clock()
    read = verify_preview_token(
        token, pilot.trusted, pilot_id=pilot.pilot_id, incarnation=pilot.incarnation,
        targets=pilot.targets.keys(), remember_jti=pilot.ledger.remember_pop_jti, now=now,
        skew_seconds=pilot.options.skew_seconds,
    )
    # An approver must never see rows of another database than the name stands for.
    pilot.continuity.refuse_if_replaced(read.target)
    if isinstance(read.change, EffectPreviewRequest):
        from marque.pilot.effects import preview_effects

        return preview_effects(pilot.context, read.change, read.target, issuer=read.issuer,
                               jti=read.jti).to_json()
    preview = _statement_preview(pilot, read, read.change,
                                 preview_mode(pilot, read.target, modes), now)
    _log_preview(pilot, read, preview)
    return preview


def _statement_preview(pilot: Pilot, read: PreviewToken, change: Change, mode: str,
                       now: float) -> dict[str, Any]:
    """The change's statements run on the target under ``mode``, rolled back: the preview
    object, its ``preview_cid`` over everything in it."""
    timeout_ms = change.statement_timeout_ms or pilot.options.statement_timeout_ms
    started = time.monotonic()
    statements = pilot.targets[read.target].preview(
        change, mode=mode, sample_rows=read.sample_rows, statement_timeout_ms=timeout_ms)
    elapsed_ms = round((time.monotonic() - started) * 1000, 3)
    counted = [s["rows"] for s in statements if s["rows"] is not None]
    total_rows = sum(counted) if len(counted) == len(statements) else None
    within = (None if read.max_rows is None or total_rows is None
              else total_rows <= read.max_rows)
    preview: dict[str, Any] = {
        "version": PREVIEW_VERSION,
        "mode": mode,
        "pilot": {"id": pilot.pilot_id, "incarnation": pilot.incarnation},
        "target": read.target,
        "change_cid": change.change_cid,
        "statements": statements,
        # What a rolled-back preview cannot show (each statement names its own); inside
        # the object, so preview_cid — what approvers approve — covers them.
        "caveats": caveat_codes({"statements": statements}),
        "total_rows": total_rows,
        "max_rows": read.max_rows,
        "within_max_rows": within,
        # The row images' own content id: what a Checkpoint seals as the diff approved.
        "diff_cid": diff_cid(statements),
        "elapsed_ms": elapsed_ms,
        "at": iso_time(now),
    }
    preview["preview_cid"] = cid(preview, exclude="preview_cid")
    return preview


def _log_preview(pilot: Pilot, read: PreviewToken, preview: dict[str, Any]) -> None:
    """The preview's ``preview.run`` entry in the Pilot's logbook, if it keeps one."""
    if pilot.logbook is None:
        return
    pilot.logbook.append(
        "preview.run", f"preview/{read.jti}",
        {"jti": read.jti, "issuer": read.issuer, "target": read.target,
         "mode": preview["mode"], "change_cid": preview["change_cid"],
         "total_rows": preview["total_rows"], "within_max_rows": preview["within_max_rows"],
         "preview_cid": preview["preview_cid"], "caveats": preview["caveats"],
         "pilot": preview["pilot"]},
    )
