"""The per-row undo's Effect Set, derived from an undo's rows: what it is, what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from marque.change import Statement
from marque.errors import UndoUnavailable
from marque.harbour.row_undo import MAX_ROWS, is_row_undo_of, row_undo_change
from marque.harbour.undo import _key_text
from marque.target.compensation import Compensation, UndoRow


def _undo(*rows: UndoRow) -> Compensation:
    return Compensation(tuple(Statement("SELECT 1", (), expect_rows=1) for _ in rows), rows)


def _restore(key: int, **after: Any) -> UndoRow:
    return UndoRow(0, "accounts", {"id": key}, "restore", {"balance": 100},
                   {"id": key, "balance": 0, **after})


def test_each_row_is_one_fenced_member() -> None:
    """restore → update, reinsert → create (fenced absent), remove → delete; each member
    one row, failure_policy continue, fenced on the after-image."""
    undo = _undo(_restore(1), UndoRow(0, "accounts", {"id": 2}, "reinsert",
                                      {"id": 2, "balance": 5}, None),
                 UndoRow(0, "accounts", {"id": 3}, "remove", None, {"id": 3, "balance": 9}))
    change = row_undo_change(undo)
    members = change["effect_set"]["declaration"]["members"]
    assert [(m["effect_id"], m["kind"], m["fence"]["state"]) for m in members] == [
        ("restore_0", "update", "present"), ("reinsert_1", "create", "absent"),
        ("remove_2", "delete", "present")]
    assert all(m["max_items"] == 1 and m["failure_policy"] == "continue" for m in members)
    assert members[0]["fence"]["value"] == {"id": 1, "balance": 0}
    assert change["effect_set"]["inputs"]["restore_0"]["rows"] == [{"id": 1, "balance": 100}]
    assert is_row_undo_of(change, undo)
    assert not is_row_undo_of(change, _undo(_restore(1)))


@pytest.mark.parametrize(("rows", "words"), [
    ((_restore(1, rate=0.5),), "cannot carry"),
    ((_restore(1), _restore(1)), "more than one statement"),
    (tuple(_restore(i) for i in range(MAX_ROWS + 1)), f"at most {MAX_ROWS}"),
])
def test_what_a_per_row_undo_cannot_carry_is_said(rows: tuple[UndoRow, ...],
                                                  words: str) -> None:
    with pytest.raises(UndoUnavailable) as caught:
        row_undo_change(_undo(*rows))
    assert words in caught.value.message and "all-or-nothing" in caught.value.message


def test_a_key_reads_plainly() -> None:
    assert _key_text({"sym": "X", "acct": 1, "n": None}) == "sym=X, acct=1, n=NULL"
