"""A marque's change cannot leave its session state to the next one (PostgreSQL target).

The Pilot keeps its target connections in a pool. Approved SQL can change its session
in ways that outlive its transaction: ``set_config(…, false)`` (read-only as the
default, a search path, a role), a session advisory lock (which not even a ROLLBACK
releases), a temporary table. Each connection is reset (``DISCARD ALL``) on its way back
to the pool, so the next marque's change runs in a session as the Pilot began it — with
the Pilot's own timeouts still in force — and no lock outlives the change that took it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from marque.storage.pgpool import session_options
from marque.target.base import TargetAttempt
from marque.target.postgres import PostgresTarget
from marque.token import Change, Statement

from .pgworld import World, build_world

LOCK_KEY = 424242

#: A write that changes its session in every way that would bind a later change.
POISON = [
    "UPDATE accounts SET balance = balance + 1 WHERE id = 3",
    "SELECT set_config('default_transaction_read_only', 'on', false)",
    "SELECT set_config('search_path', 'marque_nowhere', false)",
    f"SELECT pg_advisory_lock({LOCK_KEY})",
]


@pytest.fixture
def world(tmp_path: Path, pg_dsn: str) -> Iterator[World]:
    made = build_world(tmp_path, pg_dsn)
    try:
        yield made
    finally:
        made.close()


def _lock_is_free(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
        taken = bool(row and row[0])
        if taken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
        return taken


def test_a_committed_change_leaves_no_session_state_for_the_next(world: World) -> None:
    poison = world.issue(*POISON, max_rows=4)
    done = world.execute(poison, "n-poison")
    assert done.status == "applied", done
    assert _lock_is_free(world.target_dsn), "the change's advisory lock outlived it"

    debit = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 1", executions=3)
    for n in range(3):
        outcome = world.execute(debit, f"n-debit-{n}")
        assert outcome.status == "applied", outcome
    assert world.balances() == {1: 97, 2: 100, 3: 101}


def test_the_pilots_timeouts_survive_the_reset(world: World) -> None:
    """``DISCARD ALL`` comes back to the session's start, which carries the Pilot's own
    statement and lock timeouts (and a change that changed them leaves no trace)."""
    lift = world.issue("SELECT set_config('statement_timeout', '0', false)",
                       "SELECT set_config('lock_timeout', '0', false)", max_rows=2)
    assert world.execute(lift, "n-lift").status == "applied"
    target = world.pilot.targets["bank"]
    assert isinstance(target, PostgresTarget)
    read = world.issue("SELECT current_setting('statement_timeout'), "
                       "current_setting('lock_timeout')", executions=2)
    settings = {"statement_timeout": f"{target.statement_timeout_ms}ms",
                "lock_timeout": f"{target.lock_timeout_ms}ms"}
    with psycopg.connect(world.target_dsn, options=session_options(world.target_dsn, settings),
                         autocommit=True) as conn:
        expected = list(conn.execute("SELECT current_setting('statement_timeout'), "
                                     "current_setting('lock_timeout')").fetchone() or ())
    assert "0" not in expected
    for n in range(2):
        outcome = world.execute(read, f"n-read-{n}")
        assert outcome.status == "applied", outcome
        assert outcome.result is not None
        assert outcome.result["rows"] == [expected]


def test_a_rolled_back_preview_releases_its_session_lock(pg_dsn: str) -> None:
    """A rollback preview undoes the change, but not a session advisory lock: the reset
    does, so a preview cannot leave a lock held while its connection idles."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance int)")
    target = PostgresTarget("bank", pg_dsn)
    try:
        [locked] = target.preview(
            Change((Statement(f"SELECT pg_advisory_lock({LOCK_KEY})"),)), mode="rollback",
            sample_rows=1, statement_timeout_ms=5_000)
        assert locked["rows"] == 1
        assert _lock_is_free(pg_dsn), "the preview's advisory lock outlived it"
    finally:
        target.close()


def test_the_dsns_own_options_are_kept(tmp_path: Path, pg_dsn: str) -> None:
    """A DSN that sets its own session options (here a search path) keeps them beside the
    Pilot's timeouts, before and after a reset."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS app")
        conn.execute("CREATE TABLE IF NOT EXISTS app.notes (id int PRIMARY KEY)")
    sep = "&" if "?" in pg_dsn else "?"
    target = PostgresTarget("app", f"{pg_dsn}{sep}options=-c%20search_path%3Dapp")
    try:
        for _ in range(2):  # the second use is after the first one's reset
            [seen] = target.preview(
                Change((Statement("SELECT current_setting('search_path'), "
                                  "current_setting('lock_timeout'), "
                                  "(SELECT count(*) FROM notes)"),)),
                mode="rollback", sample_rows=1, statement_timeout_ms=5_000)
            assert seen["sample"]["rows"] == [["app", "5s", 0]], seen  # the Pilot's 5 s
    finally:
        target.close()


def _attempt(change: Change, nonce: str) -> TargetAttempt:
    return TargetAttempt("mq_session", nonce, 1, "pilot_session", "inc_session", change, 10,
                         30_000, expires_at=time.time() + 600)


@pytest.fixture
def one_connection(pg_dsn: str) -> Iterator[PostgresTarget]:
    """A target whose pool holds one connection, so every attempt shares its session."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100)")
    target = PostgresTarget("bank", pg_dsn, pool_size=1)
    try:
        yield target
    finally:
        target.close()


def test_different_changes_alternate_on_one_connection(one_connection: PostgresTarget) -> None:
    """The connection's cursors carry every kind of change in turn — a write with
    parameters, a read returning rows, SQL with a literal '%' and no parameters, another
    isolation level — each bound and answered as if it were the first."""
    target = one_connection
    write = Change((Statement("UPDATE accounts SET balance = balance - %s WHERE id = %s",
                              (5, 1)),))
    read = Change((Statement("SELECT id, balance FROM accounts ORDER BY id"),))
    percent = Change((Statement("SELECT '50%' AS share, count(*) FROM accounts"),))
    serial = Change((Statement("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                               (7, 2)),), isolation="serializable")
    seen = []
    for n in range(3):
        seen.append(target.execute(_attempt(write, f"w{n}"), lambda *a, **k: None).rows_affected)
        rows = target.execute(_attempt(read, f"r{n}"), lambda *a, **k: None).result
        assert rows == {"columns": ["id", "balance"],
                        "rows": [[1, 100 - 5 * (n + 1)], [2, 100 + 7 * n]]}, rows
        share = target.execute(_attempt(percent, f"p{n}"), lambda *a, **k: None).result
        assert share == {"columns": ["share", "count"], "rows": [["50%", 2]]}, share
        seen.append(target.execute(_attempt(serial, f"s{n}"), lambda *a, **k: None).rows_affected)
    assert seen == [1] * 6
    stamps = target.stamps_of("mq_session")
    assert len(stamps) == 12 and {s["kind"] for s in stamps} == {"applied"}


def test_a_connection_makes_its_cursors_once(
    one_connection: PostgresTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Pilot's own messages (the stamp's, COMMIT's, the session reset) go through
    cursors made with the connection's first attempt, not one per message."""
    made: list[object] = []
    real = psycopg.ClientCursor

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(psycopg, "ClientCursor", Counted)
    write = Change((Statement("UPDATE accounts SET balance = balance + 1 WHERE id = %s",
                              (1,)),))
    for n in range(5):
        target_execute = one_connection.execute(_attempt(write, f"n{n}"), lambda *a, **k: None)
        assert target_execute.rows_affected == 1
    assert len(made) == 3, made


def test_a_connection_the_pool_dropped_takes_its_cursors_along(
    one_connection: PostgresTarget, pg_dsn: str
) -> None:
    """A pooled connection that died is replaced and the attempt is sent again on the new
    one; the dead connection's cursors are forgotten, not kept for ever."""
    target = one_connection
    write = Change((Statement("UPDATE accounts SET balance = balance + 1 WHERE id = %s",
                              (2,)),))
    assert target.execute(_attempt(write, "first"), lambda *a, **k: None).rows_affected == 1
    pids = set()
    for n in range(3):
        with target._connections().connection() as conn:
            pids.add(conn.info.backend_pid)
            pid = conn.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.1)  # the backend is gone before the next attempt is sent
        assert target.execute(_attempt(write, f"n{n}"), lambda *a, **k: None).rows_affected == 1
    assert len(pids) == 3  # each attempt found the last one's connection dead
    live = list(target._cursors.values())
    assert len(live) == 1 and not live[0].conn.closed
