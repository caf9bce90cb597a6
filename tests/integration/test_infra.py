"""Storage boundaries on SQLite: typed errors for broken files, and the stamp table's versions.

Real files only: a bank whose stamp table an older Pilot made, or a newer one
upgraded; a bank locked by another connection; a ledger path that is some
other database, or sits in a directory that does not exist.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from marque.errors import InvalidInput, LedgerCorrupt, StatementTimeout, TargetUnavailable
from marque.ledger import create_ledger
from marque.ledger.sqlite import SqliteLedger
from marque.target.base import TargetAttempt
from marque.target.sqlite import SqliteTarget
from marque.target.stamps import SQLITE_MIGRATIONS, VERSION
from marque.token import Change, Statement

from .conftest import Env, make_bank, marque_id_of

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def _bank_rows(env: Env, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(env.bank_path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _attempt(change: Change) -> TargetAttempt:
    return TargetAttempt("mq_x", "n-1", 1, "p1", "inc_1", change, max_rows=1,
                         statement_timeout_ms=5_000)


def _as_before_marque_ran_here(env: Env) -> sqlite3.Connection:
    """Close the Pilot and take the bank back to before any Marque touched it: no stamp
    tables (start-up made them, identity and all) and no binding in the ledger. The caller
    builds an older stamp table on the connection returned."""
    with env.pilot.ledger.transaction() as tx:
        tx.execute("DELETE FROM target_bindings")
    env.pilot.close()
    conn = sqlite3.connect(env.bank_path, isolation_level=None)
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                 "AND name LIKE 'marque%'").fetchall():
        conn.execute(f"DROP TABLE {table}")
    return conn


# -- the stamp table: one definition, versioned ----------------------------------------------


def test_a_new_target_gets_the_current_stamp_table_and_its_version_row(env: Env) -> None:
    """Start-up creates the stamp table at the current version, records it, and gives the
    target its identity, which the ledger binds the name to."""
    assert env.run(env.issue([DEBIT_1]), "n-1").status == "applied"

    [(target_id,)] = _bank_rows(env, "SELECT target_id FROM marque_target_identity")
    assert target_id.startswith("tgt_") and len(target_id) == 36
    binding = env.pilot.ledger.target_binding("bank")
    assert binding is not None and (binding.target_id, binding.location) == (
        target_id, str(env.bank_path))

    assert _bank_rows(env, "SELECT component, version FROM marque_versions") == [
        ("stamps", VERSION)]
    columns = {r[1] for r in _bank_rows(env, "PRAGMA table_info(marque_stamps)")}
    assert "expires_at" in columns
    assert _bank_rows(env, "SELECT name FROM sqlite_master WHERE type = 'index' "
                           "AND name = 'marque_stamps_live'") == [("marque_stamps_live",)]
    assert _bank_rows(env, "SELECT name FROM sqlite_master WHERE type = 'index' "
                           "AND name = 'marque_row_stamps_live'") == [("marque_row_stamps_live",)]


def test_a_version_1_stamp_table_is_upgraded_in_place_and_keeps_its_stamps(env: Env) -> None:
    """A DESIGN §3 stamp table (version 1, no version row) is migrated forward at start-up;
    its existing stamps survive, and fencing works on the upgraded table."""
    conn = _as_before_marque_ran_here(env)
    try:
        for statement in SQLITE_MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO marque_stamps (marque_id, nonce, attempt, kind, pilot_id, "
                     "incarnation, rows_affected, created_at) VALUES "
                     "('mq_old', 'n-old', 1, 'applied', 'pilot-0', 'inc_old', 1, ?)",
                     (time.time(),))
    finally:
        conn.close()

    env.reopen()  # start-up reads the target's stamps, upgrading the table first

    assert _bank_rows(env, "SELECT component, version FROM marque_versions") == [
        ("stamps", VERSION)]
    assert _bank_rows(env, "SELECT marque_id, nonce, kind, expires_at FROM marque_stamps") == [
        ("mq_old", "n-old", "applied", None)]
    token = env.issue([DEBIT_1])
    assert env.run(token, "n-1").status == "applied"
    assert env.run(token, "n-1").replayed
    assert env.balances()[1] == 90
    assert {(s["marque_id"], s["kind"]) for s in env.stamps()} == {
        ("mq_old", "applied"), (marque_id_of(token), "applied")}


def test_a_version_3_stamp_table_gets_the_row_stamps_live_index_and_keeps_its_row_stamps(
    env: Env,
) -> None:
    """A version-3 stamp table (row stamps without their live index) is migrated to the
    current version at start-up: the ``(incarnation, expires_at)`` index exists and the
    row stamps it held survive, read by the continuity query."""
    conn = _as_before_marque_ran_here(env)
    try:
        for statements in SQLITE_MIGRATIONS[:3]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("CREATE TABLE marque_versions (component TEXT PRIMARY KEY, "
                     "version INTEGER NOT NULL)")
        conn.execute("INSERT INTO marque_versions VALUES ('stamps', 3)")
        conn.execute("INSERT INTO marque_row_stamps (effect_apply_key, row_idempotency_key, "
                     "marque_id, nonce, dispatch_attempt, kind, pilot_id, incarnation, "
                     "rows_affected, created_at, expires_at) VALUES "
                     "('k', 'r', 'mq_old', 'n-old', 1, 'applied', 'p0', 'inc_old', 1, ?, ?)",
                     (time.time(), time.time() + 3600))
    finally:
        conn.close()
    live = "SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'marque_row_stamps_live'"
    assert _bank_rows(env, live) == []

    env.reopen()  # start-up reads the target's stamps, upgrading the table first

    assert VERSION == 5
    assert _bank_rows(env, "SELECT component, version FROM marque_versions") == [
        ("stamps", VERSION)]
    assert _bank_rows(env, live) == [("marque_row_stamps_live",)]
    target = env.pilot.targets["bank"]
    assert [(s["marque_id"], s["kind"]) for s in target.live_stamps("inc_old", 0.0).row_stamps] == [
        ("mq_old", "applied")]
    plan = " ".join(str(r[-1]) for r in _bank_rows(
        env, "EXPLAIN QUERY PLAN SELECT * FROM marque_row_stamps "
             "WHERE incarnation = 'x' AND expires_at > 0"))
    assert "marque_row_stamps_live" in plan


def test_a_stamp_table_newer_than_the_pilot_is_refused_before_anything_is_sent(
    env: Env,
) -> None:
    """A stamp table a newer Marque upgraded is target_unavailable: nothing runs, no stamp;
    the same nonce runs as the next attempt once the table is one this Pilot knows."""
    token = env.issue([DEBIT_1], executions=1)
    conn = _as_before_marque_ran_here(env)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statements in SQLITE_MIGRATIONS:
            for statement in statements:
                conn.execute(statement)
        conn.execute("CREATE TABLE marque_versions (component TEXT PRIMARY KEY, "
                     "version INTEGER NOT NULL)")
        conn.execute("INSERT INTO marque_versions VALUES ('stamps', ?)", (VERSION + 1,))
        conn.execute("COMMIT")
    finally:
        conn.close()
    env.reopen()

    outcome = env.run(token, "n-1")

    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None and outcome.error["code"] == "target_unavailable"
    assert f"version {VERSION + 1}" in outcome.error["message"]
    assert env.balances()[1] == 100
    assert env.stamps() == []

    conn = sqlite3.connect(env.bank_path, isolation_level=None)
    conn.execute("UPDATE marque_versions SET version = ?", (VERSION,))
    conn.close()
    env.reopen()
    again = env.run(token, "n-1")
    assert (again.status, again.attempt) == ("applied", 2)
    assert env.balances()[1] == 90


# -- the SQLite target, before anything is sent ----------------------------------------------


def test_a_target_in_a_missing_directory_is_target_unavailable(tmp_path: Path) -> None:
    """A target path whose directory is gone is target_unavailable naming that directory;
    nothing is created."""
    missing = tmp_path / "gone"
    target = SqliteTarget("bank", str(missing / "bank.db"))

    with pytest.raises(TargetUnavailable) as raised:
        target.execute(_attempt(Change((Statement(DEBIT_1),))), lambda *a, **k: None)

    assert f"its directory {missing} does not exist" in raised.value.message
    assert raised.value.detail["sqlite_errorname"] == "SQLITE_CANTOPEN"
    assert not missing.exists()


def test_a_target_locked_by_another_writer_is_a_lock_timeout(tmp_path: Path) -> None:
    """A bank whose write lock another connection holds past lock_timeout_ms is
    statement_timeout (SQLITE_BUSY), not a statement error; nothing is applied."""
    path = tmp_path / "bank.db"
    make_bank(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        target = SqliteTarget("bank", str(path), lock_timeout_ms=100)
        with pytest.raises(StatementTimeout) as raised:
            target.execute(_attempt(Change((Statement(DEBIT_1),))), lambda *a, **k: None)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert raised.value.detail["sqlite_errorname"] == "SQLITE_BUSY"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone() == (100,)
    conn.close()


# -- the SQLite ledger ----------------------------------------------------------------------


def test_opening_a_database_that_is_not_a_ledger_is_ledger_corrupt_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """A ledger path that holds some other SQLite database is ledger_corrupt naming it, and
    the file is left untouched (not switched to WAL, no tables added)."""
    path = tmp_path / "bank.db"
    make_bank(path)
    before = path.read_bytes()

    with pytest.raises(LedgerCorrupt) as raised:
        SqliteLedger.open(str(path))

    assert str(path) in raised.value.message
    assert raised.value.exit_status == 7
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} == {"accounts"}
    finally:
        conn.close()


def test_creating_a_ledger_in_a_missing_directory_is_input_invalid(tmp_path: Path) -> None:
    """``create_ledger`` for a path in a directory that does not exist is input_invalid
    naming the directory, and creates nothing."""
    missing = tmp_path / "no" / "such"

    with pytest.raises(InvalidInput) as raised:
        create_ledger(f"sqlite:///{missing / 'ledger.sqlite3'}", "pilot-1")

    assert str(missing) in raised.value.message
    assert not (tmp_path / "no").exists()
