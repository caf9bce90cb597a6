"""The Run state machine of seed 002: its table, its projection and resume revalidation."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from marque.cid import cid
from marque.effects.run import (
    Cause,
    IllegalRunTransition,
    RunRecord,
    RunState,
    new_run,
    project,
    revalidate_resume,
    transition,
)
from marque.errors import ResumeRevalidationFailed

R, C = RunState, Cause
STATES = [s.value for s in RunState]
CAUSES = [c.value for c in Cause]

# The seed's table, written out independently: (from, to) → causes that allow it.
P, RU, W, RS, NR, S, F, X = ("preparing", "running", "waiting_checkpoint", "resuming",
                             "needs_reconciliation", "succeeded", "failed", "cancelled")
LEGAL: set[tuple[str, str, str]] = {(P, RU, "admitted")}
LEGAL |= {(a, W, "checkpoint_persisted") for a in (P, RU, RS)}
LEGAL |= {(W, RS, "resolution_approved"), (W, X, "checkpoint_closed"),
          (W, NR, "checkpoint_closed"), (W, NR, "cancellation_confirmed")}
LEGAL |= {(a, X, "cancellation_confirmed") for a in (P, RU, W, RS)}
LEGAL |= {(a, b, "continuation_ended") for a in (P, RU, RS) for b in (S, F, NR)}
LEGAL |= {(RS, b, "resume_revalidation_failed") for b in (F, NR)}
LEGAL |= {(NR, b, "effect_reconciled") for b in (NR, S, F)}
LEGAL |= {(NR, b, "execution_observed") for b in (RU, NR, S, F, X)}


def test_the_states_are_exactly_the_seeds() -> None:
    """The public Run states are the seed's eight."""
    assert set(STATES) == {P, RU, W, RS, NR, S, F, X}


@pytest.mark.parametrize(("current", "to", "cause"),
                         list(itertools.product(STATES, STATES, CAUSES)))
def test_every_move_is_legal_exactly_when_the_table_says(current: str, to: str,
                                                         cause: str) -> None:
    """Each (from, to, cause) is allowed iff the seed's table has it; otherwise conflict."""
    if (current, to, cause) in LEGAL:
        assert transition(R(current), R(to), C(cause)) is R(to)
    else:
        with pytest.raises(IllegalRunTransition) as caught:
            transition(R(current), R(to), C(cause))
        assert caught.value.code == "conflict"


class RunMachine(RuleBasedStateMachine):
    """Random walks over the table: every illegal move is refused and changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.state = P
        self.left_terminal = False

    @rule(to=st.sampled_from(STATES), cause=st.sampled_from(CAUSES))
    def move(self, to: str, cause: str) -> None:
        """Try a move; it succeeds iff it is in the table."""
        before = self.state
        if (before, to, cause) in LEGAL:
            assert transition(R(before), R(to), C(cause)) is R(to)
            self.state = to
            self.left_terminal |= before in (S, F, X)
        else:
            with pytest.raises(IllegalRunTransition):
                transition(R(before), R(to), C(cause))

    @rule(admitted=st.booleans())
    def restart(self, admitted: bool) -> None:
        """Begin a new Run (preparing, or running once admitted)."""
        self.state = new_run(cid({"run": 1}), at="t0", admitted=admitted).state.value

    @invariant()
    def terminal_states_are_never_left(self) -> None:
        """No walk ever leaves succeeded, failed or cancelled."""
        assert not self.left_terminal

    @invariant()
    def a_resumed_run_never_runs_again(self) -> None:
        """resuming → running is never legal."""
        assert not any((RS, RU, c) in LEGAL for c in CAUSES)


RunMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30,
                                        deadline=None)
TestRunMachine = RunMachine.TestCase


# -- the record, the projection ------------------------------------------------------------

RUN = cid({"run": 1})
CHECKPOINT = cid({"checkpoint": 1})


def _waiting(unknown: tuple[str, ...] = ()) -> RunRecord:
    record = new_run(RUN, at="t0", admitted=True)
    return record.advance(R.WAITING_CHECKPOINT, C.CHECKPOINT_PERSISTED, at="t1",
                          checkpoint_cid=CHECKPOINT, unknown_effects=unknown)


def test_the_record_refuses_moves_inconsistent_with_its_unknowns() -> None:
    """No terminal state while something is unknown; no needs_reconciliation without."""
    running = new_run(RUN, at="t0", admitted=True)
    with pytest.raises(IllegalRunTransition):
        running.advance(R.NEEDS_RECONCILIATION, C.CONTINUATION_ENDED, at="t1")
    with pytest.raises(IllegalRunTransition):
        running.advance(R.SUCCEEDED, C.CONTINUATION_ENDED, at="t1", unknown_effects=["fix"])
    with pytest.raises(IllegalRunTransition):
        running.advance(R.WAITING_CHECKPOINT, C.CHECKPOINT_PERSISTED, at="t1")
    waiting = _waiting(("fix",))
    with pytest.raises(IllegalRunTransition):
        waiting.advance(R.CANCELLED, C.CHECKPOINT_CLOSED, at="t2")
    closed = waiting.advance(R.NEEDS_RECONCILIATION, C.CHECKPOINT_CLOSED, at="t2")
    assert closed.revision == 3 and closed.unknown_effects == ("fix",)


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: new_run(RUN, at="t0"), {"kind": "wait", "reason": "preparing"}),
    (lambda: new_run(RUN, at="t0", admitted=True), {"kind": "wait", "reason": "running"}),
    (lambda: _waiting(), {"kind": "resolve_checkpoint", "checkpoint_cid": CHECKPOINT}),
    (lambda: _waiting().advance(R.RESUMING, C.RESOLUTION_APPROVED, at="t2"),
     {"kind": "wait", "reason": "resuming"}),
    (lambda: new_run(RUN, at="t0", admitted=True).advance(
        R.NEEDS_RECONCILIATION, C.CONTINUATION_ENDED, at="t1", unknown_effects=["b", "a"]),
     {"kind": "reconcile", "effects": ["a", "b"]}),
    (lambda: new_run(RUN, at="t0", admitted=True).advance(
        R.NEEDS_RECONCILIATION, C.CONTINUATION_ENDED, at="t1", execution_unknown=True),
     {"kind": "reconcile_run", "reason": "execution_unknown"}),
    (lambda: new_run(RUN, at="t0", admitted=True).advance(
        R.SUCCEEDED, C.CONTINUATION_ENDED, at="t1"), {"kind": "none"}),
    (lambda: new_run(RUN, at="t0", admitted=True).advance(
        R.FAILED, C.CONTINUATION_ENDED, at="t1"), {"kind": "none"}),
    (lambda: _waiting().advance(R.CANCELLED, C.CHECKPOINT_CLOSED, at="t2"),
     {"kind": "none"}),
])
def test_the_projection_has_one_next_action_per_state(build: Callable[[], RunRecord],
                                                     expected: dict[str, Any]) -> None:
    """actql-run-state/0.1 is closed and its next action fits the state."""
    record = build()
    projected = project(record)
    assert set(projected) == {"version", "run_identity_cid", "state", "updated_at", "revision",
                              "checkpoint_cid", "result_availability", "result_available",
                              "next_action", "terminal_error"}
    assert projected["version"] == "actql-run-state/0.1"
    assert projected["next_action"] == expected
    assert projected["result_availability"] == {} and projected["result_available"] is False


def test_result_available_needs_every_declared_result_available() -> None:
    """result_available is true only when at least one Result is declared and all are."""
    done = new_run(RUN, at="t0", admitted=True).advance(R.SUCCEEDED, C.CONTINUATION_ENDED,
                                                         at="t1")
    both = {"a": {"state": "available"}, "b": {"state": "unknown"}}
    assert project(done, both)["result_available"] is False
    assert project(done, both)["next_action"] == {"kind": "read_result", "results": ["a"]}
    assert project(done, {"a": {"state": "available"}})["result_available"] is True


# -- resume revalidation ---------------------------------------------------------------------

BOUND = {"authorization_context_cid": cid({"a": 1}), "environment_binding_cid": cid({"e": 1}),
         "config_cid": cid({"c": 1})}


def _resuming(unknown: tuple[str, ...] = ()) -> RunRecord:
    return _waiting(unknown).advance(R.RESUMING, C.RESOLUTION_APPROVED, at="t2")


def test_a_resume_that_revalidates_dispatches_and_changes_nothing() -> None:
    """Equal bound CIDs: dispatch, the record as it was."""
    record = _resuming()
    decision = revalidate_resume(record, BOUND, dict(BOUND), at="t3")
    assert decision.dispatch and decision.record is record and decision.error() is None


@pytest.mark.parametrize(("unknown", "state"), [((), "failed"),
                                                (("fix",), "needs_reconciliation")])
def test_a_resume_that_does_not_revalidate_ends_failed_or_needs_reconciliation(
        unknown: tuple[str, ...], state: str) -> None:
    """A changed (or missing) bound CID: nothing dispatched; failed, or needs_reconciliation
    over the unknown Effects, with ACTQL_E_RESUME_REVALIDATION_FAILED."""
    current = {**BOUND, "config_cid": cid({"c": 2})}
    del current["environment_binding_cid"]
    decision = revalidate_resume(_resuming(unknown), BOUND, current, at="t3")
    assert not decision.dispatch
    assert decision.changed == ("config_cid", "environment_binding_cid")
    projected = project(decision.record)
    assert projected["state"] == state
    assert projected["terminal_error"] == {"phase": "admission",
                                           "code": "ACTQL_E_RESUME_REVALIDATION_FAILED"}
    error = decision.error()
    assert isinstance(error, ResumeRevalidationFailed) and error.exit_status == 3
    if unknown:
        assert projected["next_action"] == {"kind": "reconcile", "effects": ["fix"]}
        with pytest.raises(IllegalRunTransition):
            decision.record.advance(R.SUCCEEDED, C.EFFECT_RECONCILED, at="t4", unknown_effects=[])


def test_only_a_resuming_run_is_revalidated() -> None:
    """Revalidating a waiting Run is refused: it has no continuation to dispatch yet."""
    with pytest.raises(IllegalRunTransition):
        revalidate_resume(_waiting(), BOUND, BOUND, at="t3")
