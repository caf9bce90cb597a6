"""Reconcilers racing: only evidence about an attempt settles that attempt, once.

Issue 8 asked to look for the shape of its soak finding (evidence about the
nonce read as evidence about this attempt; a snapshot acted on unchecked)
beyond the paused reconciler of ``tests/e2e/test_verdicts.py``: a reconciler
racing a live owner, and a fence conflict after a ledger restore.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from support.wait import wait_until

from marque.outcome import Status
from marque.pilot import open_pilot

from .conftest import Env, marque_id_of

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
DEBIT_ALL = "UPDATE accounts SET balance = balance - 1"


def _statuses(env: Env, marque_id: str, nonce: str) -> dict[int, Status]:
    return {a.attempt: a.status for a in env.pilot.ledger.attempts(marque_id, nonce)}


def test_reconciler_racing_a_live_owner_settles_applied_once(env: Env) -> None:
    """A reconciler that thinks the lease ran out waits on the live owner's lock; one applied."""
    token = env.issue([DEBIT])
    marque_id = marque_id_of(token)
    inside, release = threading.Event(), threading.Event()

    def hold_inside_the_transaction(event: dict[str, Any]) -> None:
        if event["event"] == "statement_finished":
            inside.set()
            assert release.wait(10)

    outcome: dict[str, Any] = {}
    owner = threading.Thread(target=lambda: outcome.setdefault("o", env.pilot.execute(
        token, env.proof(token, "n1"), "n1", on_event=hold_inside_the_transaction)))
    owner.start()
    assert inside.wait(10)

    # A second Pilot process run whose clock says the owner's lease expired long ago.
    rival = open_pilot(env.home, recover=False)
    rival.clock = lambda: time.time() + 10_000
    changes: list[dict[str, Any]] = []
    reconciler = threading.Thread(target=lambda: changes.extend(rival.recover()))
    try:
        reconciler.start()
        wait_until(lambda: _statuses(env, marque_id, "n1") == {1: Status.INDETERMINATE},
                   "the rival to settle the live attempt indeterminate", timeout=10.0, step=0.01)
        time.sleep(0.2)  # the rival now waits for the target's write lock
        release.set()
        owner.join(15)
        reconciler.join(15)
    finally:
        release.set()
        rival.close()

    assert outcome["o"].status == "applied" and outcome["o"].attempt == 1
    assert _statuses(env, marque_id, "n1") == {1: Status.APPLIED}
    assert [(c["attempt"], c["to"]) for c in changes] == [(1, "applied")]
    assert env.balances()[1] == 90
    env.pilot.report()
    applied = [e for e in env.pilot.logbook.entries("execution.applied")
               if e["body"]["marque_id"] == marque_id]
    assert len(applied) == 1


def test_fence_conflict_with_another_attempts_stamp_is_not_this_attempts_apply(env: Env) -> None:
    """After a ledger restore, attempt 2 meeting attempt 1's applied stamp is not applied."""
    token = env.issue([DEBIT_ALL], max_rows=1, attempts=3)
    marque_id = marque_id_of(token)
    first = env.run(token, "n1")  # three rows > max_rows 1: rolled back
    assert (first.status, first.error["code"]) == ("aborted_not_applied", "max_rows_exceeded")

    # The target says attempt 1 applied: the ledger that ran it was replaced by an older copy.
    env.plant_stamp(marque_id, "n1", kind="applied", attempt=1, rows_affected=1)
    second = env.run(token, "n1")

    assert (second.status, second.attempt) == ("aborted_not_applied", 2)
    assert "attempt 1" in second.error["message"]
    assert _statuses(env, marque_id, "n1") == {1: Status.ABORTED_NOT_APPLIED,
                                               2: Status.ABORTED_NOT_APPLIED}
    assert env.balances() == {1: 100, 2: 100, 3: 100}
    [finding] = env.pilot.logbook.entries("finding.stamp_contradicts_ledger")
    assert finding["body"]["stamp"]["attempt"] == 1
    assert finding["body"]["ledger_status"] == "aborted_not_applied"
