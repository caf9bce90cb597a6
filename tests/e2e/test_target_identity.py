"""A target name re-pointed at another database while an attempt there is unsettled.

The CLI end to end: ``marque exec`` dies right after the target's COMMIT (the
bank holds the change and its applied stamp; the ledger says ``in_progress``),
then ``pilot target add`` points ``bank`` at another database. Without the
target's identity, reconciliation would find no stamp in the new database,
tombstone the nonce there and let it run again: applied twice. With it:

* nothing is claimed or sent on the re-pointed name (``target_replaced``);
* reconciliation writes no tombstone in the new database and the attempt stays
  indeterminate (never turned into "not applied");
* ``pilot target rebind`` refuses while the attempt is unsettled
  (``target_unsettled``), or with ``--pin-unsettled`` leaves it bound to the
  database it was sent to;
* pointed back at the bank, reconciliation settles it ``applied`` from its stamp,
  and the change was made once.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import httpx
from e2e_support import EXIT, Service, World
from test_crash import crash_exec
from test_pilot_service import body

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def _other_bank(world: World) -> Path:
    """Another database with the same table and balances (never touched by Marque)."""
    other = world.root / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
    conn.close()
    return other


def _point(world: World, path: Path) -> None:
    res = world.run("pilot", "target", "add", "--home", world.home, "bank",
                    f"sqlite:///{path}", "--json")
    assert res.returncode == 0, res


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _stamps(path: Path) -> list[tuple[object, ...]]:
    if not _rows(path, "SELECT 1 FROM sqlite_master WHERE name = 'marque_stamps'"):
        return []
    return _rows(path, "SELECT marque_id, nonce, attempt, kind FROM marque_stamps")


def _crashed_after_commit(world: World) -> tuple[Path, str]:
    marque = world.issue([DEBIT], executions=2, attempts=3)
    crash_exec(world, marque, "n-1", "after_commit")
    assert world.balances()[1] == 90  # the bank holds the change and its stamp
    return marque, world.marque_id(marque)


def test_a_repointed_target_is_refused_and_reconciliation_writes_no_tombstone_there(
        world: World) -> None:
    """The whole story with the operator pointing the name back."""
    marque, marque_id = _crashed_after_commit(world)
    other = _other_bank(world)
    _point(world, other)

    reconciled = world.reconcile()
    assert reconciled.returncode == 0, reconciled
    assert [(f["target"], f["location"]) for f in reconciled.json["targets_replaced"]] == [
        ("bank", str(other))]
    assert [u["nonce"] for u in reconciled.json["still_unsettled"]] == ["n-1"]
    assert _stamps(other) == []  # no tombstone where the attempt never went
    [(status,)] = world.ledger_rows(
        "SELECT status FROM attempts WHERE marque_id = ? AND nonce = 'n-1'", (marque_id,))
    assert status == "indeterminate"  # unknown stays unknown
    assert "target_replaced" in str(world.logbook("execution.reconciliation")[-1]["body"])

    retried = world.exec(marque, "n-1")
    fresh = world.exec(marque, "n-2")
    for res in (retried, fresh):
        assert res.returncode == EXIT["refused"], res
        assert res.json["status"] == "refused"
        assert res.json["error"]["code"] == "target_replaced"
        assert "marque pilot target rebind bank" in res.json["error"]["message"]
    [finding] = world.logbook("finding.target_replaced")  # once, though three Pilots saw it
    assert finding["body"]["target"] == "bank"
    assert finding["body"]["location"] == str(other)
    [(bank_id,)] = _rows(world.bank, "SELECT target_id FROM marque_target_identity")
    assert finding["body"]["bound_target_id"] == bank_id
    assert finding["body"]["found_target_id"] != bank_id
    assert world.ledger_rows("SELECT nonce, attempt FROM attempts WHERE marque_id = ?",
                             (marque_id,)) == [("n-1", 1)]  # nothing claimed
    assert _rows(other, "SELECT balance FROM accounts WHERE id = 1") == [(100,)]

    refused = world.run("pilot", "target", "rebind", "--home", world.home, "bank", "--json")
    assert refused.returncode == EXIT["usage"], refused
    assert refused.json["error"]["code"] == "target_unsettled"
    assert refused.json["unsettled"] == [
        {"marque_id": marque_id, "nonce": "n-1", "attempt": 1}]
    # The error object carries its detail too, as every --json failure does.
    assert refused.json["error"]["detail"]["unsettled"] == refused.json["unsettled"]

    _point(world, world.bank)
    settled = world.reconcile()
    assert settled.returncode == 0, settled
    again = world.exec(marque, "n-1")
    assert again.returncode == EXIT["applied"], again
    assert (again.json["status"], again.json["attempt"], again.json["replayed"]) == (
        "applied", 1, True)
    assert world.balances()[1] == 90  # once
    assert _stamps(world.bank) == [(marque_id, "n-1", 1, "applied")]


def test_a_rebinding_with_pins_serves_the_new_database_and_keeps_the_old_attempt_unknown(
        world: World) -> None:
    """`rebind --pin-unsettled`: new executions run on the new database; the pinned attempt
    is never tombstoned there, and settles `applied` once the name points back (and is
    rebound) at the database it was sent to."""
    marque, marque_id = _crashed_after_commit(world)
    other = _other_bank(world)
    _point(world, other)

    rebound = world.run("pilot", "target", "rebind", "--home", world.home, "bank",
                        "--pin-unsettled", "--json")
    assert rebound.returncode == 0, rebound
    [(bank_id,)] = _rows(world.bank, "SELECT target_id FROM marque_target_identity")
    [(other_id,)] = _rows(other, "SELECT target_id FROM marque_target_identity")
    assert rebound.json == {"target": "bank", "target_id": other_id, "location": str(other),
                            "rebound": True, "rebound_from": bank_id,
                            "pinned": [{"marque_id": marque_id, "nonce": "n-1", "attempt": 1}]}

    assert world.reconcile().returncode == 0
    assert _stamps(other) == []
    retried = world.exec(marque, "n-1")
    assert retried.json["status"] == "indeterminate", retried
    assert "target_replaced" in str(world.logbook("execution.reconciliation")[-1]["body"])
    # Unlike an applied answer, an unknown one asks something of its reader, and says so.
    told = world.run(*[a for a in world.exec_args(marque, "n-1") if a != "--json"])
    assert told.returncode == EXIT["indeterminate"], told
    assert told.stdout.startswith("indeterminate marque "), told
    assert "run `marque reconcile` (never retry with a new nonce)" in told.stdout, told
    fresh = world.exec(marque, "n-2")
    assert fresh.returncode == EXIT["applied"], fresh
    assert _rows(other, "SELECT balance FROM accounts WHERE id = 1") == [(90,)]

    _point(world, world.bank)
    back = world.run("pilot", "target", "rebind", "--home", world.home, "bank", "--json")
    assert back.returncode == 0, back
    assert (back.json["target_id"], back.json["pinned"]) == (bank_id, [])
    assert world.reconcile().returncode == 0
    settled = world.exec(marque, "n-1")
    assert (settled.json["status"], settled.json["attempt"]) == ("applied", 1), settled
    assert world.balances()[1] == 90


def test_a_copy_of_the_database_is_the_same_target(world: World) -> None:
    """A copy carries the identity along (a restored dump, a promoted replica): the name
    pointed at it is served without a rebinding, and a stamp found there settles."""
    marque, marque_id = _crashed_after_commit(world)
    copy = world.root / "copy.db"
    shutil.copy(world.bank, copy)
    _point(world, copy)

    assert world.reconcile().returncode == 0
    settled = world.exec(marque, "n-1")
    assert (settled.json["status"], settled.json["replayed"]) == ("applied", True), settled
    assert world.logbook("finding.target_replaced") == []
    fresh = world.exec(marque, "n-2")
    assert fresh.returncode == EXIT["applied"], fresh
    assert _rows(copy, "SELECT balance FROM accounts WHERE id = 1") == [(80,)]


def test_the_service_refuses_a_repointed_target_with_its_problem_and_says_so_in_health(
        world: World) -> None:
    """`pilot serve` over a home whose target name now points at another database: a POST
    is 403 `target_replaced`, nothing claimed or sent; /v1/health marks the target. A
    `pilot target rebind` while it runs is picked up without a restart."""
    assert world.exec(world.issue([DEBIT]), "n-0").returncode == EXIT["applied"]  # bound
    other = _other_bank(world)
    _point(world, other)
    marque = world.issue([DEBIT], executions=2)
    service = Service(world)
    try:
        response = httpx.post(f"{service.url}/v1/executions",
                              json=body(world, marque, "n-1"), timeout=30)
        health = httpx.get(f"{service.url}/v1/health", timeout=30).json()
        assert world.ledger_count("claims") == 1  # n-0's only
        assert _rows(other, "SELECT balance FROM accounts WHERE id = 1") == [(100,)]

        rebound = world.run("pilot", "target", "rebind", "--home", world.home, "bank", "--json")
        assert rebound.returncode == 0 and rebound.json["rebound"] is True, rebound
        deadline = time.monotonic() + 20
        while True:  # the service looks at the binding again at most once a second
            served = httpx.post(f"{service.url}/v1/executions",
                                json=body(world, marque, "n-1"), timeout=30)
            if served.status_code == 200 or time.monotonic() > deadline:
                break
            assert served.json()["code"] == "target_replaced"
            time.sleep(0.2)
        after = httpx.get(f"{service.url}/v1/health", timeout=30).json()
    finally:
        service.stop()

    assert response.status_code == 403
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "target_replaced"
    assert health["targets"] == {"bank": {"reachable": True, "replaced": True}}
    assert served.status_code == 200, served.text
    assert [json.loads(line) for line in served.text.splitlines()][-1]["outcome"]["status"] \
        == "applied"
    assert after["targets"] == {"bank": {"reachable": True, "replaced": False}}
    assert _rows(other, "SELECT balance FROM accounts WHERE id = 1") == [(90,)]
    assert world.balances()[1] == 90  # n-0's, in the old bank
