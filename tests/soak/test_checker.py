"""The campaign's checker can fail: each invariant, broken on purpose, is reported."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from soak.checker import FinalState, check, final_state, settle
from soak.harness import invoke
from soak.scenario import History, RunContext
from soak.world import PilotProcess, SoakWorld

M, N = "mq_a", "n-1"


def told(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "op": "op-1", "marque_id": M, "nonce": N, "executions": 1,
            "at": 100.0, **fields}


def state(rows: int, status: str | None, *, reported: int = 1, unacked: int = 0,
          broken: str | None = None, error: dict[str, Any] | None = None) -> FinalState:
    attempts = {} if status is None else {(M, N, 1): {"status": status, "error": error,
                                                      "settled_at": 101.0}}
    counted: Counter[tuple[str, str, int, str]] = Counter()
    if status in ("applied", "aborted_not_applied") and reported:
        counted[(M, N, 1, status)] = reported
    return FinalState({"op-1": rows} if rows else {}, attempts, counted,
                      {k: 101.0 for k in counted}, broken, unacked)


def violations(history: list[dict[str, Any]], final: FinalState, **kw: Any) -> list[str]:
    return check(history, final, **kw)[0]


def test_a_consistent_history_has_no_violation() -> None:
    """Told applied, one effect row, applied once in the ledger, reported once."""
    assert violations([told("invoke"), told("ok", status="applied", attempt=1)],
                      state(1, "applied")) == []


def test_a_double_apply_is_a_violation() -> None:
    """Two effect rows for a budget of one execution."""
    found = violations([told("invoke"), told("ok", status="applied")], state(2, "applied"))
    assert any("2 effect rows for a budget of 1" in v for v in found), found


def test_an_applied_answer_later_contradicted_is_a_violation() -> None:
    """Told applied, but the ledger ended it aborted_not_applied and no row exists."""
    found = violations([told("invoke"), told("ok", status="applied")],
                       state(0, "aborted_not_applied"))
    assert any("told applied, but it ended aborted_not_applied" in v for v in found), found


def test_an_effect_without_an_applied_outcome_is_a_violation() -> None:
    """A row exists, the ledger says not applied: a lost outcome."""
    found = violations([told("invoke"), told("info", status="lost")],
                       state(1, "aborted_not_applied"))
    assert any("1 effect rows but 0 nonce(s) settled applied" in v for v in found), found


def test_a_not_applied_answer_the_ledger_contradicts_is_a_violation() -> None:
    """Told attempt 1 was not applied while the ledger holds it applied."""
    found = violations([told("invoke"), told("fail", status="aborted_not_applied", attempt=1)],
                       state(1, "applied"))
    assert any("told attempt 1 not applied" in v for v in found), found


def test_an_attempt_left_in_progress_is_a_violation() -> None:
    """Settling must leave nothing in_progress."""
    found = violations([told("invoke"), told("info", status="lost")], state(0, "in_progress"))
    assert any("left in_progress" in v for v in found), found


def test_an_unresolved_indeterminate_is_a_violation_unless_open_with_a_reason() -> None:
    """Indeterminate after settling: a violation, or counted open when a reason is given."""
    history = [told("invoke"), told("info", status="indeterminate")]
    assert any("left indeterminate" in v for v in violations(history,
                                                               state(0, "indeterminate")))
    open_ = check(history, state(0, "indeterminate", error={"code": "target_unavailable"}),
                  allow_open=True)
    assert open_[0] == [] and open_[1]["indeterminate_open_with_reason"] == 1


@pytest.mark.parametrize("reported", [0, 2])
def test_a_settled_attempt_needs_exactly_one_logbook_entry(reported: int) -> None:
    """A missing or a doubled execution.applied entry is a violation."""
    found = violations([told("invoke"), told("ok", status="applied")],
                       state(1, "applied", reported=reported))
    assert any(f"{reported} execution.applied logbook entries" in v for v in found), found


def test_a_broken_logbook_and_an_undrained_outbox_are_violations() -> None:
    """The logbook must verify and the outbox must be drained."""
    found = violations([told("invoke"), told("ok", status="applied")],
                       state(1, "applied", unacked=1, broken="seq 3: hash"))
    assert any("does not verify" in v for v in found) and any("never acknowledged" in v
                                                               for v in found), found


def test_a_real_double_apply_is_caught_from_the_files(tmp_path: Path) -> None:
    """Through a real `pilot serve`: clean, then a second effect row slipped into the target
    (what a double apply would leave) is reported from the target itself."""
    world = SoakWorld(tmp_path / "world")
    history = History(tmp_path / "history.jsonl")
    ctx = RunContext("checker", 1, 0, tmp_path, history)
    pilot = PilotProcess(world)
    try:
        op = world.op("op-real")
        assert invoke(ctx, world, pilot.url, op, "n-1").type == "ok"
    finally:
        pilot.stop()
    history.close()
    events = History.read(history.path)
    assert violations(events, final_state(world, settle(world))) == []
    conn = sqlite3.connect(world.target_dsn.removeprefix("sqlite:///"))
    with conn:
        conn.execute("INSERT INTO effects (op, at) VALUES ('op-real', 0)")
    conn.close()
    found = violations(events, final_state(world))
    assert any("op-real: 2 effect rows" in v for v in found), found
