"""Many concurrent exec calls against one PostgreSQL target, for both ledgers.

One execution per nonce, never more executions than the budget — checked
against the target's own rows and ``marque.stamps``, not only the ledger.
Threads share one Pilot; separate processes (``spawn``) each open their own
Pilot from the same home, so they share only the ledger and the target.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .pgworld import (
    World,
    marque_id_of,
    outcomes_summary,
    process_worker,
    run_outcome,
)

START = {1: 100, 2: 100, 3: 100}
CALLS = 50
PROCESSES = 5


def run_threads(world: World, token: str, nonces: list[str]) -> list[dict[str, Any]]:
    """Run one exec per nonce on its own thread, all released at once, on one Pilot."""
    pilot = world.pilot
    gate = threading.Barrier(len(nonces))

    def one(nonce: str) -> dict[str, Any]:
        gate.wait(timeout=60)
        return run_outcome(pilot, world.holder, token, nonce)

    with ThreadPoolExecutor(max_workers=len(nonces)) as pool:
        return list(pool.map(one, nonces))


def run_processes(world: World, token: str, nonces: list[str]) -> list[dict[str, Any]]:
    """Split ``nonces`` over PROCESSES spawned Pilot processes (threads inside each)."""
    world.close_pilot()  # the workers are the only Pilots while they run
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    share = len(nonces) // PROCESSES
    procs = [
        ctx.Process(
            target=process_worker,
            args=(str(world.home), world.holder, token, nonces[i * share:(i + 1) * share],
                  start, results),
        )
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    try:
        collected = [results.get(timeout=240) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    assert len({pid for pid, _ in collected}) == PROCESSES
    outcomes = [o for _, batch in collected for o in batch]
    assert len(outcomes) == len(nonces)
    assert not [o for o in outcomes if o["status"] == "crashed"], outcomes
    return outcomes


def assert_one_execution(world: World, token: str, nonce: str, account: int) -> None:
    """The target changed once for ``nonce``, with one applied stamp; one ledger attempt."""
    mid = marque_id_of(token)
    assert world.balances() == {**START, account: START[account] - 1}
    stamps = world.stamps(mid)
    assert [(s["nonce"], s["kind"], s["attempt"], s["rows_affected"]) for s in stamps] == [
        (nonce, "applied", 1, 1)]
    ledger = world.pilot.ledger
    attempts = ledger.attempts(mid, nonce)
    assert [(a.attempt, a.status.value) for a in attempts] == [(1, "applied")]
    assert ledger.budget(mid)["executions_left"] == 4


def assert_exactly_ten(world: World, token: str, outcomes: list[dict[str, Any]],
                       account: int) -> None:
    """10 applied, 40 budget_exhausted — and the target agrees: 10 units, 10 stamps."""
    mid = marque_id_of(token)
    assert outcomes_summary(outcomes) == {"applied": 10, "budget_exhausted": 40}
    applied = sorted(o["nonce"] for o in outcomes if o["status"] == "applied")
    assert all(o["attempt"] == 1 and o["rows_affected"] == 1 for o in outcomes
               if o["status"] == "applied")
    assert world.balances() == {**START, account: START[account] - 10}
    stamps = world.stamps(mid)
    assert sorted(s["nonce"] for s in stamps) == applied
    assert {(s["kind"], s["attempt"], s["rows_affected"]) for s in stamps} == {
        ("applied", 1, 1)}
    ledger = world.pilot.ledger
    assert ledger.budget(mid)["executions_left"] == 0
    stats = ledger.stats(0)
    assert (stats["claims"], stats["attempts"]) == (10, 10)
    assert stats["attempts_by_status"]["applied"] == 10


def test_fifty_threads_one_nonce_execute_once(world: World) -> None:
    """50 concurrent calls with one nonce on one Pilot make exactly one execution."""
    token = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 1", executions=5)

    outcomes = run_threads(world, token, ["the-one"] * CALLS)

    assert {(o["status"], o["attempt"], o["rows_affected"]) for o in outcomes} == {
        ("applied", 1, 1)}
    assert sum(not o["replayed"] for o in outcomes) == 1
    assert_one_execution(world, token, "the-one", account=1)


def test_fifty_threads_fifty_nonces_never_exceed_budget(world: World) -> None:
    """50 concurrent nonces on executions=10 apply exactly 10 times, by rows and stamps."""
    token = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 2",
                        executions=10)

    outcomes = run_threads(world, token, [f"n-{i}" for i in range(CALLS)])

    assert_exactly_ten(world, token, outcomes, account=2)


def test_processes_sharing_a_ledger_never_exceed_budget(world: World) -> None:
    """5 Pilot processes × 10 threads, 50 nonces on executions=10: exactly 10 applied."""
    token = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 3",
                        executions=10)

    outcomes = run_processes(world, token, [f"p-{i}" for i in range(CALLS)])

    assert_exactly_ten(world, token, outcomes, account=3)


def test_processes_sharing_a_ledger_execute_one_nonce_once(world: World) -> None:
    """5 Pilot processes × 10 threads calling one nonce make exactly one execution."""
    token = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 1", executions=5)

    outcomes = run_processes(world, token, ["shared"] * CALLS)

    # A process that is not the executor sees the claim in progress (its owner is
    # alive) or, later, the recorded outcome; never a second execution.
    assert {o["status"] for o in outcomes} <= {"applied", "in_progress"}
    assert {o["attempt"] for o in outcomes} == {1}
    assert sum(not o["replayed"] for o in outcomes) == 1
    assert any(o["status"] == "applied" and not o["replayed"] for o in outcomes)
    assert_one_execution(world, token, "shared", account=1)
