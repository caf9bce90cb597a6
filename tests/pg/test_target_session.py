"""A marque's change cannot leave its session state to the next one (PostgreSQL target).

The Pilot keeps its target connections in a pool. Approved SQL can change its session
in ways that outlive its transaction: ``set_config(…, false)`` (read-only as the
default, a search path, a role), a session advisory lock (which not even a ROLLBACK
releases), a temporary table. Each connection is reset (``DISCARD ALL``) on its way back
to the pool, so the next marque's change runs in a session as the Pilot began it — with
the Pilot's own timeouts still in force — and no lock outlives the change that took it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from marque.pgpool import session_options
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
