"""Effect Sets on the Pilot (DESIGN §7, seed 002): preview, apply row by row, reconcile.

The pure rules live in :mod:`marque.effects`; this module is where they meet
the Pilot's ledger and targets:

* :func:`preview_effects` reads the exact scope from the target (every row a
  member changes, by key: ``present`` with its whole row, or ``absent``),
  builds the preview (``executed: false``), stores it content addressed in the
  ledger and logs it. Nothing is claimed, stamped or spent.
* :func:`admit` (before the claim: refusals claim nothing) finds the marque's
  preview in the ledger and proves the target's capability realises every
  member's failure policy (``effect_unsupported`` otherwise).
* :func:`apply_claimed` runs inside an execution the Pilot has claimed, under
  the marque's nonce and budget: apply admission revalidates every guard
  (``stale_preview``: nothing dispatched), reserves every row ``prepared`` in
  the dispatch ledger, then dispatches one row at a time as the halt/continue
  planner says — each row in its own commit unit on the target with its row
  stamp — and seals member and set receipts.
* :func:`reconcile_effects` settles an execution with unknown rows from their
  row stamps (a tombstone per row, never a resend): a row left ``dispatching``
  by an owner that is gone becomes ``unknown`` first; receipts missing after a
  crash are sealed from the ledger; each unknown row's reconciliation receipt
  extends its chain.

The nonce's attempt settles like any other (the outcome lattice): ``applied``
when any row applied, ``aborted_not_applied`` when none did and none is
unknown, ``indeterminate`` while any row is unknown. Its ``result`` carries
``{effect_set: {effect_preview_cid, set_receipt_cid, status, run_outcome, rows}}``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from marque.change import EffectSetChange
from marque.crash import crash_point
from marque.effects._frozen import freeze, thaw
from marque.effects.cids import row_version_cid
from marque.effects.declare import KEYED, BoundItem, BoundMember, Kind
from marque.effects.dispatch import (
    SQL_ROW_CAPABILITY,
    DispatchRecord,
    DispatchState,
    advance,
    check_capability,
    plan_set,
    prepare,
)
from marque.effects.fence import failed_rows
from marque.effects.preview import (
    EffectPreview,
    MemberPreview,
    RowPreview,
    build_preview,
    check_fresh,
    verify_preview,
)
from marque.effects.receipts import (
    MemberReceipt,
    ReconciliationChain,
    SetReceipt,
    effective_states,
    entry_from_ledger,
    member_receipt,
    row_outcome_receipt,
    run_outcome,
    set_receipt,
)
from marque.effects.request import EffectPreviewRequest
from marque.effects.run import RunRecord, project
from marque.errors import (
    EffectPreviewInvalid,
    EffectUnsupported,
    Indeterminate,
    MarqueError,
    MaxRowsExceeded,
    NotApplied,
    PreviewFailed,
    StalePreview,
    StatementError,
    TargetUnavailable,
    UnknownTarget,
)
from marque.outcome import Status
from marque.pilot import effect_run
from marque.pilot.context import PilotContext
from marque.pilot.effect_authorization import authorization
from marque.pilot.stream import Observation
from marque.target import TargetAttempt
from marque.target.rows import (
    ColumnsMissing,
    RowEvidence,
    RowStampConflict,
    RowTarget,
    RowWrite,
)
from marque.timefmt import iso_time

if TYPE_CHECKING:
    from marque.ledger import AttemptRecord
    from marque.ledger.effects import DispatchRow
    from marque.pilot.stream import AttemptStream
    from marque.token import Marque

__all__ = ["preview_effects", "admit", "apply_claimed", "reconcile_effects",
           "execution_receipts"]

D = DispatchState


def _row_target(ctx: PilotContext, target: str) -> RowTarget:
    if target not in ctx.targets:
        raise UnknownTarget(f"this Pilot serves no target named {target} "
                            "(see `marque pilot target list`)")
    found = ctx.targets[target]
    if not isinstance(found, RowTarget):
        raise EffectUnsupported(f"target {target} ({type(found).__name__}) cannot hold row "
                                "stamps: Effect Sets need a SQLite or PostgreSQL target")
    return found


def _identity(member: BoundMember | MemberPreview, key_or_item: Any) -> dict[str, Any]:
    """The key values a row is read and written by (``{}`` for an unkeyed create)."""
    kind = member.declaration.kind if isinstance(member, BoundMember) else member.kind
    key = member.declaration.key if isinstance(member, BoundMember) else member.key
    if isinstance(key_or_item, BoundItem):
        identity, values = thaw(key_or_item.row_or_item_key), thaw(key_or_item.values)
    else:  # a RowPreview
        identity, values = thaw(key_or_item.row_or_item_key), thaw(
            key_or_item.intended_changes["values"])
    if kind in KEYED:
        return dict(identity)
    if kind is Kind.CREATE and key:
        return {column: values[column] for column in key}
    return {}


# -- preview ----------------------------------------------------------------------------


def preview_effects(ctx: PilotContext, request: EffectPreviewRequest, target: str, *,
                    issuer: str | None = None, jti: str | None = None) -> EffectPreview:
    """Read the rows ``request`` changes from ``target``, build and store its preview.

    Nothing is claimed, stamped or spent; the preview is kept in the ledger
    under its ``effect_preview_cid`` (the first one of a CID stays, with the
    keys its authoring context derived) and logged (``effects.previewed``).
    """
    rows = _row_target(ctx, target)
    now = ctx.clock()
    bound = request.bound()
    reads: dict[str, dict[str, Any]] = {}
    for member in bound.members:
        if member.declaration.kind is Kind.COMMAND:
            continue  # a command's table names its target, not a table to read
        # A member that reads no row (a create without a key) still has its columns checked.
        items = [item for item in member.items if item.read_key is not None]
        try:
            states = rows.read_rows(member.declaration.table,
                                    [_identity(member, i) for i in items],
                                    (*member.declaration.key, *member.input.columns))
        except StatementError as exc:
            # The database refused the read itself (no such table or column): a preview that
            # cannot be made, as a statement preview that fails is; asking again cannot help.
            raise PreviewFailed(
                f"{member.declaration.effect_id}: reading {member.declaration.table} on target "
                f"{target} failed: {exc.message}; nothing was changed",
                sqlstate=exc.sqlstate,
                detail={**exc.detail, "rule": "read_failed",
                        "effect_id": member.declaration.effect_id}) from exc
        if items:
            reads[member.declaration.effect_id] = {
                str(item.read_key): state for item, state in zip(items, states, strict=True)}
    built = build_preview(bound, reads, pilot_id=ctx.pilot_id, target=target,
                          logical_request_scope=request.logical_request_scope,
                          run_identity_cid=request.run_identity_cid, strength=request.strength,
                          previewed_at=iso_time(now))
    stored = ctx.ledger.store_effect_preview(built.effect_preview_cid, target,
                                               built.to_json(), now)
    preview = verify_preview(stored)
    if ctx.logbook is not None:
        ctx.logbook.append(
            "effects.previewed", f"effects/preview/{preview.effect_preview_cid}/{jti or now}",
            {"effect_preview_cid": preview.effect_preview_cid, "target": target,
             "issuer": issuer, "jti": jti, "members": [
                 {"effect_id": m.effect_id, "kind": m.kind.value, "table": m.table,
                  "item_count": m.item_count} for m in preview.members],
             "pilot": {"id": ctx.pilot_id, "incarnation": ctx.incarnation}})
    return preview


# -- admission ----------------------------------------------------------------------------


def _stored_preview(ctx: PilotContext, effect_preview_cid: str) -> EffectPreview:
    stored = ctx.ledger.effect_preview(effect_preview_cid)
    if stored is None:
        raise EffectPreviewInvalid(
            f"this Pilot holds no Effect preview {effect_preview_cid}: a marque for an Effect "
            "Set runs only where its preview was made (`marque effects preview`)",
            detail={"rule": "unknown_preview", "effect_preview_cid": effect_preview_cid})
    return verify_preview(stored)


def admit(ctx: PilotContext, marque: Marque) -> EffectPreview:
    """Before the claim: the marque's preview is held here, is for this Pilot and target,
    and the target can realise every member's policy. Refusals claim nothing."""
    change = marque.change
    assert isinstance(change, EffectSetChange)
    preview = _stored_preview(ctx, change.effect_preview_cid)
    if preview.pilot_id != ctx.pilot_id or preview.target != marque.target:
        raise EffectPreviewInvalid(
            f"preview {preview.effect_preview_cid} is for Pilot {preview.pilot_id} target "
            f"{preview.target}, not this marque's {ctx.pilot_id} / {marque.target}",
            detail={"rule": "binding"})
    _row_target(ctx, marque.target)
    for member in preview.members:
        if member.kind is Kind.COMMAND:
            raise EffectUnsupported(f"{member.effect_id}: a SQL target runs no commands",
                                    detail={"effect_id": member.effect_id})
        check_capability(member.failure_policy, SQL_ROW_CAPABILITY)
    return preview


# -- apply ---------------------------------------------------------------------------------


def _by_member(preview: EffectPreview, rows: list[DispatchRow]) -> list[list[DispatchRow]]:
    grouped: list[list[DispatchRow]] = [[] for _ in preview.members]
    for row in rows:
        grouped[row.member_index].append(row)
    return grouped


def _write(ctx: PilotContext, marque_id: str, nonce: str, member: MemberPreview, row: RowPreview,
           record: DispatchRecord, expires_at: float | None, target_id: str | None) -> RowWrite:
    values = dict(thaw(row.intended_changes["values"]))
    identity = _identity(member, row)
    if member.kind is not Kind.CREATE:
        values = {k: v for k, v in values.items() if k not in identity}
    return RowWrite(
        marque_id=marque_id, nonce=nonce, dispatch_attempt=max(record.attempt, 1),
        pilot_id=ctx.pilot_id, incarnation=ctx.incarnation,
        effect_apply_key=record.effect_apply_key, row_idempotency_key=record.row_idempotency_key,
        kind=member.kind.value, table=member.table, key=member.key, identity=identity,
        values=values, guard=dict(thaw(row.target_version)),
        fence=None if member.fence is None else dict(thaw(member.fence)),
        statement_timeout_ms=ctx.options.statement_timeout_ms, expires_at=expires_at,
        target_id=target_id)


def _current_versions(target: RowTarget, preview: EffectPreview) -> dict[str, str]:
    """``current_target_versions`` for apply admission: every guarded row, read now."""
    versions: dict[str, str] = {}
    for member in preview.members:
        guarded = [row for row in member.changes
                   if row.target_version["kind"] != "not_applicable"]
        if not guarded:
            continue
        columns = {c for row in member.changes for c in row.intended_changes["values"]}
        try:
            states = target.read_rows(member.table,
                                      [_identity(member, row) for row in guarded],
                                      (*member.key, *columns))
        except ColumnsMissing as exc:
            # The table no longer has what the preview names (or never had: a preview an
            # older Pilot made): the guards cannot be read, and missing evidence is a
            # mismatch, never a waiver. Nothing is reserved or sent.
            raise StalePreview(
                f"{member.effect_id}: reading {member.table} for apply admission failed: "
                f"{exc.message}; the preview no longer describes the target and nothing was "
                "sent: re-request, so a new preview is taken and approved",
                sqlstate=exc.sqlstate,
                detail={**exc.detail, "rule": "read_failed",
                        "effect_id": member.effect_id}) from exc
        for row, state in zip(guarded, states, strict=True):
            versions[row.row_preview_cid] = row_version_cid(state)
    return versions


def _outcome_of(exc: MarqueError) -> dict[str, Any]:
    return {"state": "failed", "error": {"code": exc.code, "message": exc.message}}


def _applied(member: MemberPreview, rows_affected: int | None,
             action: str | None) -> dict[str, Any]:
    outcome: dict[str, Any] = {"state": "applied", "rows_affected": rows_affected or 0}
    if member.kind is Kind.UPSERT:
        outcome["action"] = action
    return outcome


def _evidence_outcome(member: MemberPreview, row: RowPreview, evidence: RowEvidence,
                      cause: str) -> dict[str, Any]:
    if evidence.status is Status.APPLIED:
        return _applied(member, evidence.rows_affected, evidence.action)
    if evidence.status is Status.ABORTED_NOT_APPLIED:
        return {"state": "failed", "error": {"code": cause,
                                             "message": f"reconciled: {evidence.reason}"}}
    return {"state": "unknown", "reason": evidence.reason or cause,
            "idempotency_key": row.row_idempotency_key}


_ROW_EVENT = {"applied": "row_applied", "accepted": "row_accepted", "failed": "row_failed",
              "unknown": "row_unknown"}


def _settle_row(ctx: PilotContext, marque_id: str, nonce: str, preview: EffectPreview,
                member: MemberPreview, row: RowPreview, dispatching: DispatchRecord,
                outcome: dict[str, Any], fence: str | None) -> DispatchRecord | None:
    """Move a row out of ``dispatching`` (or ``unknown``) to its outcome's state, with its
    outcome receipt when terminal; None if another owner moved it first."""
    after = advance(dispatching, D(outcome["state"]), fence=fence)
    receipt = None
    if outcome["state"] != "unknown":
        assert after.dispatch_entry_cid is not None
        receipt = thaw(row_outcome_receipt(preview, member, row,
                                           dispatch_entry_cid=after.dispatch_entry_cid,
                                           attempt=after.attempt, outcome=outcome))
    moved = ctx.ledger.effect_move(marque_id, nonce, dispatching, after, now=ctx.clock(),
                                     outcome=outcome, outcome_receipt=receipt)
    return after if moved else None


def _target_attempt(marque: Marque, ctx: PilotContext, nonce: str, number: int) -> TargetAttempt:
    return TargetAttempt(marque.marque_id, nonce, number, ctx.pilot_id, ctx.incarnation,
                         None, marque.budget.max_rows, ctx.options.statement_timeout_ms,
                         expires_at=float(marque.expires_at), target=marque.target,
                         target_id=ctx.target_ids.get(marque.target))


def apply_claimed(ctx: PilotContext, marque: Marque, nonce: str, record: AttemptRecord,
                  stream: AttemptStream) -> Observation:
    """Apply the marque's Effect Set in a claimed attempt; what it did, as one observation."""
    target_attempt = _target_attempt(marque, ctx, nonce, record.attempt)

    def aborted(exc: MarqueError) -> Observation:
        stream.emit("rolled_back", error=exc.to_dict())
        return Observation(target_attempt, Status.ABORTED_NOT_APPLIED, error=exc.to_dict())

    try:
        preview = admit(ctx, marque)
        target = _row_target(ctx, marque.target)
        items = sum(member.item_count for member in preview.members)
        if items > marque.budget.max_rows:
            return aborted(MaxRowsExceeded(
                f"the Effect Set changes {items} rows; the marque allows at most "
                f"{marque.budget.max_rows}; nothing was dispatched"))
        rows = ctx.ledger.effect_rows(marque.marque_id, nonce)
        if not rows:
            # Apply admission: every guard, read now; any difference dispatches nothing.
            check_fresh(preview, _current_versions(target, preview))
            reserved = [(mi, ri, prepare(row.row_preview_cid, member.effect_apply_key,
                                         row.row_idempotency_key))
                        for mi, member in enumerate(preview.members)
                        for ri, row in enumerate(member.changes)]
            ctx.ledger.effect_begin(marque.marque_id, nonce, preview.effect_preview_cid,
                                      authorization(marque), reserved, ctx.clock())
            rows = ctx.ledger.effect_rows(marque.marque_id, nonce)
            effect_run.start(ctx, marque, nonce, preview)
        else:
            # A later attempt of the nonce resumes the Run's continuation: revalidated first.
            refused = effect_run.resume(ctx, marque, nonce, preview)
            if refused is not None:
                return aborted(refused)
    except (NotApplied, TargetUnavailable) as exc:
        return aborted(exc)
    stream.emit("effect_admitted", effect_preview_cid=preview.effect_preview_cid,
                rows=len(rows), members=len(preview.members))
    unavailable = _dispatch(ctx, marque, nonce, preview, target, stream)
    return _seal(ctx, marque.marque_id, nonce, record.attempt, preview, target_attempt,
                 stream, unavailable,
                 attempts_left=record.attempt < marque.budget.attempts_per_nonce)


def _dispatch(ctx: PilotContext, marque: Marque, nonce: str, preview: EffectPreview,
              target: RowTarget, stream: AttemptStream) -> TargetUnavailable | None:
    """Dispatch rows one at a time as :func:`plan_set` says; the target's refusal (nothing
    sent) if it stopped dispatch early."""
    fence = f"{ctx.processes.process_id}/{uuid.uuid4().hex}"
    while True:
        grouped = _by_member(preview, ctx.ledger.effect_rows(marque.marque_id, nonce))
        plan = plan_set([(member.failure_policy, [r.record for r in rows])
                         for member, rows in zip(preview.members, grouped, strict=True)])
        if plan.next is None:
            return None
        mi, ri = plan.next
        member, row = preview.members[mi], preview.members[mi].changes[ri]
        stored = grouped[mi][ri].record
        dispatching = advance(stored, D.DISPATCHING, fence=fence)
        if not ctx.ledger.effect_move(marque.marque_id, nonce, stored, dispatching,
                                        now=ctx.clock()):
            return None  # another owner took this execution over: it is theirs now
        base = {"effect_id": member.effect_id, "index": ri,
                "row_preview_cid": row.row_preview_cid}
        stream.emit("row_dispatching", **base, dispatch_attempt=dispatching.attempt)
        write = _write(ctx, marque.marque_id, nonce, member, row, dispatching,
                       float(marque.expires_at), ctx.target_ids.get(marque.target))
        try:
            answer = target.apply_row(write)
            crash_point("after_commit")
            outcome = _applied(member, answer.rows_affected, answer.action)
        except RowStampConflict:
            stream.emit("row_stamp_conflict", **base)
            outcome = _evidence_outcome(member, row, target.reconcile_row(write), "conflict")
        except TargetUnavailable as exc:  # refused before anything of the row was sent
            back = advance(dispatching, D.PREPARED, fence=fence)
            ctx.ledger.effect_move(marque.marque_id, nonce, dispatching, back,
                                     now=ctx.clock())
            stream.emit("row_not_sent", **base, error=exc.to_dict())
            return exc
        except NotApplied as exc:
            outcome = _outcome_of(exc)
        except Indeterminate as exc:
            outcome = {"state": "unknown", "reason": exc.message,
                       "idempotency_key": row.row_idempotency_key}
        except Exception as exc:  # a fault of ours mid-row: whether it committed is unknown
            outcome = {"state": "unknown",
                       "reason": f"the Pilot failed while the row's transaction was open "
                                 f"({' '.join(str(exc).split()) or type(exc).__name__})",
                       "idempotency_key": row.row_idempotency_key}
        settled = _settle_row(ctx, marque.marque_id, nonce, preview, member, row, dispatching,
                              outcome, fence)
        if settled is None:
            return None
        extra = {k: v for k, v in outcome.items() if k not in ("state", "idempotency_key")}
        stream.emit(_ROW_EVENT[outcome["state"]], **base, **extra)


def _records(preview: EffectPreview, rows: list[DispatchRow]) -> list[list[DispatchRecord]]:
    return [[r.record for r in member_rows] for member_rows in _by_member(preview, rows)]


def _member_receipts(preview: EffectPreview,
                     rows: list[DispatchRow]) -> list[MemberReceipt]:
    return [member_receipt(preview, member.effect_id,
                           [entry_from_ledger(r.record, r.outcome_receipt) for r in member_rows])
            for member, member_rows in zip(preview.members, _by_member(preview, rows),
                                           strict=True)]


def _store_receipts(ctx: PilotContext, marque_id: str, nonce: str, attempt: int,
                    members: list[MemberReceipt], sealed: SetReceipt) -> None:
    now = ctx.clock()
    for receipt in members:
        ctx.ledger.effect_put_receipt(marque_id, nonce, "member",
                                        f"{attempt}/{receipt.effect_id}", receipt.to_json(), now)
    ctx.ledger.effect_put_receipt(marque_id, nonce, "set", str(attempt), sealed.to_json(), now)
    if ctx.logbook is not None:
        entries = [("effects.member_receipt", f"effects/receipt/{r.receipt_cid}",
                    {"marque_id": marque_id, "nonce": nonce, "attempt": attempt,
                     "receipt": r.to_json()}) for r in members]
        entries.append(("effects.set_receipt", f"effects/receipt/{sealed.receipt_cid}",
                        {"marque_id": marque_id, "nonce": nonce, "attempt": attempt,
                         "receipt": sealed.to_json()}))
        ctx.logbook.append_all(entries)


def _summary(preview: EffectPreview, sealed: SetReceipt, states: list[str],
             rows: list[DispatchRow], run: RunRecord | None) -> dict[str, Any]:
    """The attempt's ``result``: the set receipt (whole: it is what the Harbourmaster keeps
    with the request, through the outbox report), the Run outcome, every row's latest
    state by member (``row_states``, in preview order), and the Run's ``actql-run-state/0.1``
    projection as it stood when the outcome was recorded (``run_state``)."""
    by_member: dict[str, list[str]] = {}
    position = 0
    for member in preview.members:
        by_member[member.effect_id] = states[position:position + member.item_count]
        position += member.item_count
    return {"effect_set": {
        "effect_preview_cid": preview.effect_preview_cid,
        "set_receipt_cid": sealed.receipt_cid, "status": sealed.status,
        "set_receipt": sealed.to_json(), "row_states": by_member,
        "run_outcome": run_outcome(states), "rows": dict(sorted(Counter(states).items())),
        "run_state": None if run is None else project(run),
        "failed_rows": failed_rows(preview.members, rows),
        "rows_affected": sum((r.outcome or {}).get("rows_affected", 0) for r in rows
                             if (r.outcome or {}).get("state") == "applied")}}


def _status_of(states: list[str], rows: list[DispatchRow],
               unavailable: MarqueError | None) -> tuple[Status, dict[str, Any] | None]:
    if "unknown" in states:
        return Status.INDETERMINATE, {
            "code": "commit_unknown", "sqlstate": None,
            "message": f"{states.count('unknown')} row(s) of the Effect Set may or may not have "
                       "committed; each is reconciled from its row stamp, never resent"}
    if "applied" in states or "accepted" in states:
        return Status.APPLIED, None
    if unavailable is not None:
        return Status.ABORTED_NOT_APPLIED, unavailable.to_dict()
    for row in rows:
        if (row.outcome or {}).get("state") == "failed":
            error = row.outcome["error"]  # type: ignore[index]
            return Status.ABORTED_NOT_APPLIED, {**error, "sqlstate": None}
    return Status.ABORTED_NOT_APPLIED, {"code": "statement_error", "sqlstate": None,
                                        "message": "no row of the Effect Set was applied"}


def _seal(ctx: PilotContext, marque_id: str, nonce: str, attempt: int, preview: EffectPreview,
          target_attempt: TargetAttempt, stream: AttemptStream,
          unavailable: TargetUnavailable | None, *, attempts_left: bool) -> Observation:
    rows = ctx.ledger.effect_rows(marque_id, nonce)
    members = _member_receipts(preview, rows)
    run = ctx.ledger.effect_run(marque_id, nonce)
    assert run is not None
    sealed = set_receipt(preview, members, run["authorization"])
    _store_receipts(ctx, marque_id, nonce, attempt, members, sealed)
    states = [state for receipt in members for state in receipt.states]
    stream.emit("receipts_sealed", set_receipt_cid=sealed.receipt_cid, status=sealed.status)
    status, error = _status_of(states, rows, unavailable)
    ended = effect_run.end_attempt(ctx, marque_id, nonce, preview, states, status,
                                   _records(preview, rows), sealed.receipt_cid,
                                   attempts_left=attempts_left)
    summary = _summary(preview, sealed, states, rows, ended)
    return Observation(target_attempt, status,
                       rows_affected=summary["effect_set"]["rows_affected"], result=summary,
                       error=error)


# -- reconciliation ------------------------------------------------------------------------


def _latest_set(ctx: PilotContext, marque_id: str, nonce: str, preview: EffectPreview,
                attempt: int) -> tuple[SetReceipt, list[MemberReceipt]] | None:
    """The set and member receipts an attempt sealed, as stored (immutable), or None."""
    held = ctx.ledger.effect_receipts(marque_id, nonce)
    sets = [r["body"] for r in held if r["kind"] == "set" and r["subject"] == str(attempt)]
    if not sets:
        return None
    members = []
    for member in preview.members:
        found = [r["body"] for r in held if r["kind"] == "member"
                 and r["subject"] == f"{attempt}/{member.effect_id}"]
        members.append(MemberReceipt(freeze(found[-1])))
    states = [state for receipt in members for state in receipt.states]
    return SetReceipt(freeze(sets[-1]), run_outcome(states)), members


def reconcile_effects(ctx: PilotContext, record: AttemptRecord, cause: str) -> AttemptRecord:
    """Settle an Effect Set attempt by its row stamps (observe, never resend); the attempt as
    it stands afterwards. The caller has established that its owner cannot finish it."""
    run = ctx.ledger.effect_run(record.marque_id, record.nonce)
    budget = ctx.ledger.budget(record.marque_id)
    assert run is not None
    preview = _stored_preview(ctx, run["effect_preview_cid"])
    target = _reconcilable_target(ctx, record, budget)
    now = ctx.clock()
    _dispatching_to_unknown(ctx, record, preview, cause)
    sealed, members = _sealed_receipts(ctx, record, preview, run["authorization"])
    mid, nonce = record.marque_id, record.nonce
    chains = _chains(ctx, mid, nonce, preview, sealed, members)
    rows = {r.record.row_preview_cid: r for r in ctx.ledger.effect_rows(mid, nonce)}
    target_id = ctx.target_id_for(budget["target"], mid, nonce) if budget else None
    for row_cid, chain in chains.items():
        if chain.closed or target is None:
            continue
        write = _write(ctx, mid, nonce, preview.members[rows[row_cid].member_index],
                       _change_of(preview, rows[row_cid]), rows[row_cid].record,
                       budget["expires_at"] if budget else None, target_id)
        chains[row_cid] = _reconcile_row(ctx, record, preview, chain, rows[row_cid],
                                         target.reconcile_row(write), cause, now)
    return _settle_by_rows(ctx, record, preview, sealed, effective_states(members, chains),
                           attempts_left=budget is None
                           or record.attempt < budget["attempts_per_nonce"])


def _change_of(preview: EffectPreview, row: DispatchRow) -> RowPreview:
    return preview.members[row.member_index].changes[row.row_index]


def _reconcilable_target(ctx: PilotContext, record: AttemptRecord,
                         budget: dict[str, Any] | None) -> RowTarget | None:
    """The target a tombstone may be written in for this attempt's rows, or None: not
    served here, or its name points at another database than the rows were sent to."""
    if budget is None or budget["target"] not in ctx.targets:
        return None
    target = _row_target(ctx, budget["target"])
    if not effect_run.environment_holds(ctx, record.marque_id, record.nonce, budget["target"]):
        # A tombstone there proves nothing about the rows, so none is written (choice 45).
        return None
    return target


def _dispatching_to_unknown(ctx: PilotContext, record: AttemptRecord, preview: EffectPreview,
                            cause: str) -> None:
    """A row its owner left dispatching may have been sent: it is unknown now (a takeover,
    presenting the recorded fence; the compare-and-set refuses it if the owner moved it)."""
    for row in ctx.ledger.effect_rows(record.marque_id, record.nonce):
        if row.record.state is D.DISPATCHING:
            member = preview.members[row.member_index]
            change = member.changes[row.row_index]
            _settle_row(ctx, record.marque_id, record.nonce, preview, member, change,
                        row.record, {"state": "unknown", "reason": cause,
                                     "idempotency_key": change.row_idempotency_key},
                        row.record.fence)


def _sealed_receipts(ctx: PilotContext, record: AttemptRecord, preview: EffectPreview,
                     authorization: dict[str, Any]) -> tuple[SetReceipt, list[MemberReceipt]]:
    """The receipts the attempt sealed; sealed now from what the ledger holds if its owner
    died before sealing them."""
    mid, nonce = record.marque_id, record.nonce
    found = _latest_set(ctx, mid, nonce, preview, record.attempt)
    if found is not None:
        return found
    members = _member_receipts(preview, ctx.ledger.effect_rows(mid, nonce))
    sealed = set_receipt(preview, members, authorization)
    _store_receipts(ctx, mid, nonce, record.attempt, members, sealed)
    return sealed, members


def _reconcile_row(ctx: PilotContext, record: AttemptRecord, preview: EffectPreview,
                   chain: ReconciliationChain, row: DispatchRow, evidence: RowEvidence,
                   cause: str, now: float) -> ReconciliationChain:
    """One unknown row settled by its row stamp's evidence: the next receipt of its chain
    stored (and logged), the row moved when the evidence is conclusive; the chain after."""
    crash_point("after_reconcile_evidence")
    mid, nonce = record.marque_id, record.nonce
    member = preview.members[row.member_index]
    change = _change_of(preview, row)
    outcome = _evidence_outcome(member, change, evidence, cause)
    outcome_receipt = None
    if outcome["state"] != "unknown":
        assert row.record.dispatch_entry_cid is not None
        outcome_receipt = thaw(row_outcome_receipt(
            preview, member, change, dispatch_entry_cid=row.record.dispatch_entry_cid,
            attempt=row.record.attempt, outcome=outcome))
    receipt = chain.next_receipt(outcome, outcome_receipt_cid=(
        outcome_receipt["receipt_cid"] if outcome_receipt else None))
    accepted, _ = chain.accept(receipt)
    ctx.ledger.effect_put_receipt(mid, nonce, "reconciliation",
                                  f"{row.record.row_preview_cid}/{receipt['attempt_sequence']}",
                                  receipt, now)
    if outcome["state"] != "unknown" and row.record.state is D.UNKNOWN:
        after = advance(row.record, D(outcome["state"]))
        ctx.ledger.effect_move(mid, nonce, row.record, after, now=now, outcome=outcome,
                               outcome_receipt=outcome_receipt)
    if ctx.logbook is not None:
        ctx.logbook.append(
            "effects.reconciliation",
            f"effects/receipt/{receipt['reconciliation_receipt_cid']}",
            {"marque_id": mid, "nonce": nonce, "attempt": record.attempt, "cause": cause,
             "evidence": {"status": evidence.status.value, "reason": evidence.reason,
                          "stamp": evidence.stamp}, "receipt": receipt})
    return accepted


def _settle_by_rows(ctx: PilotContext, record: AttemptRecord, preview: EffectPreview,
                    sealed: SetReceipt, states: list[str], *,
                    attempts_left: bool) -> AttemptRecord:
    """The attempt (and its Run) moved to where its rows' states leave it."""
    mid, nonce = record.marque_id, record.nonce
    all_rows = ctx.ledger.effect_rows(mid, nonce)
    status, error = _status_of(states, all_rows, None)
    ended = effect_run.end_attempt(ctx, mid, nonce, preview, states, status,
                                   _records(preview, all_rows), sealed.receipt_cid,
                                   attempts_left=attempts_left)
    summary = _summary(preview, sealed, states, all_rows, ended)
    if status is Status.INDETERMINATE:
        # Still unknown (no tombstone could be written): the sealed unknown_outcome receipt
        # and the rows' states go with the attempt's report now, not only once it settles
        # (docs/effects.md, choice 43).
        ctx.ledger.effect_attach_summary(mid, nonce, record.attempt, summary, ctx.clock())
        return record
    return ctx.ledger.observe(
        mid, nonce, record.attempt, status, now=ctx.clock(), cause="reconciliation",
        rows_affected=summary["effect_set"]["rows_affected"], error=error, result=summary)


def _chains(ctx: PilotContext, marque_id: str, nonce: str, preview: EffectPreview,
            sealed: SetReceipt, members: list[MemberReceipt]) -> dict[str, ReconciliationChain]:
    """Every unknown row's reconciliation chain, with the receipts the ledger holds."""
    held = sorted((r["body"] for r in ctx.ledger.effect_receipts(marque_id, nonce)
                   if r["kind"] == "reconciliation"), key=lambda b: b["attempt_sequence"])
    chains: dict[str, ReconciliationChain] = {}
    for member in members:
        for entry in member.body["rows"]:
            if entry["state"] != "unknown":
                continue
            chain = ReconciliationChain.open(preview, sealed, member, entry["row_preview_cid"])
            for body in held:
                if body["row_preview_cid"] == entry["row_preview_cid"]:
                    chain, _ = chain.accept(body)
            chains[entry["row_preview_cid"]] = chain
    return chains


def execution_receipts(ctx: PilotContext, marque_id: str, nonce: str) -> dict[str, Any]:
    """Everything the ledger holds of one Effect Set execution: its preview CID, every row's
    dispatch record and outcome, and every receipt (``marque effects receipt``)."""
    run = ctx.ledger.effect_run(marque_id, nonce)
    if run is None:
        from marque.errors import NotFound

        raise NotFound(f"this Pilot's ledger holds no Effect Set execution for nonce {nonce} "
                       f"of marque {marque_id}")
    receipts = ctx.ledger.effect_receipts(marque_id, nonce)
    sets = [r for r in receipts if r["kind"] == "set"]
    return {
        "marque_id": marque_id, "nonce": nonce,
        "effect_preview_cid": run["effect_preview_cid"],
        "authorization": run["authorization"],
        "run": effect_run.projection(ctx, marque_id, nonce),
        "set_receipt": sets[-1]["body"] if sets else None,
        # Receipts are sealed per attempt; a later attempt refused before dispatch (a failed
        # resume revalidation) seals none, so the latest receipt may be an earlier one's.
        "set_receipt_attempt": int(sets[-1]["subject"]) if sets else None,
        "member_receipts": [r["body"] for r in receipts if r["kind"] == "member"],
        "reconciliation_receipts": [r["body"] for r in receipts
                                    if r["kind"] == "reconciliation"],
        "rows": [{"member_index": r.member_index, "row_index": r.row_index,
                  **r.record.to_json(), "outcome": r.outcome}
                 for r in ctx.ledger.effect_rows(marque_id, nonce)],
    }
