"""The outcome lattice (DESIGN §4, seed 001): ``merge`` is a join on ``Status.rank``.

Properties checked with hypothesis over every status: the merge is commutative,
associative and idempotent, so the final status of an attempt does not depend on
the order its observations arrive in; ``applied`` is absorbing; the rank order
and ``settled`` match the table in DESIGN §4.
"""

from __future__ import annotations

from functools import reduce

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marque.outcome import Status, advance, merge

statuses = st.sampled_from(list(Status))
status_lists = st.lists(statuses, max_size=12)


def fold(start: Status, observed: list[Status]) -> Status:
    return reduce(merge, observed, start)


def test_rank_order_matches_design():
    """The rank order is in_progress < indeterminate < aborted_not_applied < applied."""
    ordered = sorted(Status, key=lambda s: s.rank)
    assert ordered == [
        Status.IN_PROGRESS,
        Status.INDETERMINATE,
        Status.ABORTED_NOT_APPLIED,
        Status.APPLIED,
    ]
    assert [s.rank for s in ordered] == [1, 2, 3, 4]
    assert len({s.rank for s in Status}) == len(Status)


def test_wire_names():
    """Each status's value is its wire name."""
    assert {s.value for s in Status} == {
        "in_progress",
        "indeterminate",
        "aborted_not_applied",
        "applied",
    }


@pytest.mark.parametrize(
    ("status", "settled"),
    [
        (Status.IN_PROGRESS, False),
        (Status.INDETERMINATE, False),
        (Status.ABORTED_NOT_APPLIED, True),
        (Status.APPLIED, True),
    ],
)
def test_settled_exactly_for_applied_and_aborted(status: Status, settled: bool):
    """``settled`` is true exactly for applied and aborted_not_applied."""
    assert status.settled is settled


@given(statuses, statuses)
def test_merge_picks_higher_rank(a: Status, b: Status):
    """merge returns whichever status ranks higher (one of its arguments)."""
    merged = merge(a, b)
    assert merged in (a, b)
    assert merged.rank == max(a.rank, b.rank)


@given(statuses, statuses)
def test_merge_is_commutative(a: Status, b: Status):
    """merge(a, b) and merge(b, a) give the same status."""
    assert merge(a, b) is merge(b, a)


@given(statuses, statuses, statuses)
def test_merge_is_associative(a: Status, b: Status, c: Status):
    """merge(merge(a, b), c) equals merge(a, merge(b, c))."""
    assert merge(merge(a, b), c) is merge(a, merge(b, c))


@given(statuses)
def test_merge_is_idempotent(a: Status):
    """Merging a status with itself leaves it unchanged."""
    assert merge(a, a) is a


@given(statuses)
def test_in_progress_is_the_identity(a: Status):
    """in_progress (the claimed state) is the bottom: merging it changes nothing."""
    assert merge(Status.IN_PROGRESS, a) is a
    assert merge(a, Status.IN_PROGRESS) is a


@given(st.data(), status_lists)
def test_fold_is_order_independent(data: st.DataObject, observed: list[Status]):
    """Folding any permutation of the observations gives the same final status."""
    permuted = data.draw(st.permutations(observed))
    assert fold(Status.IN_PROGRESS, permuted) is fold(Status.IN_PROGRESS, observed)


@given(status_lists)
def test_fold_reaches_the_strongest_observation(observed: list[Status]):
    """The folded status is the highest-ranked observation (in_progress when there is none)."""
    expected = max(observed, key=lambda s: s.rank, default=Status.IN_PROGRESS)
    assert fold(Status.IN_PROGRESS, observed) is expected


@given(status_lists, status_lists)
def test_applied_is_absorbing(before: list[Status], after: list[Status]):
    """Once applied is merged in, any further observations leave the status applied."""
    reached = merge(fold(Status.IN_PROGRESS, before), Status.APPLIED)
    assert reached is Status.APPLIED
    assert fold(reached, after) is Status.APPLIED


@given(statuses, status_lists)
def test_merge_never_downgrades(start: Status, observed: list[Status]):
    """Each merge step keeps or raises the rank; a weaker observation never lowers it."""
    current = start
    for status in observed:
        merged = merge(current, status)
        assert merged.rank >= current.rank
        if status.rank <= current.rank:
            assert merged is current
        current = merged


@given(statuses, status_lists)
def test_a_settled_attempt_never_changes(start: Status, observed: list[Status]):
    """advance: once applied or aborted_not_applied, no observation moves the attempt."""
    current = start
    for status in observed:
        after = advance(current, status)
        if current.settled:
            assert after is current
        else:
            assert after is merge(current, status)
        current = after


def test_aborted_then_applied_stays_aborted():
    """The shape issue 8 found: a late applied verdict does not overturn a settled abort."""
    assert advance(Status.ABORTED_NOT_APPLIED, Status.APPLIED) is Status.ABORTED_NOT_APPLIED
    assert advance(Status.INDETERMINATE, Status.APPLIED) is Status.APPLIED
