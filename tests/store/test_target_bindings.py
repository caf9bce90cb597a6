"""Target bindings (ledger/bindings.py) on every engine: which database a name stands for.

The first binding of a name wins; a rebinding is a compare-and-set on the identity
the operator saw, refused while attempts on the name are unsettled unless it pins them
to the database they were sent to; pins and bindings survive, and reaping takes a
settled pin away with its marque.
"""

from __future__ import annotations

import pytest

from marque.errors import Conflict, TargetUnsettled
from marque.ledger.base import Ledger
from marque.outcome import Status

from .conftest import make_ticket

T0 = 1_900_000_000.0


def test_the_first_binding_of_a_name_wins(ledger: Ledger) -> None:
    """Two binders with different identities: both read the first one's."""
    first = ledger.bind_target("bank", "tgt_a", "/data/bank.db", now=T0)
    second = ledger.bind_target("bank", "tgt_b", "/data/other.db", now=T0 + 1)

    assert (first.target_id, first.location, first.bound_at) == ("tgt_a", "/data/bank.db", T0)
    assert second == first
    assert ledger.target_binding("bank") == first
    assert ledger.target_binding("shop") is None
    assert [b.target for b in ledger.target_bindings()] == ["bank"]


def test_a_rebinding_is_refused_while_an_attempt_on_the_name_is_unsettled(
        ledger: Ledger) -> None:
    """An in-progress attempt on `bank` refuses the move, listing it; nothing changes. Once
    it is settled, the move goes through and remembers where the name stood before."""
    ledger.bind_target("bank", "tgt_a", "/data/bank.db", now=T0)
    claim = ledger.claim(make_ticket("mq_1", "n-1", target="bank", now=T0))
    ledger.claim(make_ticket("mq_2", "n-1", target="shop", now=T0))  # another name's

    with pytest.raises(TargetUnsettled) as refused:
        ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_b", location="/x.db",
                             now=T0 + 1, pin_unsettled=False)
    assert refused.value.detail["unsettled"] == [
        {"marque_id": "mq_1", "nonce": "n-1", "attempt": 1}]
    assert ledger.target_binding("bank").target_id == "tgt_a"  # type: ignore[union-attr]

    ledger.observe("mq_1", "n-1", claim.record.attempt, Status.APPLIED, now=T0 + 2,
                   cause="test", rows_affected=1)
    binding, pinned = ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_b",
                                           location="/x.db", now=T0 + 3, pin_unsettled=False)
    assert pinned == []
    assert (binding.target_id, binding.location, binding.rebound_from) == (
        "tgt_b", "/x.db", "tgt_a")


def test_a_rebinding_that_pins_leaves_each_unsettled_nonce_bound_to_the_old_identity(
        ledger: Ledger) -> None:
    """--pin-unsettled: the unsettled nonce is pinned to the identity it was sent to, a
    settled one is not; a later rebinding neither refuses nor re-pins it."""
    ledger.bind_target("bank", "tgt_a", "/a.db", now=T0)
    ledger.claim(make_ticket("mq_1", "open", now=T0))
    done = ledger.claim(make_ticket("mq_1", "done", now=T0))
    ledger.observe("mq_1", "done", done.record.attempt, Status.ABORTED_NOT_APPLIED,
                   now=T0, cause="test")

    _, pinned = ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_b",
                                     location="/b.db", now=T0 + 1, pin_unsettled=True)

    assert [(p.marque_id, p.nonce, p.attempt, p.target_id) for p in pinned] == [
        ("mq_1", "open", 1, "tgt_a")]
    pin = ledger.pinned_attempt("mq_1", "open")
    assert pin is not None and (pin.target, pin.target_id, pin.pinned_at) == (
        "bank", "tgt_a", T0 + 1)
    assert ledger.pinned_attempt("mq_1", "done") is None
    binding, again = ledger.rebind_target("bank", seen_id="tgt_b", target_id="tgt_c",
                                          location="/c.db", now=T0 + 2, pin_unsettled=False)
    assert again == [] and binding.target_id == "tgt_c"
    assert ledger.pinned_attempt("mq_1", "open").target_id == "tgt_a"  # type: ignore[union-attr]


def test_a_rebinding_from_an_identity_no_longer_bound_is_a_conflict(ledger: Ledger) -> None:
    """The compare-and-set: a rebinding from what another process already moved away from
    changes nothing."""
    ledger.bind_target("bank", "tgt_a", "/a.db", now=T0)
    ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_b", location="/b.db",
                         now=T0 + 1, pin_unsettled=False)

    with pytest.raises(Conflict):
        ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_c", location="/c.db",
                             now=T0 + 2, pin_unsettled=False)
    with pytest.raises(Conflict):
        ledger.rebind_target("never", seen_id="tgt_a", target_id="tgt_c", location="/c.db",
                             now=T0 + 2, pin_unsettled=False)
    assert ledger.target_binding("bank").target_id == "tgt_b"  # type: ignore[union-attr]


def test_reaping_takes_a_settled_pin_away_with_its_marque(ledger: Ledger) -> None:
    """A pinned nonce, settled later (its target pointed back), goes with its marque when it
    is reaped; the binding stays."""
    claim = ledger.claim(make_ticket("mq_1", "n-1", expires_at=T0 + 10, now=T0))
    ledger.bind_target("bank", "tgt_a", "/a.db", now=T0)
    ledger.rebind_target("bank", seen_id="tgt_a", target_id="tgt_b", location="/b.db",
                         now=T0, pin_unsettled=True)
    ledger.observe("mq_1", "n-1", claim.record.attempt, Status.APPLIED, now=T0,
                   cause="reconciliation", rows_affected=1)
    while pending := ledger.outbox_pending(limit=1000):
        ledger.outbox_ack_all(pending, T0)

    counts = ledger.reap(T0 + 100)

    assert counts["marques"] == 1 and counts["pinned_attempts"] == 1
    assert ledger.pinned_attempt("mq_1", "n-1") is None
    assert ledger.target_binding("bank") is not None
