"""``marque undo``: a request's compensation, derived from the rows its preview sealed.

The undo of a verified statement request is a *new* request with
``rolls_back`` naming it (DESIGN §11.2): its statements are derived from the
original's sealed row images (:func:`marque.target.compensation.compensate`),
fenced on the after-values, each expecting exactly one row. It is routed,
previewed and approved like any other request, and carries its original with
it (``rolling_back`` → ``rolled_back`` / ``rollback_failed``).

A row changed since the original execution is an ``undo_conflict``, named by
its key, wherever it is seen:

* at the undo's preview (a fenced statement touches no row in the rolled-back
  run): the undo request ends ``failed`` and nothing is sealed;
* at the re-preview when its approvals complete: it ends ``failed``, no marque;
* at execution: the Pilot rolls the whole attempt back (``expect_rows``), and the
  request ends ``failed`` — nothing of the undo is half-applied. The report's
  error names the statement in ``detail.statement`` (:func:`conflict_statement`).

A per-row undo (``per_row``) is an Effect Set instead, each row fenced and
applied on its own (:mod:`marque.harbour.row_undo`).

The undo's caller request id is ``undo-<original id>`` unless one is given, in
both modes, so asking twice answers the same undo while it is active, and the
other mode is refused while one is (:func:`undo_taken`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from marque.change import Change
from marque.errors import MarqueError, UndoConflict, UndoUnavailable
from marque.harbour.effect_requests import is_effect_set
from marque.harbour.lifecycle import IntentConflict
from marque.harbour.row_undo import is_row_undo_of, row_undo_change, row_view
from marque.target.compensation import Compensation, compensate

if TYPE_CHECKING:
    from marque.harbour.store.base import HarbourStore, PilotRecord, StoredRequest

__all__ = ["UNDO_REQUEST_PREFIX", "UNDOABLE", "UndoReads", "undo_submission", "fence_conflicts",
           "refuse_fences", "derived_undo", "named_conflict", "undo_view", "why_no_undo",
           "conflict_statement"]

class UndoReads(Protocol):
    """What deriving an undo reads: the request it rolls back and that request's Pilot
    (a :class:`HarbourStore` has both; a page of request objects answers them from what
    it has read already)."""

    def get_request(self, id: str) -> StoredRequest: ...

    def get_pilot(self, pilot_id: str) -> PilotRecord: ...


#: The states of a request that may be undone (the store's own check is the rule).
UNDOABLE = frozenset({"verified", "rollback_failed"})

#: The caller request id an undo takes by default: this prefix and the original's id.
UNDO_REQUEST_PREFIX = "undo-"
#: The statement a Pilot older than the report's ``error.detail`` named only in its
#: ``undo_conflict`` message (marque.target.base): read for those reports alone.
_LEGACY_STATEMENT = re.compile(r"^statement (\d+) touched")


#: Undos derived lately, by the original preview's CID and the dialect: writing a 100-row
#: undo's SQL takes about 0.1 s, and every view of an undo request checks it again.
_DERIVED: OrderedDict[tuple[str, str], Compensation] = OrderedDict()
_DERIVED_KEPT = 128
_DERIVED_LOCK = threading.Lock()


def _derived(preview: Any, dialect: str) -> Compensation:
    """:func:`compensate`, kept by ``preview_cid`` — a content id the Harbourmaster checked
    against the preview's content when it took it, so one CID is one undo."""
    key = preview.get("preview_cid") if isinstance(preview, dict) else None
    if not isinstance(key, str):
        return compensate(preview, dialect)
    with _DERIVED_LOCK:
        found = _DERIVED.get((key, dialect))
        if found is not None:
            _DERIVED.move_to_end((key, dialect))
            return found
    made = compensate(preview, dialect)
    with _DERIVED_LOCK:
        _DERIVED[(key, dialect)] = made
        while len(_DERIVED) > _DERIVED_KEPT:
            _DERIVED.popitem(last=False)
    return made


def _compensation(original: StoredRequest, pilot: PilotRecord) -> Compensation:
    if is_effect_set(original.change):
        raise UndoUnavailable(f"request {original.id} is an Effect Set: its own receipts and "
                              "reconciliation say what each row did; it has no statement "
                              "undo", detail={"id": original.id})
    dialect = pilot.dialects.get(original.target)
    if dialect is None:
        raise UndoUnavailable(f"Pilot {pilot.pilot_id} registered target {original.target!r} "
                              "without its dialect, so no undo can be written for it",
                              detail={"id": original.id})
    try:
        return _derived(original.preview, dialect)
    except UndoUnavailable as exc:
        raise UndoUnavailable(f"request {original.id} cannot be undone: {exc.message}",
                              detail={**exc.json_detail(), "id": original.id}) from None


def why_no_undo(store: HarbourStore, request: StoredRequest) -> str | None:
    """Why ``request`` cannot be undone from its sealed images (None when it can); its
    state is not looked at (see :data:`UNDOABLE`)."""
    try:
        _compensation(request, store.get_pilot(request.pilot_id))
    except MarqueError as exc:
        return exc.message
    return None


def undo_submission(original: StoredRequest, pilot: PilotRecord, *, reason: str | None,
                    request_id: str | None, per_row: bool = False) -> dict[str, Any]:
    """The ``POST /v1/requests`` body of ``original``'s undo (``UndoUnavailable`` if none):
    all-or-nothing statements, or with ``per_row`` an Effect Set of fenced rows
    (:mod:`marque.harbour.row_undo`). Both take the same request id, ``undo-<id>``."""
    undo = _compensation(original, pilot)
    statement_timeout = (original.change or {}).get("statement_timeout_ms")
    change = row_undo_change(undo) if per_row else {
        "statements": [s.to_claim() for s in undo.statements],
        "statement_timeout_ms": statement_timeout}
    return {
        "request_id": request_id or UNDO_REQUEST_PREFIX + original.id,
        "pilot_id": original.pilot_id, "target": original.target,
        "change": change,
        # Exactly one row per statement: the fences make any other count a conflict.
        "budget": {"executions": 1, "max_rows": len(undo.statements),
                   "attempts_per_nonce": int((original.budget or {}).get(
                       "attempts_per_nonce", 3))},
        "ttl_seconds": original.ttl_seconds,
        "reason": reason or f"undo of {original.id}",
        "rolls_back": original.id,
    }


def undo_taken(exc: IntentConflict, original_id: str, per_row: bool) -> IntentConflict:
    """The refusal of an undo whose request id already holds an active undo of another
    change — the same original's undo in its other mode, most often: one undo at a time,
    so two can never both apply (the original also moves to ``rolling_back`` only once)."""
    other = "all-or-nothing" if per_row else "per-row"
    active = exc.detail.get("id")
    return IntentConflict(
        f"the undo of {original_id} is already filed as request {active} (the {other} undo, "
        "or another change under that request id); approve or reject that one — once it is "
        "terminal the undo may be asked for again, in either mode",
        detail=exc.json_detail())


def fence_conflicts(change: Change, preview: Any) -> list[int]:
    """The statements of ``change`` whose rolled-back preview touched another number of rows
    than their ``expect_rows`` (none for an explain preview, which counts nothing)."""
    if not isinstance(preview, dict) or preview.get("mode") != "rollback":
        return []
    previewed = preview.get("statements") or []
    return [index for index, (statement, seen) in enumerate(
                zip(change.statements, previewed, strict=False))
            if statement.expect_rows is not None
            and isinstance(seen, dict) and seen.get("rows") != statement.expect_rows]


def refuse_fences(change: Change, preview: Any) -> None:
    """Raise ``UndoConflict`` (detail ``statements``) if a fence of ``change`` does not hold
    in ``preview``."""
    failed = fence_conflicts(change, preview)
    if failed:
        raise UndoConflict(
            f"{len(failed)} fenced statement(s) touched no row in the preview: "
            "a row changed since the original execution wrote it",
            detail={"statements": failed})


def derived_undo(store: UndoReads, request: StoredRequest) -> Compensation | None:
    """The compensation ``request`` is, when it is exactly the derived undo of the request
    it rolls back (None for any other request, a hand-written compensation included)."""
    if request.rolls_back is None:
        return None
    if is_effect_set(request.change):
        return _derived_row_undo(store, request)
    claimed = (request.change or {}).get("statements") or []
    # Cheap first: a derived undo fences every statement to one row. Anything else is
    # not one, and is not derived again (a page of requests stays a few queries).
    if not claimed or any(s.get("expect_rows") != 1 for s in claimed if isinstance(s, dict)):
        return None
    try:
        original = store.get_request(request.rolls_back)
        undo = _compensation(original, store.get_pilot(original.pilot_id))
        statements = [s.to_claim() for s in undo.statements]
    except MarqueError:
        return None
    if (request.change or {}).get("statements") != statements:
        return None
    return undo


def _derived_row_undo(store: UndoReads, request: StoredRequest) -> Compensation | None:
    """The compensation a per-row undo request is made of (None if it is not one)."""
    assert request.rolls_back is not None
    try:
        original = store.get_request(request.rolls_back)
        undo = _compensation(original, store.get_pilot(original.pilot_id))
    except MarqueError:
        return None
    return undo if is_row_undo_of(request.change, undo) else None


def _keys(undo: Compensation, indexes: list[int]) -> list[dict[str, Any]]:
    return [{"statement": i, "table": undo.rows[i].table, "key": undo.rows[i].key,
             "op": undo.rows[i].op} for i in indexes if 0 <= i < len(undo.rows)]


def named_conflict(store: UndoReads, request: StoredRequest,
                   exc: UndoConflict) -> tuple[str, list[dict[str, Any]]]:
    """An ``undo_conflict`` message naming each conflicting row by key, and the rows."""
    undo = derived_undo(store, request)
    indexes = [int(i) for i in exc.detail.get("statements") or []]
    if undo is None:
        return exc.message, []
    rows = _keys(undo, indexes)
    named = "; ".join(f"{r['table']} {_key_text(r['key'])}" for r in rows)
    return (f"undo of {request.rolls_back} conflicts: {len(rows)} row(s) changed since the "
            f"original execution wrote them ({named}); nothing was applied", rows)


def _key_text(key: dict[str, Any]) -> str:
    """``id=2, sym=X``: each key value as it reads, not as Python would quote it."""
    return ", ".join(f"{k}={_plain(v)}" for k, v in key.items())


def _plain(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def conflict_statement(error: Any) -> int | None:
    """The fenced statement an execution report's ``undo_conflict`` error names: its
    ``error.detail.statement`` (reports since the field), else — for a report of a Pilot
    older than it — the index its message starts with. None for any other error."""
    if not isinstance(error, dict) or error.get("code") != UndoConflict.code:
        return None
    detail = error.get("detail")
    if isinstance(detail, dict):
        statement = detail.get("statement")
        ok = isinstance(statement, int) and not isinstance(statement, bool)
        return statement if ok else None
    match = _LEGACY_STATEMENT.match(str(error.get("message") or ""))
    return int(match.group(1)) if match else None


def undo_view(store: UndoReads, request: StoredRequest, executions: list[dict[str, Any]],
              receipt: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The request object's ``undo``: for a derived undo, ``{of, mode, rows, conflicts}`` —
    each row put back (its key, what it restores, the after-image it is fenced on) and the
    rows found in conflict (at its preview, its approval or its execution; for a per-row
    undo, its receipt's rows failed as ``undo_conflict``). None otherwise."""
    undo = derived_undo(store, request)
    if undo is None:
        return None
    if is_effect_set(request.change):
        return {"of": request.rolls_back, **row_view(undo, request.preview, receipt)}
    conflicts = list((request.failure or {}).get("conflicts") or [])
    if not conflicts:
        found: list[int] = []
        for row in executions:
            statement = conflict_statement(row.get("error"))
            if statement is not None:
                found.append(statement)
        conflicts = _keys(undo, sorted(set(found)))
    return {"of": request.rolls_back, "mode": "all_or_nothing",
            "rows": [r.to_dict() for r in undo.rows], "conflicts": conflicts}
