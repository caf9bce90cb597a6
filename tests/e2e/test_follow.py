"""Two processes, one nonce: a second `marque exec` (or `outcome`) while the first is running.

The first process claims the nonce and then waits for the target's write lock,
which this test holds with plain :mod:`sqlite3` — so it is deterministically
mid-execution (claimed, lease held, target not yet written) for as long as the
test wants, with no timing guesses. Only the ledger and the target are shared.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading

from e2e_support import EXIT, MARQUE, TIMEOUT, World, cli_env

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def test_a_second_process_follows_an_in_progress_nonce_and_never_runs_it(world: World) -> None:
    """While one exec holds a nonce, another process's exec/outcome see in_progress, run nothing."""
    config_path = world.home / "pilot.json"
    config = json.loads(config_path.read_text())
    config["settings"]["lock_timeout_ms"] = 120_000  # the first exec waits for our lock
    config_path.write_text(json.dumps(config))
    marque = world.issue([DEBIT], executions=2, max_rows=1)
    marque_id = world.marque_id(marque)
    # A Pilot's first start on the bank makes its stamp table (and identity) under the
    # write lock; that happens before "someone else" takes it.
    assert world.reconcile().returncode == 0

    bank = sqlite3.connect(world.bank, isolation_level=None)
    bank.execute("BEGIN IMMEDIATE")  # the target's write lock, held by "someone else"
    first = subprocess.Popen(
        [str(MARQUE), *map(str, world.exec_args(marque, "n-1"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=cli_env(), cwd=world.root,
    )
    watchdog = threading.Timer(4 * TIMEOUT, first.kill)
    watchdog.start()
    try:
        assert first.stderr is not None
        claimed = json.loads(first.stderr.readline())
        assert (claimed["event"], claimed["attempt"]) == ("claimed", 1), claimed

        follower = world.exec(marque, "n-1")
        assert follower.returncode == EXIT["in_progress"], follower
        body = follower.json
        assert (body["status"], body["attempt"], body["replayed"]) == ("in_progress", 1, True)
        assert not {"claimed", "fence_checked", "statement_started"} & set(follower.kinds())

        shown = world.outcome(marque_id, "n-1")
        assert shown.returncode == EXIT["in_progress"], shown
        assert (shown.json["status"], shown.json["attempt"]) == ("in_progress", 1)

        # One claim, one attempt, one decrement: the follower started nothing of its own.
        assert world.ledger_count("claims") == 1
        assert world.ledger_count("attempts") == 1
        [(left,)] = world.ledger_rows(
            "SELECT executions_left FROM budgets WHERE marque_id = ?", (marque_id,))
        assert left == 1
        assert first.poll() is None, "the first exec must still be waiting for the target"
    finally:
        bank.execute("ROLLBACK")
        bank.close()
        watchdog.cancel()

    out, _ = first.communicate(timeout=TIMEOUT)
    assert first.returncode == EXIT["applied"], out
    done = json.loads(out)
    assert (done["status"], done["attempt"], done["replayed"]) == ("applied", 1, False)

    again = world.exec(marque, "n-1")
    assert again.returncode == EXIT["applied"], again
    assert (again.json["attempt"], again.json["replayed"]) == (1, True)
    assert "statement_started" not in again.kinds()
    assert world.balances() == {1: 90, 2: 100}
    assert [(s["nonce"], s["kind"], s["attempt"]) for s in world.stamps()] == [
        ("n-1", "applied", 1)]
    assert world.ledger_count("attempts") == 1
