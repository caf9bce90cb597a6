"""An attempt settles once: a late reconciler never changes a settled verdict.

Issue 8's kill -9 soak found an attempt proved ``aborted_not_applied`` that a
paused reconciler later turned ``applied``, because it read the applied stamp
of the *next* attempt as evidence about its own. These tests replay that
sequence with real processes, a real write lock on the SQLite target and
SIGSTOP/SIGCONT, and check the ledger, the target and the logbook.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time

from e2e_support import EXIT, MARQUE, TIMEOUT, World, cli_env
from support.wait import wait_until

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def attempt_statuses(world: World, marque_id: str, nonce: str) -> dict[int, str]:
    return dict(world.ledger_rows(
        "SELECT attempt, status FROM attempts WHERE marque_id = ? AND nonce = ? ORDER BY attempt",
        (marque_id, nonce)))


def test_paused_reconciler_cannot_overturn_a_settled_abort(world: World) -> None:
    """Issue 8's sequence: attempt 1 stays aborted_not_applied; only attempt 2 applied."""
    marque = world.issue([DEBIT], executions=1, max_rows=1, attempts=3)
    marque_id = world.marque_id(marque)

    # 1. attempt 1 dies before COMMIT: in_progress, never committed.
    res = world.exec(marque, "n1", env={"MARQUE_CRASH_AT": "before_commit"})
    assert res.returncode == -signal.SIGKILL, res
    assert attempt_statuses(world, marque_id, "n1") == {1: "in_progress"}

    # 2. another connection holds the target's write lock; reconcile settles attempt 1
    #    indeterminate, then waits for the lock to write its tombstone. Pause it there.
    holder = sqlite3.connect(world.bank, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    reconciler = subprocess.Popen(
        [str(MARQUE), "reconcile", "--home", str(world.home), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli_env(), cwd=world.root,
    )
    try:
        wait_until(lambda: attempt_statuses(world, marque_id, "n1") == {1: "indeterminate"},
                   "the reconciler to settle attempt 1 indeterminate", timeout=15.0, step=0.02)
        time.sleep(0.3)  # into the target's busy wait
        reconciler.send_signal(signal.SIGSTOP)
        holder.execute("ROLLBACK")
        holder.close()

        # 3. exec again: start-up recovery tombstones attempt 1, attempt 2 applies.
        again = world.exec(marque, "n1")
        assert again.returncode == EXIT["applied"], again
        assert (again.json["status"], again.json["attempt"]) == ("applied", 2)
        assert attempt_statuses(world, marque_id, "n1") == {
            1: "aborted_not_applied", 2: "applied"}
    finally:
        # 4. the paused reconciler resumes and meets attempt 2's applied stamp.
        reconciler.send_signal(signal.SIGCONT)
        out, err = reconciler.communicate(timeout=TIMEOUT)

    assert reconciler.returncode == 0, (out, err)
    report = json.loads(out)
    for change in report["changed"]:
        if change["attempt"] == 1:
            assert change["to"] != "applied", report
    assert attempt_statuses(world, marque_id, "n1") == {1: "aborted_not_applied", 2: "applied"}
    assert world.balances()[1] == 90  # the change is on the target once
    [stamp] = [s for s in world.stamps() if s["marque_id"] == marque_id]
    assert (stamp["attempt"], stamp["kind"]) == (2, "applied")

    # The logbook tells an auditor one story: attempt 1 not applied, attempt 2 applied.
    outcomes = [(e["kind"], e["body"]["attempt"])
                for kind in ("execution.aborted_not_applied", "execution.applied")
                for e in world.logbook(kind) if e["body"]["marque_id"] == marque_id]
    assert sorted(outcomes) == [("execution.aborted_not_applied", 1), ("execution.applied", 2)]
    late = [e["body"] for e in world.logbook("execution.reconciliation")
            if e["body"]["attempt"] == 1 and e["body"]["stamp"]
            and e["body"]["stamp"]["attempt"] == 2]
    assert late and all(body["status"] == "aborted_not_applied" for body in late), late


def test_two_reconcilers_settle_one_attempt_once(world: World) -> None:
    """Two reconcile processes at once over a dead owner: one verdict, one report."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    marque_id = world.marque_id(marque)
    res = world.exec(marque, "n1", env={"MARQUE_CRASH_AT": "after_commit"})
    assert res.returncode == -signal.SIGKILL, res

    procs = [subprocess.Popen(
        [str(MARQUE), "reconcile", "--home", str(world.home), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli_env(), cwd=world.root) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, (out, err)
    assert attempt_statuses(world, marque_id, "n1") == {1: "applied"}
    applied = [e for e in world.logbook("execution.applied")
               if e["body"]["marque_id"] == marque_id]
    assert len(applied) == 1
    assert world.balances()[1] == 90
