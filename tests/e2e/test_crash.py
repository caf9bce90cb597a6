"""Real faults, no mocks: a Pilot killed mid-statement or at a named crash point.

A crash point (``MARQUE_CRASH_AT``) makes the exec process SIGKILL itself; the
mid-statement case is a SIGKILL from this test while SQLite is busy. Afterwards
only evidence may settle the nonce: the dead owner's released ``flock`` and
the target's stamp table.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

from e2e_support import EXIT, MARQUE, TIMEOUT, World, cli_env

from marque.target.stamps import SQLITE_MIGRATIONS

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
# One row, but the scalar subquery counts 300 million recursive rows first: many seconds.
SLOW = (
    "UPDATE accounts SET balance = balance + (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x+1 FROM c WHERE x < 300000000) SELECT count(*) - count(*) FROM c) WHERE id = 1"
)


def executions_left(world: World, marque_id: str) -> int:
    [(left,)] = world.ledger_rows("SELECT executions_left FROM budgets WHERE marque_id = ?",
                                  (marque_id,))
    return left


def stamp_of(world: World, marque_id: str, nonce: str) -> dict[str, Any]:
    [stamp] = [s for s in world.stamps() if (s["marque_id"], s["nonce"]) == (marque_id, nonce)]
    return stamp


def reconciliations(world: World, marque_id: str, nonce: str) -> list[dict[str, Any]]:
    return [e["body"] for e in world.logbook("execution.reconciliation")
            if (e["body"]["marque_id"], e["body"]["nonce"]) == (marque_id, nonce)]


def crash_exec(world: World, marque, nonce: str, point: str) -> list[str]:
    """Run exec with MARQUE_CRASH_AT=point; it must die by SIGKILL. Returns its event kinds."""
    res = world.exec(marque, nonce, env={"MARQUE_CRASH_AT": point})
    assert res.returncode == -signal.SIGKILL, res
    assert res.stdout == ""  # it died before it could print an outcome
    return res.kinds()


def assert_in_progress(world: World, marque_id: str, nonce: str) -> None:
    res = world.outcome(marque_id, nonce)
    assert res.returncode == EXIT["in_progress"], res
    body = res.json
    assert (body["status"], body["attempt"], body["replayed"]) == ("in_progress", 1, True)


def the_change(reconciled: dict[str, Any], marque_id: str, nonce: str) -> dict[str, Any]:
    mine = [c for c in reconciled["changed"]
            if (c["marque_id"], c["nonce"]) == (marque_id, nonce)]
    assert len(mine) == 1, reconciled
    return mine[0]


def test_kill_9_mid_statement(world: World) -> None:
    """SIGKILL mid-statement: in_progress until the dead flock lets reconcile tombstone it."""
    marque = world.issue([SLOW], executions=1, max_rows=1)
    marque_id = world.marque_id(marque)
    proc = subprocess.Popen(
        [str(MARQUE), *map(str, world.exec_args(marque, "slow-1"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=cli_env(), cwd=world.root,
    )
    watchdog = threading.Timer(TIMEOUT, proc.kill)
    watchdog.start()
    try:
        seen: list[str] = []
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(json.loads(line)["event"])
            if seen[-1] == "statement_started":
                break
        assert seen == ["claimed", "fence_checked", "statement_started"], seen

        # While the owner lives (its flock held), nobody may settle or re-run the nonce.
        live = world.reconcile()
        assert live.returncode == 0, live
        assert live.json["changed"] == []
        assert [(u["nonce"], u["status"]) for u in live.json["still_unsettled"]] == [
            ("slow-1", "in_progress")]
        follower = world.exec(marque, "slow-1")
        assert follower.returncode == EXIT["in_progress"], follower
        assert follower.json["replayed"] is True
        assert proc.poll() is None, "the slow statement finished too early for this test"

        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]

    # The nonce is still claimed; nothing changed on the target.
    assert_in_progress(world, marque_id, "slow-1")
    assert world.balances() == {1: 100, 2: 100}

    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    change = the_change(reconciled.json, marque_id, "slow-1")
    assert (change["attempt"], change["from"], change["to"]) == (
        1, "in_progress", "aborted_not_applied")
    assert reconciled.json["still_unsettled"] == []

    res = world.outcome(marque_id, "slow-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    assert (res.json["status"], res.json["attempt"]) == ("aborted_not_applied", 1)
    assert res.json["error"] is not None

    stamp = stamp_of(world, marque_id, "slow-1")
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)
    [log] = reconciliations(world, marque_id, "slow-1")
    assert log["status"] == "aborted_not_applied"

    assert world.balances() == {1: 100, 2: 100}  # not re-run
    stats = world.stats()
    assert stats["attempts"] == 1
    assert stats["attempts_by_status"]["aborted_not_applied"] == 1

    # The killed attempt spent the budget: a new nonce is refused.
    other = world.exec(marque, "slow-2")
    assert other.returncode == EXIT["refused"], other
    assert other.json["error"]["code"] == "budget_exhausted"
    assert executions_left(world, marque_id) == 0


def test_crash_after_commit(world: World) -> None:
    """Crash after COMMIT: reconcile settles applied by stamp; the nonce replays, once."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    marque_id = world.marque_id(marque)
    kinds = crash_exec(world, marque, "n-1", "after_commit")
    assert kinds[-1] == "committed" and "outcome_recorded" not in kinds, kinds
    assert world.balances() == {1: 90, 2: 100}
    assert_in_progress(world, marque_id, "n-1")

    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    change = the_change(reconciled.json, marque_id, "n-1")
    assert (change["from"], change["to"]) == ("in_progress", "applied")
    stamp = stamp_of(world, marque_id, "n-1")
    assert (stamp["kind"], stamp["attempt"], stamp["rows_affected"]) == ("applied", 1, 1)
    [log] = reconciliations(world, marque_id, "n-1")
    assert log["status"] == "applied"

    settled = world.outcome(marque_id, "n-1")
    assert settled.returncode == 0, settled
    assert (settled.json["status"], settled.json["rows_affected"]) == ("applied", 1)

    again = world.exec(marque, "n-1")
    assert again.returncode == 0, again
    assert (again.json["status"], again.json["replayed"], again.json["attempt"]) == (
        "applied", True, 1)
    assert "statement_started" not in again.kinds()
    assert world.balances() == {1: 90, 2: 100}
    assert world.ledger_count("attempts") == 1


def test_crash_after_commit_recovered_by_next_exec(world: World) -> None:
    """The next exec's start-up recovery settles a crash after COMMIT; no re-run."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    crash_exec(world, marque, "n-1", "after_commit")
    again = world.exec(marque, "n-1")
    assert again.returncode == 0, again
    assert (again.json["status"], again.json["replayed"]) == ("applied", True)
    assert world.balances() == {1: 90, 2: 100}
    assert stamp_of(world, world.marque_id(marque), "n-1")["kind"] == "applied"


def test_crash_after_claim(world: World) -> None:
    """Crash after claim: tombstoned, then attempt 2 applies once without a new decrement."""
    marque = world.issue([DEBIT], executions=1, max_rows=1, attempts=3)
    marque_id = world.marque_id(marque)
    assert crash_exec(world, marque, "n-1", "after_claim") == ["claimed"]
    assert world.balances() == {1: 100, 2: 100}
    assert world.stamps() == []
    assert executions_left(world, marque_id) == 0  # the claim spent the one execution
    assert_in_progress(world, marque_id, "n-1")

    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    change = the_change(reconciled.json, marque_id, "n-1")
    assert (change["from"], change["to"]) == ("in_progress", "aborted_not_applied")
    stamp = stamp_of(world, marque_id, "n-1")
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)
    aborted = world.outcome(marque_id, "n-1")
    assert aborted.returncode == EXIT["aborted_not_applied"], aborted

    retry = world.exec(marque, "n-1")
    assert retry.returncode == 0, retry
    body = retry.json
    assert (body["status"], body["attempt"], body["replayed"], body["rows_affected"]) == (
        "applied", 2, False, 1)
    assert world.balances() == {1: 90, 2: 100}
    stamp = stamp_of(world, marque_id, "n-1")
    assert (stamp["kind"], stamp["attempt"]) == ("applied", 2)
    assert executions_left(world, marque_id) == 0  # no second decrement
    stats = world.stats()
    assert (stats["claims"], stats["attempts"]) == (1, 2)
    assert stats["attempts_by_status"]["applied"] == 1
    assert stats["attempts_by_status"]["aborted_not_applied"] == 1

    # And attempt 2 is now the nonce's settled outcome: a retry replays it.
    again = world.exec(marque, "n-1")
    assert (again.returncode, again.json["attempt"], again.json["replayed"]) == (0, 2, True)
    assert world.balances() == {1: 90, 2: 100}


def test_crash_before_commit(world: World) -> None:
    """Crash before COMMIT: rolled back; reconcile tombstones it as aborted_not_applied."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    marque_id = world.marque_id(marque)
    kinds = crash_exec(world, marque, "n-1", "before_commit")
    assert kinds[-1] == "asserted" and "committed" not in kinds, kinds
    assert world.balances() == {1: 100, 2: 100}
    assert_in_progress(world, marque_id, "n-1")

    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    change = the_change(reconciled.json, marque_id, "n-1")
    assert (change["from"], change["to"]) == ("in_progress", "aborted_not_applied")
    res = world.outcome(marque_id, "n-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    stamp = stamp_of(world, marque_id, "n-1")
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)
    assert world.balances() == {1: 100, 2: 100}
    assert len(reconciliations(world, marque_id, "n-1")) == 1


def test_statement_timeout_aborts(world: World) -> None:
    """A statement past the statement timeout is interrupted: exit 4, nothing changed."""
    config_path = world.home / "pilot.json"
    config = json.loads(config_path.read_text())
    config["settings"]["statement_timeout_ms"] = 300
    config_path.write_text(json.dumps(config))
    marque = world.issue([SLOW], executions=1, max_rows=1)
    res = world.exec(marque, "slow-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    assert res.json["status"] == "aborted_not_applied"
    assert res.json["error"]["code"] == "statement_timeout"
    assert "committed" not in res.kinds()
    assert world.balances() == {1: 100, 2: 100}
    assert world.stamps() == []


# -- a ledger restored from an old copy (DESIGN §5) ---------------------------------------


def restore_old_ledger(world: World) -> Path:
    """Run one marque (executions=1) on nonce n-1, then put back the ledger from before it."""
    ledger = world.home / "ledger.sqlite3"
    assert not Path(f"{ledger}-wal").exists()  # every CLI run closed the ledger cleanly
    backup = world.root / "ledger.backup"
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    shutil.copyfile(ledger, backup)
    assert world.exec(marque, "n-1").returncode == 0
    assert world.balances() == {1: 90, 2: 100}
    for suffix in ("-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, ledger)
    return marque


def test_restored_ledger_never_reapplies_a_nonce(world: World) -> None:
    """With the ledger restored from an old copy, re-running the applied nonce is refused."""
    marque = restore_old_ledger(world)
    res = world.exec(marque, "n-1")
    # exec's start-up check finds the target's stamp of n-1, which the restored ledger
    # does not know, and rotates the incarnation before the marque is even verified.
    assert res.returncode == EXIT["refused"], res
    assert res.json["status"] == "refused"
    assert res.json["error"]["code"] == "wrong_incarnation"
    assert res.json["pilot"]["incarnation"] != world.incarnation
    assert "claimed" not in res.kinds() and "statement_started" not in res.kinds()
    assert world.balances() == {1: 90, 2: 100}
    assert stamp_of(world, world.marque_id(marque), "n-1")["kind"] == "applied"
    assert world.ledger_count("claims") == 0  # the restored ledger claimed nothing since


def test_restored_ledger_rotates_incarnation(world: World) -> None:
    """A ledger restored from an old copy rotates the incarnation; no double spend."""
    marque = restore_old_ledger(world)
    res = world.exec(marque, "n-2")
    assert world.balances() == {1: 90, 2: 100}, "an executions=1 marque applied twice"
    assert res.returncode == EXIT["refused"], res
    assert res.json["error"]["code"] == "wrong_incarnation"
    stats = world.stats()
    assert stats["incarnation"] != world.incarnation
    assert res.json["pilot"]["incarnation"] == stats["incarnation"]
    conn = sqlite3.connect(world.home / "logbook.sqlite3")
    try:
        findings = conn.execute("SELECT kind FROM logbook WHERE kind LIKE 'finding.%'").fetchall()
    finally:
        conn.close()
    assert findings, "the rotation must be recorded as a finding in the logbook"


# -- a target whose stamp table predates this Pilot -----------------------------------------

# Exactly the stamp row of DESIGN §3 — and the table the Pilot itself created up to 77c21b3:
# version 1 of the stamp table, as its one definition spells it (with no version row).
[DESIGN_STAMP_TABLE] = SQLITE_MIGRATIONS[0]


def test_existing_design_stamp_table_still_works(world: World) -> None:
    """A target's pre-existing DESIGN §3 stamp table still executes and reconciles."""
    conn = sqlite3.connect(world.bank)
    with conn:
        conn.execute(DESIGN_STAMP_TABLE)
    conn.close()

    marque = world.issue([DEBIT], executions=2, max_rows=1)
    res = world.exec(marque, "n-1")
    assert res.returncode == 0, res
    assert world.balances() == {1: 90, 2: 100}

    crash_exec(world, marque, "n-2", "after_claim")
    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    change = the_change(reconciled.json, world.marque_id(marque), "n-2")
    assert change["to"] == "aborted_not_applied", reconciled.json
