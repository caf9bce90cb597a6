"""A per-row undo: the undo of a request as an Effect Set, one fenced member per row.

The all-or-nothing undo (:mod:`marque.harbour.undo`) is one statement request
that the Pilot rolls back whole when any row changed since. A per-row undo
(``marque undo --per-row``, ``POST /v1/requests/{id}/undo {"per_row": true}``)
is an **Effect Set** request with ``rolls_back`` set: each row the original's
preview imaged is one member with one row, fenced (:mod:`marque.effects.fence`)
on the whole row the original execution wrote —

* an updated row: an ``update`` member giving the changed columns their
  before-values, fenced on the row's after-image;
* a deleted row: a ``create`` member (keyed) inserting its before-image again,
  fenced on its key still being free (``absent``);
* an inserted row: a ``delete`` member, fenced on its after-image;

— each with ``failure_policy: continue``, so a row that changed since fails
alone (its outcome ``failed``, ``undo_conflict``, in its member's receipt) and
every other row is put back. It is previewed, approved and executed like any
Effect Set (docs/effects.md), and has the same request id as the
all-or-nothing undo, ``undo-<original id>`` (see :func:`row_undo_submission`).

A per-row undo carries the values an Effect Set input can (strings, integers,
booleans, NULL), at most :data:`MAX_ROWS` rows, each row once; anything else is
``undo_unavailable`` (the all-or-nothing undo may still be possible).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marque.effects.cids import INPUT_VERSION
from marque.effects.declare import DECLARATION_VERSION, MAX_MEMBERS
from marque.effects.fence import holds
from marque.effects.request import EffectSetSubmission
from marque.errors import MarqueError, UndoConflict, UndoUnavailable
from marque.harbour.effect_requests import is_effect_set

if TYPE_CHECKING:
    from marque.target.compensation import Compensation, UndoRow

__all__ = ["MAX_ROWS", "row_undo_change", "row_view"]

#: The most rows a per-row undo puts back: an Effect Set has at most this many members.
MAX_ROWS = MAX_MEMBERS

#: The Effect Set member kind that undoes each kind of row.
_KIND = {"restore": "update", "reinsert": "create", "remove": "delete"}


def _refuse(message: str, **detail: Any) -> UndoUnavailable:
    return UndoUnavailable(f"no per-row undo: {message}; the all-or-nothing undo (without "
                           "--per-row) may still be possible", detail=detail)


def effect_id(index: int, row: UndoRow) -> str:
    """The member of the ``index``-th undo row: ``restore_0``, ``reinsert_1``, …"""
    return f"{row.op}_{index}"


def _plain(values: dict[str, Any], row: UndoRow) -> dict[str, Any]:
    for column, value in values.items():
        if not (value is None or isinstance(value, str | int | bool)):
            raise _refuse(f"{row.table} row {row.key} holds a value in column {column} that an "
                          "Effect Set input cannot carry (only strings, integers, booleans "
                          "and NULL)", table=row.table, key=row.key, column=column)
    return values


def _member(index: int, row: UndoRow) -> tuple[dict[str, Any], dict[str, Any]]:
    """One undo row's member declaration and its input relation."""
    fence: dict[str, Any]
    if row.op == "reinsert":
        values, fence = dict(row.restores or {}), {"state": "absent"}
    elif row.op == "restore":
        values = {**row.key, **(row.restores or {})}
        fence = {"state": "present", "value": _plain(dict(row.fenced_on or {}), row)}
    else:
        values = dict(row.key)
        fence = {"state": "present", "value": _plain(dict(row.fenced_on or {}), row)}
    declared = {"effect_id": effect_id(index, row), "kind": _KIND[row.op],
                "table": row.table, "key": sorted(row.key), "failure_policy": "continue",
                "max_items": 1, "fence": fence}
    relation = {"version": INPUT_VERSION, "columns": sorted(values),
                "rows": [_plain(values, row)]}
    return declared, relation


def row_undo_change(undo: Compensation) -> dict[str, Any]:
    """The ``change`` of a per-row undo of ``undo``'s rows: ``{effect_set: {declaration,
    inputs}}``, checked as the Harbourmaster's intake checks it (``undo_unavailable`` when
    an Effect Set cannot carry it)."""
    rows = list(undo.rows)
    if len(rows) > MAX_ROWS:
        raise _refuse(f"it would put back {len(rows)} rows, and an Effect Set has at most "
                      f"{MAX_ROWS} members", rows=len(rows))
    seen: set[tuple[str, str]] = set()
    for row in rows:
        slot = (row.table, repr(sorted(row.key.items())))
        if slot in seen:
            raise _refuse(f"{row.table} row {row.key} was changed by more than one statement, "
                          "and a per-row undo puts each row back once", table=row.table,
                          key=row.key)
        seen.add(slot)
    members, inputs = [], {}
    for index, row in enumerate(rows):
        declared, relation = _member(index, row)
        members.append(declared)
        inputs[declared["effect_id"]] = relation
    body = {"declaration": {"version": DECLARATION_VERSION, "members": members},
            "inputs": inputs}
    try:
        submission = EffectSetSubmission.from_json(body, UndoUnavailable)
    except MarqueError as exc:
        raise _refuse(exc.message, **exc.json_detail()) from None
    return {"effect_set": submission.to_json()}


def is_row_undo_of(request_change: Any, undo: Compensation) -> bool:
    """Whether ``request_change`` (a stored request's change) is exactly the per-row undo
    of ``undo``'s rows."""
    if not is_effect_set(request_change):
        return False
    try:
        expected = row_undo_change(undo)
    except MarqueError:
        return False
    return bool(request_change.get("effect_set") == expected["effect_set"])


def _preview_conflicts(preview: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose read at the undo's preview did not hold their fence."""
    members = {m.get("effect_id"): m for m in (preview or {}).get("members") or []
               if isinstance(m, dict)}
    found = []
    for row in rows:
        member = members.get(row["effect_id"]) or {}
        fence, changes = member.get("fence"), member.get("changes") or []
        if isinstance(fence, dict) and changes and not holds(changes[0].get("before") or {},
                                                             fence):
            found.append(row)
    return found


def row_view(undo: Compensation, request_preview: Any,
             receipt: dict[str, Any] | None) -> dict[str, Any]:
    """The per-row undo's ``undo`` object: ``{mode: "per_row", rows, conflicts}`` — each row
    with its member's ``effect_id``; the conflicts those the receipt failed as
    ``undo_conflict`` once executed, before that those whose preview read did not hold
    their fence."""
    rows = [{**row.to_dict(), "effect_id": effect_id(i, row)}
            for i, row in enumerate(undo.rows)]
    failed = (receipt or {}).get("failed_rows")
    if isinstance(failed, list):
        codes = {f.get("effect_id"): f.get("code") for f in failed if isinstance(f, dict)}
        conflicts = [r for r in rows if codes.get(r["effect_id"]) == UndoConflict.code]
    else:
        conflicts = _preview_conflicts(request_preview, rows)
    shown = ("statement", "table", "key", "op", "effect_id")
    return {"mode": "per_row", "rows": rows,
            "conflicts": [{k: r[k] for k in shown} for r in conflicts]}
