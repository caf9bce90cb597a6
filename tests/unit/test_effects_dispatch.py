"""The per-row dispatch ledger: every transition, fencing, and the seed's halt/continue table."""

from __future__ import annotations

import itertools

import pytest

from marque.cid import cid
from marque.effects.declare import FailurePolicy
from marque.effects.dispatch import (
    SQL_ROW_CAPABILITY,
    Capability,
    DispatchRecord,
    DispatchState,
    FencedOut,
    IllegalDispatchTransition,
    Plan,
    PlanReason,
    advance,
    check_capability,
    plan_member,
    plan_set,
    prepare,
    transition,
)
from marque.errors import EffectUnsupported

D = DispatchState
HALT, CONTINUE = FailurePolicy.HALT, FailurePolicy.CONTINUE

# The seed's states and the legal moves, written out independently of the code.
LEGAL = {
    ("prepared", "dispatching"),
    ("dispatching", "applied"), ("dispatching", "accepted"), ("dispatching", "failed"),
    ("dispatching", "unknown"), ("dispatching", "prepared"),
    ("unknown", "applied"), ("unknown", "accepted"), ("unknown", "failed"),
}
STATES = ["prepared", "dispatching", "applied", "accepted", "failed", "unknown"]


def test_the_states_are_exactly_the_seeds() -> None:
    """The dispatch ledger has exactly prepared|dispatching|applied|accepted|failed|unknown."""
    assert [s.value for s in DispatchState] == STATES


@pytest.mark.parametrize(("current", "to"), list(itertools.product(STATES, STATES)))
def test_every_transition_is_legal_exactly_when_the_table_says(current: str, to: str) -> None:
    """Each of the 36 moves is allowed iff it is in the table; an illegal one raises conflict."""
    if (current, to) in LEGAL:
        assert transition(D(current), D(to)) is D(to)
    else:
        with pytest.raises(IllegalDispatchTransition) as caught:
            transition(D(current), D(to))
        assert caught.value.code == "conflict"


def test_dispatch_takes_a_fence_and_counts_an_attempt() -> None:
    """prepared → dispatching needs a fence, sets it and counts attempt 1; revision moves."""
    record = prepare(cid({"row": 0}), cid({"apply": 1}), cid({"key": 0}))
    assert record.dispatch_entry_cid is None
    with pytest.raises(FencedOut):
        advance(record, D.DISPATCHING)
    sent = advance(record, D.DISPATCHING, fence="owner-1")
    assert (sent.state, sent.attempt, sent.fence, sent.revision) == (D.DISPATCHING, 1,
                                                                     "owner-1", 1)
    assert sent.dispatch_entry_cid is not None and record.state is D.PREPARED


def test_only_the_fenced_owner_settles_a_dispatching_row() -> None:
    """Another owner's fence cannot settle a dispatching row; the owner's can."""
    sent = advance(prepare(cid({"r": 0}), cid({"a": 1}), cid({"k": 0})), D.DISPATCHING,
                   fence="owner-1")
    with pytest.raises(FencedOut):
        advance(sent, D.APPLIED, fence="owner-2")
    assert advance(sent, D.APPLIED, fence="owner-1").state is D.APPLIED


def test_unknown_is_settled_by_evidence_and_never_dispatched_again() -> None:
    """unknown → applied needs no owner's fence; unknown → dispatching is refused."""
    lost = advance(advance(prepare(cid({"r": 0}), cid({"a": 1}), cid({"k": 0})),
                           D.DISPATCHING, fence="f"), D.UNKNOWN, fence="f")
    assert lost.was_unknown and lost.ledger_head_cid.startswith("sha256:")
    with pytest.raises(IllegalDispatchTransition):
        advance(lost, D.DISPATCHING, fence="f2")
    settled = advance(lost, D.APPLIED)
    assert settled.state is D.APPLIED and settled.was_unknown
    assert settled.ledger_head_cid != lost.ledger_head_cid


def test_a_provably_unsent_row_goes_back_to_prepared_and_counts_its_next_attempt() -> None:
    """dispatching → prepared (never sent); the next dispatch is attempt 2."""
    sent = advance(prepare(cid({"r": 0}), cid({"a": 1}), cid({"k": 0})), D.DISPATCHING,
                   fence="f")
    back = advance(sent, D.PREPARED, fence="f")
    again = advance(back, D.DISPATCHING, fence="g")
    assert (back.state, again.attempt) == (D.PREPARED, 2)


# -- the halt/continue table ---------------------------------------------------------------


def _drive(policy: FailurePolicy, outcomes: list[str]
           ) -> tuple[list[int], Plan, list[DispatchRecord]]:
    """Dispatch rows as the planner allows, each settling with its scripted outcome."""
    records = [prepare(cid({"r": i}), cid({"a": 1}), cid({"k": i})) for i in range(len(outcomes))]
    sent: list[int] = []
    while True:
        plan = plan_member(records, policy)
        if plan.next is None:
            return sent, plan, records
        index = plan.next
        records[index] = advance(records[index], D.DISPATCHING, fence="f")
        assert plan_member(records, policy).reason is PlanReason.IN_FLIGHT
        sent.append(index)
        records[index] = advance(records[index], D(outcomes[index]), fence="f")


@pytest.mark.parametrize(("policy", "outcomes", "sent", "reason", "unattempted", "reconcile"), [
    (HALT, ["applied", "accepted", "applied"], [0, 1, 2], PlanReason.COMPLETE, (), ()),
    (CONTINUE, ["applied", "accepted", "applied"], [0, 1, 2], PlanReason.COMPLETE, (), ()),
    (HALT, ["applied", "failed", "applied", "applied"], [0, 1], PlanReason.HALTED_FAILED,
     (2, 3), ()),
    (CONTINUE, ["applied", "failed", "applied", "applied"], [0, 1, 2, 3], PlanReason.COMPLETE,
     (), ()),
    (HALT, ["applied", "unknown", "applied", "applied"], [0, 1], PlanReason.HALTED_UNKNOWN,
     (2, 3), (1,)),
    (CONTINUE, ["applied", "unknown", "applied", "applied"], [0, 1, 2, 3], PlanReason.COMPLETE,
     (), (1,)),
    (HALT, ["failed", "applied"], [0], PlanReason.HALTED_FAILED, (1,), ()),
    (CONTINUE, ["unknown", "failed", "unknown"], [0, 1, 2], PlanReason.COMPLETE, (), (0, 2)),
])
def test_dispatch_pattern_is_exactly_the_seeds_table(
        policy: FailurePolicy, outcomes: list[str], sent: list[int], reason: PlanReason,
        unattempted: tuple[int, ...], reconcile: tuple[int, ...]) -> None:
    """halt stops at a failed or unknown row (later rows unattempted); continue goes on;
    an unknown row is reconciled, and every row is sent at most once."""
    dispatched, plan, _ = _drive(policy, outcomes)
    assert dispatched == sent
    assert len(dispatched) == len(set(dispatched))
    assert (plan.reason, plan.unattempted, plan.reconcile) == (reason, unattempted, reconcile)


def test_under_halt_a_reconciled_unknown_row_still_leaves_later_rows_unattempted() -> None:
    """Settling the unknown row later (→ applied) does not release the rows after it."""
    _, _, records = _drive(HALT, ["applied", "unknown", "applied"])
    records[1] = advance(records[1], D.APPLIED)
    plan = plan_member(records, HALT)
    assert (plan.reason, plan.next, plan.unattempted) == (PlanReason.HALTED_UNKNOWN, None, (2,))


def test_members_are_attempted_in_order_whatever_another_members_rows_did() -> None:
    """A halted member does not stop the next member (attempt_all); one row at a time."""
    halted = [D.APPLIED, D.FAILED, D.PREPARED]
    plan = plan_set([(HALT, halted), (HALT, [D.PREPARED, D.PREPARED])])
    assert plan.next == (1, 0) and plan.members[0].unattempted == (2,)
    assert plan_set([(CONTINUE, [D.DISPATCHING, D.PREPARED]), (HALT, [D.PREPARED])]).in_flight
    assert plan_set([(HALT, [D.APPLIED]), (CONTINUE, [D.FAILED])]).done


# -- capability ----------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "fields", "supported"), [
    (HALT, {}, True),
    (CONTINUE, {}, True),
    (HALT, {"request_order": False}, False),
    (CONTINUE, {"request_order": False}, True),
    (HALT, {"row_error_identity": False}, False),
    (CONTINUE, {"row_error_identity": False}, False),
    (HALT, {"atomicity": "provider_batch_atomic"}, True),
    (CONTINUE, {"atomicity": "provider_batch_atomic"}, False),
    (HALT, {"atomicity": "unknown"}, False),
    (CONTINUE, {"atomicity": "unknown"}, False),
])
def test_capability_must_realise_the_policy_exactly(policy: FailurePolicy,
                                                    fields: dict[str, object],
                                                    supported: bool) -> None:
    """continue needs per-item outcomes; halt also needs request order; else unsupported."""
    base = SQL_ROW_CAPABILITY.to_json()
    base.pop("version")
    capability = Capability(**{**base, **fields})
    if supported:
        check_capability(policy, capability)
    else:
        with pytest.raises(EffectUnsupported) as caught:
            check_capability(policy, capability)
        assert caught.value.exit_status == 3


def test_capability_evidence_is_closed() -> None:
    """An atomicity, idempotency or recovery value outside the seed's set is refused."""
    with pytest.raises(EffectUnsupported):
        Capability("per_row", True, True, "native", "stamped")
    with pytest.raises(EffectUnsupported):
        Capability("per_item", True, True, "native", "hope")
    assert SQL_ROW_CAPABILITY.capability_cid.startswith("sha256:")
