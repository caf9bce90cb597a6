"""The ledger's Effect Set tables (ledger/effects.py), run over every ledger engine.

Previews are kept by CID (the first stays), an execution's rows are reserved
once, every dispatch move is a compare-and-set that a fenced-out owner loses,
receipts are immutable: an exact redelivery is a no-op, another body a conflict;
a Run moves by compare-and-set on its stored state; and reaping takes an
execution's Effect Set rows with its marque, keeping a preview a remaining
execution names.
"""

from __future__ import annotations

import pytest

from marque.effects.dispatch import DispatchState, advance, prepare
from marque.errors import Conflict
from marque.ledger.base import Ledger
from marque.outcome import Status

from .conftest import make_ticket

T0 = 1_900_000_000.0
KEY = "sha256:" + "a" * 64
ROWS = ["sha256:" + c * 64 for c in "bcd"]


def _reserve(ledger: Ledger, nonce: str = "n-1", *, marque_id: str = "mq_fx",
             preview: str = "sha256:" + "e" * 64) -> bool:
    rows = [(0, i, prepare(row, KEY, "sha256:" + str(i) * 64)) for i, row in enumerate(ROWS)]
    return ledger.effect_begin(marque_id, nonce, preview, {"kind": "allow"}, rows, T0)


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


def _record(state: str, revision: int) -> dict[str, object]:
    return {"run_identity_cid": "sha256:" + "9" * 64, "state": state, "revision": revision,
            "updated_at": "2030-03-17T17:46:40Z"}


def test_a_run_starts_once_and_moves_by_compare_and_set_on_its_stored_state(
        ledger: Ledger) -> None:
    """The first Run record stays; a move from a stale state or revision matches nothing."""
    bound = {"environment_binding_cid": "sha256:" + "8" * 64}
    assert ledger.effect_run_state("mq_fx", "n-1") is None
    first = ledger.effect_run_start("mq_fx", "n-1", _record("running", 2), bound, T0)
    again = ledger.effect_run_start("mq_fx", "n-1", _record("preparing", 1), {}, T0)
    assert first == again == {"record": _record("running", 2), "bound": bound}
    assert ledger.effect_run_advance("mq_fx", "n-1", _record("running", 2),
                                     _record("succeeded", 3), T0)
    # A second process that read the Run before that move loses: it must re-read.
    assert not ledger.effect_run_advance("mq_fx", "n-1", _record("running", 2),
                                         _record("failed", 3), T0)
    assert not ledger.effect_run_advance("mq_fx", "n-1", _record("succeeded", 2),
                                         _record("failed", 3), T0)
    assert ledger.effect_run_state("mq_fx", "n-1") == {"record": _record("succeeded", 3),
                                                      "bound": bound}


def _settled_execution(ledger: Ledger, marque_id: str, preview: str, expires_at: float) -> None:
    """A claimed, settled, reported Effect Set execution with rows, a Run and receipts."""
    claim = ledger.claim(make_ticket(marque_id, "n-1", expires_at=expires_at, now=T0))
    assert claim.fresh
    assert _reserve(ledger, marque_id=marque_id, preview=preview)
    ledger.effect_run_start(marque_id, "n-1", _record("running", 2), {}, T0)
    ledger.effect_put_receipt(marque_id, "n-1", "set", "1",
                              {"receipt_cid": "sha256:" + "1" * 64}, T0)
    ledger.observe(marque_id, "n-1", 1, Status.APPLIED, now=T0, cause="test", rows_affected=3)
    ledger.store_effect_preview(preview, "shop", {"preview": preview}, T0)


def test_reaping_takes_an_executions_effect_rows_and_keeps_a_preview_still_named(
        ledger: Ledger) -> None:
    """A reaped marque's Run, dispatch rows and receipts go; its preview goes too unless an
    execution still in the ledger names it; a preview no execution named yet stays."""
    alone, shared, unused = ("sha256:" + c * 64 for c in "123")
    _settled_execution(ledger, "mq_old", alone, T0 + 100)
    _settled_execution(ledger, "mq_old2", shared, T0 + 100)
    _settled_execution(ledger, "mq_live", shared, T0 + 10_000)
    ledger.store_effect_preview(unused, "shop", {"preview": unused}, T0)
    while pending := ledger.outbox_pending(limit=1000):
        ledger.outbox_ack_all(pending, T0)

    counts = ledger.reap(T0 + 200)

    assert counts["marques"] == 2
    assert (counts["effect_runs"], counts["effect_run_states"], counts["effect_dispatch"],
            counts["effect_receipts"], counts["effect_previews"]) == (2, 2, 6, 2, 1)
    for gone in ("mq_old", "mq_old2"):
        assert ledger.effect_run(gone, "n-1") is None
        assert ledger.effect_run_state(gone, "n-1") is None
        assert ledger.effect_rows(gone, "n-1") == []
        assert ledger.effect_receipts(gone, "n-1") == []
        reaped = ledger.reaped(gone, "n-1")
        assert reaped is not None and reaped.status is Status.APPLIED
    assert ledger.effect_preview(alone) is None
    assert ledger.effect_preview(shared) == {"preview": shared}  # the live marque names it
    assert ledger.effect_preview(unused) == {"preview": unused}  # no execution named it yet
    assert len(ledger.effect_rows("mq_live", "n-1")) == 3
    assert ledger.effect_run_state("mq_live", "n-1") is not None
    assert len(ledger.effect_receipts("mq_live", "n-1")) == 1

    # Once the last execution naming it is reaped, the shared preview goes with it.
    counts = ledger.reap(T0 + 20_000)
    assert (counts["marques"], counts["effect_previews"]) == (1, 1)
    assert ledger.effect_preview(shared) is None
    assert ledger.effect_preview(unused) == {"preview": unused}
