"""The request lifecycle table (DESIGN §11.2): every legal move allowed, every other refused."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from marque.errors import Conflict
from marque.harbour.lifecycle import (
    BLOCKING,
    PRIMITIVE_ONLY,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    RequestState,
    can_move,
    transition,
)
from marque.harbour.store.schema import BLOCKING_STATES_V2

S = RequestState

# The table written out again, independently, from DESIGN §11.2 and §11.5.
EXPECTED = {
    ("preparing", "awaiting_approval"), ("preparing", "prepared"), ("preparing", "failed"),
    ("awaiting_approval", "prepared"), ("awaiting_approval", "rejected"),
    ("awaiting_approval", "expired"), ("awaiting_approval", "failed"),
    ("prepared", "executing"), ("prepared", "verified"), ("prepared", "reconciliation"),
    ("prepared", "failed"), ("prepared", "expired"),
    ("executing", "verified"), ("executing", "reconciliation"), ("executing", "failed"),
    ("reconciliation", "verified"), ("reconciliation", "failed"),
    ("reconciliation", "expired"), ("reconciliation", "executing"),
    ("verified", "rolling_back"), ("verified", "reconciliation"),
    ("rolling_back", "rolled_back"), ("rolling_back", "rollback_failed"),
    ("rolling_back", "verified"),
    ("rollback_failed", "rolling_back"),
}
ALL_PAIRS = list(itertools.product(RequestState, RequestState))


def test_the_states_are_designs() -> None:
    """Twelve states, spelled as DESIGN §11.2 spells them."""
    assert {s.value for s in RequestState} == {
        "preparing", "awaiting_approval", "prepared", "executing", "verified",
        "reconciliation", "rolling_back", "rollback_failed", "failed", "rejected", "expired",
        "rolled_back"}


def test_blocking_states_are_adr_038s() -> None:
    """failed, rejected, expired and rolled_back do not block; every other state does."""
    assert set(RequestState) - BLOCKING == {S.FAILED, S.REJECTED, S.EXPIRED, S.ROLLED_BACK}
    assert TERMINAL == set(RequestState) - BLOCKING


def test_the_partial_index_names_exactly_the_blocking_states() -> None:
    """The index predicate released in schema version 2 is lifecycle.BLOCKING."""
    assert set(BLOCKING_STATES_V2) == {s.value for s in BLOCKING}


@pytest.mark.parametrize(("current", "to"), ALL_PAIRS, ids=lambda s: str(s))
def test_each_pair_is_allowed_exactly_when_the_table_says(current: RequestState,
                                                          to: RequestState) -> None:
    """transition() returns the target for a legal move and raises for every other one."""
    if (current.value, to.value) in EXPECTED:
        assert transition(current, to) is to
        assert can_move(current, to)
    else:
        with pytest.raises(IllegalTransition) as caught:
            transition(current, to)
        assert isinstance(caught.value, Conflict)
        assert caught.value.code == "conflict"
        assert caught.value.detail == {"from": current.value, "to": to.value}
        assert not can_move(current, to)


def test_terminal_states_have_no_exit_and_no_self_moves_exist() -> None:
    """Nothing leaves a terminal state; no state moves to itself."""
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
    for state in RequestState:
        assert state not in TRANSITIONS[state]


def test_primitive_only_moves_are_legal_moves() -> None:
    """A move reserved to a primitive is still a move of the table."""
    for current, to in PRIMITIVE_ONLY:
        assert can_move(current, to)
    assert (S.PREPARED, S.EXPIRED) in PRIMITIVE_ONLY


def test_every_state_is_reachable_from_preparing() -> None:
    """The table has no dead rows: each state can be reached from the initial one."""
    seen, frontier = {S.PREPARING}, [S.PREPARING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(RequestState)


def test_strings_are_accepted_and_unknown_states_are_not() -> None:
    """transition() takes state names; an unknown name is a ValueError of the enum."""
    preparing: Any = "preparing"
    assert transition(preparing, cast(Any, "prepared")) is S.PREPARED
    with pytest.raises(ValueError):
        transition(preparing, cast(Any, "done"))


class LifecycleMachine(RuleBasedStateMachine):
    """Random walks over the table: legal moves move, illegal ones raise and change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.state = S.PREPARING
        self.history = [S.PREPARING]

    @rule(to=st.sampled_from(list(RequestState)))
    def move(self, to: RequestState) -> None:
        legal = (self.state.value, to.value) in EXPECTED
        try:
            self.state = transition(self.state, to)
        except IllegalTransition:
            assert not legal
        else:
            assert legal
            self.history.append(to)

    @invariant()
    def walk_follows_the_table(self) -> None:
        for a, b in itertools.pairwise(self.history):
            assert (a.value, b.value) in EXPECTED


LifecycleMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30,
                                              deadline=None)
test_lifecycle_machine = LifecycleMachine.TestCase
