"""Honest answers when the ledger or the target is broken, through the real CLI.

DESIGN §9: a ledger that cannot be used before the claim is exit 7 with a typed
error and nothing claimed; a target that cannot be used before anything was
sent is ``aborted_not_applied`` with ``target_unavailable``, and the same nonce
runs again once it is back. The faults are real files: a ledger overwritten
with garbage, truncated, emptied; a bank file moved away.
"""

from __future__ import annotations

import os
import shutil

import pytest
from e2e_support import EXIT, World

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
UNAVAILABLE = 7


def ledger_path(world: World) -> str:
    return str(world.home / "ledger.sqlite3")


def assert_typed_failure(res, code: str) -> dict:  # type: ignore[no-untyped-def]
    """Exit 7, one JSON object whose error has ``code``, and no Python traceback anywhere."""
    assert res.returncode == UNAVAILABLE, res
    assert res.json["error"]["code"] == code, res.json
    assert "Traceback" not in res.stderr and "Error:" not in res.stderr, res.stderr
    return res.json["error"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "emptied"])
def test_damaged_ledger_file_is_ledger_corrupt_exit_7(world: World, damage: str) -> None:
    """A garbage, truncated or emptied ledger is ledger_corrupt (exit 7) naming the file;
    nothing runs, and the file is left exactly as it was found."""
    marque = world.issue([DEBIT], executions=2)
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]
    path = ledger_path(world)
    for suffix in ("-wal", "-shm"):  # the CLI closed cleanly: the WAL is folded back
        assert not os.path.exists(path + suffix)
    if damage == "garbage":
        with open(path, "wb") as handle:
            handle.write(b"this is not a database, it is a shopping list\n" * 200)
    elif damage == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
    else:
        os.truncate(path, 0)
    with open(path, "rb") as handle:
        before = handle.read()

    res = world.exec(marque, "n-2")

    error = assert_typed_failure(res, "ledger_corrupt")
    assert path in error["message"]
    assert world.balances() == {1: 90, 2: 100}  # only n-1's debit
    with open(path, "rb") as handle:
        assert handle.read() == before, "a damaged ledger must not be written to"
    assert_typed_failure(world.outcome(world.marque_id(marque), "n-1"), "ledger_corrupt")


def test_missing_target_file_is_target_unavailable_and_the_nonce_runs_again(
    world: World,
) -> None:
    """A bank file that is gone is aborted_not_applied / target_unavailable (exit 4) naming
    the path; once it is back, the same nonce applies as attempt 2 with no second budget."""
    marque = world.issue([DEBIT], executions=1)
    aside = world.root / "bank.db.aside"
    shutil.move(world.bank, aside)

    res = world.exec(marque, "n-1")

    assert res.returncode == EXIT["aborted_not_applied"], res
    body = res.json
    assert (body["status"], body["attempt"], body["recorded"]) == (
        "aborted_not_applied", 1, True)
    assert body["error"]["code"] == "target_unavailable"
    assert str(world.bank.resolve()) in body["error"]["message"]
    assert not world.bank.exists(), "a missing target must never be created"
    assert "statement_started" not in res.kinds()

    shutil.move(aside, world.bank)
    again = world.exec(marque, "n-1")

    assert again.returncode == EXIT["applied"], again
    assert (again.json["status"], again.json["attempt"]) == ("applied", 2)
    assert world.balances() == {1: 90, 2: 100}
    [stamp] = world.stamps()
    assert (stamp["attempt"], stamp["kind"]) == (2, "applied")
