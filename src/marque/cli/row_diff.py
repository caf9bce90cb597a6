"""How ``marque requests show`` prints a preview's row images: key, column, before, after.

A compact table per statement — one line per changed cell of an updated row,
one per column of an inserted or deleted row, each marked — and, past the
Pilot's cap, the plain words "showing N of K rows". A statement whose rows
could not be imaged says why. ``--json`` prints the object itself.
"""

from __future__ import annotations

from typing import Any

from marque.cli.common import one_line, out
from marque.target.image_values import display

__all__ = ["print_row_images", "print_undo", "cell"]

_OP_MARK = {"update": "~", "insert": "+", "delete": "-"}


def cell(value: Any) -> str:
    """One value as the table shows it: JSON, compact, so text and numbers and null stay
    apart; bytes as ``bytes:<base64>`` (:func:`marque.target.image_values.display`)."""
    return display(value)


#: Said after a key the schema does not make: the Pilot's operator declared it.
_DECLARED = " (declared in the Pilot's pilot.json, not the table's own key)"


def _key_text(key: Any) -> str:
    if isinstance(key, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in key.items())
    return cell(key)


def print_row_images(images: Any, indent: str = "      ") -> None:
    """Print one statement's ``row_images`` (nothing for a statement that writes no rows)."""
    if not isinstance(images, dict):
        return
    if images.get("status") != "captured":
        out.say(f"{indent}rows not shown: {one_line(images.get('reason'))}")
        return
    rows = images.get("rows") or []
    total = images.get("total")
    if images.get("truncated"):
        out.say(f"{indent}showing {len(rows):,} of {total:,} rows of "
                f"{one_line(images.get('table'))} (the rest are counted, not shown)")
    else:
        out.say(f"{indent}{total} row(s) of {one_line(images.get('table'))}, by key "
                f"{one_line(', '.join(images.get('key') or []))}"
                f"{_DECLARED if images.get('key_source') == 'declared' else ''}:")
    out.say(f"{indent}  op key | column | before → after")
    for row in rows:
        op = row.get("op")
        before, after = row.get("before") or {}, row.get("after") or {}
        columns = (row.get("changed") or []) if op == "update" else sorted(before or after)
        mark = _OP_MARK.get(str(op), "?")
        key = _key_text(row.get("key"))
        if op == "update" and not columns:
            out.say(f"{indent}  {mark} {one_line(key)} | (no column changes)")
        for column in columns:
            old = "·" if op == "insert" else cell(before.get(column))
            new = "·" if op == "delete" else cell(after.get(column))
            out.say(f"{indent}  {mark} {one_line(key)} | {one_line(column)} | "
                    f"{one_line(old)} → {one_line(new)}")


_UNDO_OP = {"restore": "restores", "reinsert": "inserts again", "remove": "deletes"}


def print_undo(undo: Any, indent: str = "  ") -> None:
    """Print a request's ``undo``: each row it puts back against the original's images,
    and the rows in conflict (changed since the original execution), by key."""
    if not isinstance(undo, dict):
        return
    rows = undo.get("rows") or []
    per_row = undo.get("mode") == "per_row"
    out.say(f"{indent}undo of {one_line(undo.get('of'))}: {len(rows)} row(s), each fenced on "
            "what the original wrote" + (", row by row" if per_row else ""))
    for row in rows:
        key = one_line(_key_text(row.get("key")))
        what = _UNDO_OP.get(str(row.get("op")), str(row.get("op")))
        fenced, restores = row.get("fenced_on") or {}, row.get("restores") or {}
        table = one_line(row.get("table"))
        if row.get("op") == "restore":
            for column in sorted(restores):
                out.say(f"{indent}  ~ {table} {key} | {one_line(column)} | "
                        f"{one_line(cell(fenced.get(column)))} → "
                        f"{one_line(cell(restores[column]))}")
        else:
            out.say(f"{indent}  {'+' if row.get('op') == 'reinsert' else '-'} {table} {key}: "
                    f"{what} the row")
    for conflict in undo.get("conflicts") or []:
        out.say(f"{indent}  [red]undo_conflict[/] {one_line(conflict.get('table'))} "
                f"{one_line(_key_text(conflict.get('key')))}: changed since the original "
                "execution; " + ("this row is not put back, the others are" if per_row
                                 else "nothing of the undo was applied"))
