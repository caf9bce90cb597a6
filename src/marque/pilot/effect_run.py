"""The Run of an Effect Set execution on the Pilot: persisted, moved, revalidated on resume.

:mod:`marque.effects.run` holds the pure Run state machine; this module keeps
one Run per execution (``(marque_id, nonce)``) in the ledger and moves it
through :meth:`~marque.effects.run.RunRecord.advance` only — each move a
compare-and-set on the stored state and revision (``effect_run_advance``), so
two processes that both believe they own the execution cannot both move it,
and the loser re-reads rather than overwriting (no in-process lock).

The Run's life on a Pilot (docs/effects.md, choice 45):

* apply admission passes (guards fresh, rows reserved): ``preparing`` is
  stored with the CIDs the Run binds (:func:`bound_cids`), then ``running``
  (``admitted``);
* an attempt ends — sealed by its owner, or by reconciliation after a crash
  or a lost answer — and the Run follows every row's latest state
  (:func:`end_attempt`): ``succeeded`` / ``failed`` / ``needs_reconciliation``
  (``continuation_ended``; ``effect_reconciled`` once reconciling). An attempt
  that stopped early with nothing applied and rows the planner would still
  send (the target refused the connection) leaves a *continuation*: the Run
  waits in ``waiting_checkpoint`` under Marque's continuation Checkpoint, the
  CID of the set receipt that attempt sealed;
* a later attempt of the same nonce is that continuation's Resolution
  (``resolution_approved`` → ``resuming``), and :func:`resume` revalidates the
  bound CIDs first (:func:`~marque.effects.run.revalidate_resume`): any
  difference ends the Run ``failed`` (``needs_reconciliation`` while an
  Effect is unknown) with ``ACTQL_E_RESUME_REVALIDATION_FAILED``, and nothing
  is dispatched;
* recovery observes and never dispatches, but its tombstones are writes too:
  it writes none while the target's name points elsewhere than the Run bound
  (:func:`environment_holds`), so the rows stay unknown until it points back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from marque.cid import cid
from marque.effects._frozen import freeze, thaw
from marque.effects.dispatch import SQL_ROW_CAPABILITY, DispatchRecord, plan_set
from marque.effects.run import (
    TERMINAL,
    Cause,
    RunRecord,
    RunState,
    new_run,
    project,
    revalidate_resume,
)
from marque.errors import Conflict, ResumeRevalidationFailed
from marque.outcome import Status
from marque.pilot.context import PilotContext
from marque.pilot.effect_authorization import authorization
from marque.timefmt import iso_time

if TYPE_CHECKING:
    from marque.effects.preview import EffectPreview
    from marque.token import Marque

__all__ = ["bound_cids", "environment_holds", "start", "resume", "end_attempt", "projection",
           "record_of"]

R, C = RunState, Cause
#: Marque's preimages of what a Run binds at admission (resume revalidation compares them).
AUTHORIZATION_VERSION = "marque-run-authorization-context/0.1"
ENVIRONMENT_VERSION = "marque-run-environment-binding/0.1"
CONFIGURATION_VERSION = "marque-run-admitted-configuration/0.1"
#: The continuation Checkpoint of a Run paused between attempts.
CONTINUATION_VERSION = "marque-effect-continuation/0.1"
#: Compare-and-set retries before a Run move gives up (another process keeps moving it).
_RETRIES = 8


def bound_cids(ctx: PilotContext, marque: Marque, preview: EffectPreview) -> dict[str, str]:
    """The CIDs a Run binds when it is admitted, compared again on every resume:

    * ``authorization_context_cid``: the marque, its signer and the approval it carries;
    * ``environment_binding_cid``: this Pilot, its incarnation, the target's name and
      where that name points now (a file, or ``host:port/dbname``);
    * ``admitted_configuration_cid``: the preview, the connector capability evidence and
      the members' failure policies, and the marque's row ceiling.
    """
    return {
        "authorization_context_cid": cid({
            "version": AUTHORIZATION_VERSION, "marque_id": marque.marque_id,
            "issuer": marque.issuer, "kid": marque.kid,
            "authorization": authorization(marque)}),
        "environment_binding_cid": _environment_cid(ctx, marque.target),
        "admitted_configuration_cid": cid({
            "version": CONFIGURATION_VERSION,
            "effect_preview_cid": preview.effect_preview_cid,
            "capability": SQL_ROW_CAPABILITY.to_json(),
            "policies": {m.effect_id: m.failure_policy.value for m in preview.members},
            "max_rows": marque.budget.max_rows}),
    }


def _environment_cid(ctx: PilotContext, target: str) -> str:
    return cid({"version": ENVIRONMENT_VERSION, "pilot_id": ctx.pilot_id,
                "incarnation": ctx.incarnation, "target": target,
                "location": ctx.targets[target].location()})


def environment_holds(ctx: PilotContext, marque_id: str, nonce: str, target: str) -> bool:
    """Whether ``target`` still points where the execution's Run bound it (True for an
    execution without a Run). Recovery asks before it writes a tombstone: one written in
    another database would "prove" a row never applied that did apply where it was sent."""
    stored = ctx.ledger.effect_run_state(marque_id, nonce)
    if stored is None or target not in ctx.targets:
        return True
    return bool(stored["bound"].get("environment_binding_cid")
                == _environment_cid(ctx, target))


# -- the stored record ------------------------------------------------------------------


def _to_json(record: RunRecord) -> dict[str, Any]:
    return {"run_identity_cid": record.run_identity_cid, "state": record.state.value,
            "revision": record.revision, "updated_at": record.updated_at,
            "checkpoint_cid": record.checkpoint_cid,
            "unknown_effects": list(record.unknown_effects),
            "execution_unknown": record.execution_unknown,
            "terminal_error": thaw(record.terminal_error)}


def _from_json(body: dict[str, Any]) -> RunRecord:
    return RunRecord(run_identity_cid=body["run_identity_cid"], state=RunState(body["state"]),
                     revision=int(body["revision"]), updated_at=body["updated_at"],
                     checkpoint_cid=body.get("checkpoint_cid"),
                     unknown_effects=tuple(body.get("unknown_effects") or ()),
                     execution_unknown=bool(body.get("execution_unknown")),
                     terminal_error=freeze(body.get("terminal_error")))


def record_of(ctx: PilotContext, marque_id: str, nonce: str) -> RunRecord | None:
    """The execution's current Run record, or None (no Run: refused before admission)."""
    stored = ctx.ledger.effect_run_state(marque_id, nonce)
    return None if stored is None else _from_json(stored["record"])


def projection(ctx: PilotContext, marque_id: str, nonce: str) -> dict[str, Any] | None:
    """The execution's ``actql-run-state/0.1`` projection, or None if it has no Run."""
    record = record_of(ctx, marque_id, nonce)
    return None if record is None else project(record)


def _move(ctx: PilotContext, marque_id: str, nonce: str,
          moves: Sequence[tuple[RunState, Cause, dict[str, Any]]]) -> RunRecord:
    """Apply ``moves`` (each ``(to, cause, advance keywords)``) one compare-and-set at a time,
    from the stored record. A lost compare-and-set re-reads: a move another process already
    made (the stored state is already that move's) is not made twice."""
    stored = record_of(ctx, marque_id, nonce)
    assert stored is not None
    for to, cause, extra in moves:
        for _ in range(_RETRIES):
            after = stored.advance(to, cause, at=iso_time(ctx.clock()), **extra)
            if ctx.ledger.effect_run_advance(marque_id, nonce, _to_json(stored),
                                               _to_json(after), ctx.clock()):
                stored = after
                break
            again = record_of(ctx, marque_id, nonce)
            assert again is not None
            if again.state is to:
                stored = again
                break
            stored = again
        else:
            raise Conflict(
                f"the Run of marque {marque_id} nonce {nonce} kept moving under this process "
                f"({_RETRIES} compare-and-sets lost); it is left as another process moved it",
                detail={"state": stored.state.value})
    return stored


# -- the life of a Run ----------------------------------------------------------------------


def start(ctx: PilotContext, marque: Marque, nonce: str, preview: EffectPreview) -> RunRecord:
    """Store a new Run (``preparing``, with its bound CIDs) and admit it (``running``).
    A Run already stored (another process started it) is returned as it stands."""
    first = new_run(preview.run_identity_cid, at=iso_time(ctx.clock()))
    stored = ctx.ledger.effect_run_start(marque.marque_id, nonce, _to_json(first),
                                           bound_cids(ctx, marque, preview), ctx.clock())
    if _from_json(stored["record"]).state is not R.PREPARING:
        return _from_json(stored["record"])
    return _move(ctx, marque.marque_id, nonce, [(R.RUNNING, C.ADMITTED, {})])


def resume(ctx: PilotContext, marque: Marque, nonce: str,
           preview: EffectPreview) -> ResumeRevalidationFailed | None:
    """A later attempt of the nonce, before it dispatches anything: the Run's continuation
    resumes (``waiting_checkpoint → resuming``) and its bound CIDs are revalidated against
    the current ones. Returns the error that refuses the continuation (nothing may be
    dispatched), or None to go on. A Run that already ended refuses any continuation."""
    stored = ctx.ledger.effect_run_state(marque.marque_id, nonce)
    if stored is None:  # reserved by a Pilot before Runs were kept: this attempt admits it
        start(ctx, marque, nonce, preview)
        return None
    record = _from_json(stored["record"])
    if record.state in TERMINAL or record.state is R.NEEDS_RECONCILIATION:
        if record.terminal_error is not None:
            return ResumeRevalidationFailed(
                f"the Run of marque {marque.marque_id} nonce {nonce} ended {record.state} when "
                "its resume did not revalidate; nothing more is dispatched for it",
                detail={"state": record.state.value, "run_state": project(record)})
        return None  # nothing left to dispatch: the planner finds no row
    if record.state in (R.RUNNING, R.PREPARING):
        # A crash came between the last attempt's end and its Run move: pause it now.
        record = _move(ctx, marque.marque_id, nonce, [
            *([(R.RUNNING, C.ADMITTED, {})] if record.state is R.PREPARING else []),
            (R.WAITING_CHECKPOINT, C.CHECKPOINT_PERSISTED,
             {"checkpoint_cid": _continuation_cid(preview, None)})])
    if record.state is R.WAITING_CHECKPOINT:
        record = _move(ctx, marque.marque_id, nonce,
                       [(R.RESUMING, C.RESOLUTION_APPROVED, {})])
    decision = revalidate_resume(record, stored["bound"], bound_cids(ctx, marque, preview),
                                 at=iso_time(ctx.clock()))
    if decision.dispatch:
        return None
    exited = decision.record
    _move(ctx, marque.marque_id, nonce, [(exited.state, C.RESUME_REVALIDATION_FAILED,
                                            {"terminal_error": thaw(exited.terminal_error)})])
    return decision.error()


def _continuation_cid(preview: EffectPreview, set_receipt_cid: str | None) -> str:
    return cid({"version": CONTINUATION_VERSION, "run_identity_cid": preview.run_identity_cid,
                "effect_preview_cid": preview.effect_preview_cid,
                "set_receipt_cid": set_receipt_cid})


def _unknown_effects(preview: EffectPreview, states: Sequence[str]) -> list[str]:
    unknown, position = [], 0
    for member in preview.members:
        if "unknown" in states[position:position + member.item_count]:
            unknown.append(member.effect_id)
        position += member.item_count
    return unknown


def end_attempt(ctx: PilotContext, marque_id: str, nonce: str, preview: EffectPreview,
                states: Sequence[str], status: Status, records: Sequence[Sequence[DispatchRecord]],
                set_receipt_cid: str, *, attempts_left: bool = True) -> RunRecord | None:
    """Move the Run to where the attempt left it: every row's latest state (``states``,
    in preview order), the attempt's status, and the dispatch ledger by member
    (``records``). None if the execution has no Run.

    An attempt the target refused before any row was sent pauses the Run in
    ``waiting_checkpoint`` for the nonce's next attempt, unless ``attempts_left`` is
    false: with no attempt left nothing can continue it, so it ends by its rows'
    states (``failed`` while rows are unattempted) rather than waiting for ever.
    """
    current = record_of(ctx, marque_id, nonce)
    if current is None or current.state in TERMINAL:
        return current
    plan = plan_set([(member.failure_policy, rows)
                     for member, rows in zip(preview.members, records, strict=True)])
    unknown = _unknown_effects(preview, states)
    if (status is Status.ABORTED_NOT_APPLIED and plan.next is not None and not unknown
            and attempts_left):
        checkpoint = _continuation_cid(preview, set_receipt_cid)
        if current.state is R.WAITING_CHECKPOINT:
            return current
        moves: list[tuple[RunState, Cause, dict[str, Any]]] = []
        if current.state is R.NEEDS_RECONCILIATION:
            moves.append((R.RUNNING, C.EXECUTION_OBSERVED, {"unknown_effects": []}))
        moves.append((R.WAITING_CHECKPOINT, C.CHECKPOINT_PERSISTED,
                      {"checkpoint_cid": checkpoint, "unknown_effects": []}))
        return _move(ctx, marque_id, nonce, moves)
    from marque.effects.receipts import run_outcome

    to = RunState(run_outcome(states))
    if to is current.state and set(unknown) == set(current.unknown_effects):
        return current
    if current.state is R.WAITING_CHECKPOINT:  # resumed by recovery, never by a dispatch
        return current
    cause = (C.EFFECT_RECONCILED if current.state is R.NEEDS_RECONCILIATION
             else C.CONTINUATION_ENDED)
    return _move(ctx, marque_id, nonce, [(to, cause, {"unknown_effects": unknown})])
