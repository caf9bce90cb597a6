"""The ledger's Effect Set tables (ledger/effects.py), run over every ledger engine.

Previews are kept by CID (the first stays), an execution's rows are reserved
once, every dispatch move is a compare-and-set that a fenced-out owner loses,
and receipts are immutable: an exact redelivery is a no-op, another body a conflict.
"""

from __future__ import annotations

import pytest

from marque.effects.dispatch import DispatchState, advance, prepare
from marque.errors import Conflict
from marque.ledger.base import Ledger

T0 = 1_900_000_000.0
KEY = "sha256:" + "a" * 64
ROWS = ["sha256:" + c * 64 for c in "bcd"]


def _reserve(ledger: Ledger, nonce: str = "n-1") -> bool:
    rows = [(0, i, prepare(row, KEY, "sha256:" + str(i) * 64)) for i, row in enumerate(ROWS)]
    return ledger.effect_begin("mq_fx", nonce, "sha256:" + "e" * 64, {"kind": "allow"}, rows, T0)


def test_a_preview_is_kept_by_its_cid_and_the_first_stays(ledger: Ledger) -> None:
    """Storing a second body under a CID returns the first, unchanged."""
    cid = "sha256:" + "f" * 64
    assert ledger.effect_preview(cid) is None
    first = ledger.store_effect_preview(cid, "shop", {"n": 1}, T0)
    again = ledger.store_effect_preview(cid, "shop", {"n": 2}, T0 + 1)
    assert first == again == {"n": 1} == ledger.effect_preview(cid)


def test_an_execution_reserves_its_rows_once_in_order(ledger: Ledger) -> None:
    """effect_begin reserves every row prepared, once; a second reservation changes nothing."""
    assert _reserve(ledger) is True
    assert _reserve(ledger) is False
    rows = ledger.effect_rows("mq_fx", "n-1")
    assert [r.record.row_preview_cid for r in rows] == ROWS
    assert {r.record.state for r in rows} == {DispatchState.PREPARED}
    assert ledger.effect_run("mq_fx", "n-1") == {"effect_preview_cid": "sha256:" + "e" * 64,
                                                "authorization": {"kind": "allow"}}
    assert ledger.effect_run("mq_fx", "other") is None


def test_a_move_is_a_compare_and_set_a_fenced_out_owner_loses(ledger: Ledger) -> None:
    """Owner A dispatches; a takeover moves the row to unknown; A's late settle matches
    nothing and the row stays unknown, never applied by A."""
    _reserve(ledger)
    stored = ledger.effect_rows("mq_fx", "n-1")[0].record
    mine = advance(stored, DispatchState.DISPATCHING, fence="owner-a")
    assert ledger.effect_move("mq_fx", "n-1", stored, mine, now=T0)
    assert not ledger.effect_move("mq_fx", "n-1", stored, mine, now=T0)  # stale snapshot
    taken = advance(mine, DispatchState.UNKNOWN, fence="owner-a")  # a takeover with the fence
    assert ledger.effect_move("mq_fx", "n-1", mine, taken, now=T0)
    late = advance(mine, DispatchState.APPLIED, fence="owner-a")
    assert not ledger.effect_move("mq_fx", "n-1", mine, late, now=T0,
                                  outcome={"state": "applied", "rows_affected": 1})
    row = ledger.effect_rows("mq_fx", "n-1")[0]
    assert row.record.state is DispatchState.UNKNOWN and row.record.was_unknown
    assert row.outcome is None
    settled = advance(row.record, DispatchState.APPLIED)
    assert ledger.effect_move("mq_fx", "n-1", row.record, settled, now=T0,
                              outcome={"state": "applied", "rows_affected": 1})
    assert ledger.effect_rows("mq_fx", "n-1")[0].outcome == {"state": "applied",
                                                             "rows_affected": 1}


def test_receipts_are_immutable_redelivery_is_idempotent(ledger: Ledger) -> None:
    """The same receipt again is not new; a different one under its key is a conflict."""
    body = {"receipt_cid": "sha256:" + "1" * 64, "status": "applied"}
    assert ledger.effect_put_receipt("mq_fx", "n-1", "set", "1", body, T0) is True
    assert ledger.effect_put_receipt("mq_fx", "n-1", "set", "1", dict(body), T0) is False
    with pytest.raises(Conflict):
        ledger.effect_put_receipt("mq_fx", "n-1", "set", "1", {**body, "status": "failed"}, T0)
    assert [r["body"] for r in ledger.effect_receipts("mq_fx", "n-1")] == [body]
