"""The SQLite target's own defences, below the Pilot's validation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from marque.errors import StatementError, TargetUnavailable
from marque.target.base import TargetAttempt
from marque.target.sqlite import SqliteTarget
from marque.token import Change, Statement


def _bank(tmp_path: Path) -> Path:
    path = tmp_path / "bank.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
    conn.close()
    return path


def _smuggled(sql: str) -> Change:
    """A Change whose statement skipped validation (as a bug elsewhere might let through)."""
    statement = Statement("SELECT 1")
    object.__setattr__(statement, "sql", sql)
    return Change((statement, Statement("UPDATE accounts SET balance = balance - 10")))


@pytest.mark.parametrize("sql", ["COMMIT", "ROLLBACK", "SAVEPOINT s1", "PRAGMA foreign_keys = OFF",
                                 "ATTACH DATABASE ':memory:' AS other"])
def test_authorizer_stops_transaction_control(tmp_path: Path, sql: str) -> None:
    """Even unvalidated transaction control is denied before it runs: nothing applies, no stamp."""
    path = _bank(tmp_path)
    target = SqliteTarget("bank", str(path))
    run = TargetAttempt("mq_x", "n-1", 1, "p1", "inc_1", _smuggled(sql), max_rows=1,
              statement_timeout_ms=5_000)

    with pytest.raises(StatementError):
        target.execute(run, lambda *a, **k: None)

    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT balance FROM accounts ORDER BY id").fetchall() == [
            (100,), (100,)]
        # The stamp table is created inside the rolled-back transaction, so it may not exist.
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "marque_stamps" in tables:
            assert conn.execute("SELECT COUNT(*) FROM marque_stamps").fetchone() == (0,)
    conn.close()


def test_missing_target_file_is_not_created(tmp_path: Path) -> None:
    """A target path that does not exist is target_unavailable, never a new empty database."""
    target = SqliteTarget("bank", str(tmp_path / "nope.db"))
    run = TargetAttempt("mq_x", "n-1", 1, "p1", "inc_1", Change((Statement("SELECT 1"),)),
                        max_rows=1, statement_timeout_ms=5_000)
    with pytest.raises(TargetUnavailable) as raised:
        target.execute(run, lambda *a, **k: None)
    assert raised.value.detail["sqlite_errorname"] == "SQLITE_CANTOPEN"
    assert str(tmp_path / "nope.db") in raised.value.message
    assert not (tmp_path / "nope.db").exists()
