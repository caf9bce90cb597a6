"""Reads enforced by the database, on a PostgreSQL target (DESIGN §11.3).

A change issued with ``"access": "read_only"`` runs its guards and statements
under a savepoint taken right after the stamp insert, followed by ``SET
TRANSACTION READ ONLY``: a write fails wherever it hides — in a function, a
``nextval``, a data-modifying CTE, ``SELECT … INTO``, ``FOR UPDATE``, ``COPY``
— as a ``statement_error`` (SQLSTATE 25006), rolled back, stamp and all, with
the target unchanged. The mode cannot be switched back by approved SQL; where
PostgreSQL (before 16) lets ``RESET transaction_read_only`` lift it anyway,
the Pilot's check before COMMIT catches it and the savepoint rollback undoes
it. A plain read applies, returns its rows, and its stamp commits.

Everything runs through the real Pilot (``World``) against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from marque.change import READ_ONLY
from marque.errors import InvalidInput, PreviewFailed
from marque.outcome import Outcome
from marque.token import Budget, Change, Guard, Statement, issue_marque, public_jwk

from .pgworld import PILOT_ID, TARGET, World, build_world, marque_id_of

START = {1: 100, 2: 100, 3: 100}
READ_ALL = "SELECT id, balance FROM accounts ORDER BY id"

#: Functions a read can call: the classifier cannot see inside them, the database can.
FIXTURE_SQL = [
    "CREATE SEQUENCE s",
    "CREATE FUNCTION drain() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "UPDATE accounts SET balance = 0; RETURN 1; END $$",
    "CREATE FUNCTION copy_in() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "EXECUTE 'COPY accounts FROM PROGRAM ''echo 9,9'' WITH (FORMAT csv)'; RETURN 1; END $$",
    "CREATE FUNCTION read_write() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "SET TRANSACTION READ WRITE; UPDATE accounts SET balance = 0; RETURN 1; END $$",
    "CREATE FUNCTION reset_mode() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "RESET transaction_read_only; RETURN 1; END $$",
    # Lifts the mode (where PostgreSQL lets RESET do that), writes, and puts it back.
    "CREATE FUNCTION sneak() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "RESET transaction_read_only; UPDATE accounts SET balance = 0; "
    "SET TRANSACTION READ ONLY; RETURN 1; END $$",
    "CREATE FUNCTION sneak_temp() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
    "RESET transaction_read_only; CREATE TEMP TABLE IF NOT EXISTS scratch (x int); "
    "INSERT INTO scratch VALUES (1); SET TRANSACTION READ ONLY; RETURN 1; END $$",
]


@pytest.fixture
def ro_world(tmp_path: Path, pg_dsn: str) -> Iterator[World]:
    """A Pilot world whose target also holds the functions and sequence above."""
    made = build_world(tmp_path, pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for sql in FIXTURE_SQL:
            conn.execute(sql)
    try:
        yield made
    finally:
        made.close()


def issue(world: World, statements: Sequence[str], *, access: str | None = READ_ONLY,
          max_rows: int = 10, guards: Sequence[Guard] = (), executions: int = 3,
          attempts: int = 1) -> str:
    """A marque for ``statements`` on ``bank``, read-only unless ``access`` is None."""
    change = Change(tuple(Statement(sql) for sql in statements), tuple(guards), access=access)
    return issue_marque(world.issuer, pilot_id=PILOT_ID, incarnation=world.incarnation,
                        target=TARGET, holder_jwk=public_jwk(world.holder), change=change,
                        budget=Budget(executions, max_rows, attempts), ttl_seconds=600)


def query(world: World, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def sequence_untouched(world: World) -> bool:
    """``s`` was never advanced (sequences do not roll back)."""
    return query(world, "SELECT is_called FROM s") == [(False,)]


def refused(outcome: Outcome) -> dict[str, Any]:
    """The error of a not-applied outcome, after checking it is a statement_error."""
    assert outcome.status == "aborted_not_applied", outcome
    assert outcome.error is not None and outcome.error["code"] == "statement_error", outcome
    return outcome.error


def assert_target_unchanged(world: World) -> None:
    assert world.balances() == START
    assert world.stamps() == []  # not applied: the stamp vanished with the transaction
    assert sequence_untouched(world)
    assert query(world, "SELECT to_regclass('public.copy')") == [(None,)]


def test_a_read_under_read_only_applies_and_its_stamp_commits(ro_world: World) -> None:
    """A plain SELECT runs read-only: applied, rows returned, applied stamp with its count."""
    token = issue(ro_world, [READ_ALL])
    outcome = ro_world.execute(token, "n-read")

    assert outcome.status == "applied"
    assert outcome.rows_affected == 3
    assert outcome.result == {"columns": ["id", "balance"],
                              "rows": [[1, 100], [2, 100], [3, 100]]}
    [stamp] = ro_world.stamps()
    assert (stamp["marque_id"], stamp["nonce"]) == (marque_id_of(token), "n-read")
    assert stamp["kind"] == "applied" and stamp["rows_affected"] == 3
    fence = [e for e in ro_world.events if e["event"] == "fence_checked"]
    assert fence and fence[0]["access"] == "read_only"
    assert ro_world.balances() == START


def test_a_read_with_guards_applies_on_the_separate_stamp_path(ro_world: World) -> None:
    """With a guard to check before, the stamp travels alone: still read-only, still applies."""
    token = issue(ro_world, [READ_ALL, "SELECT count(*) FROM accounts"], guards=[
        Guard("SELECT balance FROM accounts WHERE id = 1", (), 100, "both")])
    outcome = ro_world.execute(token, "n-guarded")
    assert outcome.status == "applied" and outcome.rows_affected == 4
    assert [s["rows_affected"] for s in ro_world.stamps()] == [4]


WRITES = [
    pytest.param("SELECT drain()", id="function-update"),
    pytest.param("SELECT nextval('s')", id="nextval"),
    pytest.param("WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d", id="dml-cte"),
    pytest.param("SELECT * INTO copy FROM accounts", id="select-into"),
    pytest.param("SELECT * FROM accounts FOR UPDATE", id="for-update"),
    pytest.param("SELECT * FROM accounts FOR SHARE", id="for-share"),
    pytest.param("SELECT copy_in()", id="copy-from-program"),
    pytest.param("UPDATE accounts SET balance = 0 WHERE id = 1", id="update"),
    pytest.param("CREATE TABLE copy AS SELECT * FROM accounts", id="create-table-as"),
    pytest.param("SELECT read_write()", id="set-read-write-in-function"),
    pytest.param("SELECT set_config('transaction_read_only', 'off', true)", id="set-config"),
]


@pytest.mark.parametrize("sql", WRITES)
def test_a_write_under_read_only_is_refused_with_the_target_unchanged(
    ro_world: World, sql: str
) -> None:
    """Every write path fails in the read-only transaction: statement_error, nothing applied."""
    error = refused(ro_world.execute(issue(ro_world, [sql]), "n-write"))
    # 25006 read_only_sql_transaction; 25001 for an attempt to switch the mode back.
    assert error["sqlstate"] in ("25006", "25001")
    assert_target_unchanged(ro_world)


@pytest.mark.parametrize("sql", [
    "SELECT drain()",
    "SELECT nextval('s')",
    "WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d",
    "SELECT * INTO copy FROM accounts",
])
def test_the_same_write_without_access_applies(ro_world: World, sql: str) -> None:
    """Control: without read_only the very same statement changes the target."""
    outcome = ro_world.execute(issue(ro_world, [sql], access=None), "n-control")
    assert outcome.status == "applied", outcome
    changed = (ro_world.balances() != START or not sequence_untouched(ro_world)
               or query(ro_world, "SELECT to_regclass('public.copy')") != [(None,)])
    assert changed
    assert [s["kind"] for s in ro_world.stamps()] == ["applied"]


def test_a_write_behind_a_read_and_a_guard_is_refused(ro_world: World) -> None:
    """On the separate-stamp path (a guard before), a later write is refused just the same."""
    token = issue(ro_world, [READ_ALL, "SELECT drain()"],
                  guards=[Guard("SELECT true", (), True, "before")])
    refused(ro_world.execute(token, "n-later"))
    assert_target_unchanged(ro_world)


def test_a_second_attempt_runs_read_only_too(ro_world: World) -> None:
    """A refused nonce may run again (attempt 2, the upsert stamp path): refused alike."""
    token = issue(ro_world, ["SELECT drain()"], executions=1, attempts=2)
    first = ro_world.execute(token, "n-again")
    second = ro_world.execute(token, "n-again")
    assert (refused(first)["sqlstate"], refused(second)["sqlstate"]) == ("25006", "25006")
    assert (first.attempt, second.attempt) == (1, 2)
    assert_target_unchanged(ro_world)


@pytest.mark.parametrize("statements", [
    pytest.param(["SELECT reset_mode()", "UPDATE accounts SET balance = 0"], id="reset-then-write"),
    pytest.param(["SELECT sneak()"], id="reset-write-set-back"),
    pytest.param(["SELECT sneak_temp()"], id="reset-temp-write-set-back"),
])
def test_lifting_read_only_by_reset_is_caught_and_undone(
    ro_world: World, statements: list[str]
) -> None:
    """RESET transaction_read_only (allowed before PostgreSQL 16): refused before COMMIT."""
    refused(ro_world.execute(issue(ro_world, statements), "n-reset"))
    assert_target_unchanged(ro_world)


@pytest.mark.parametrize("sql", [
    "SET TRANSACTION READ WRITE",
    "SET transaction_read_only = off",
    "RESET transaction_read_only",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    "RESET ALL",
    "COPY accounts FROM PROGRAM 'true'",
    "COPY accounts TO STDOUT",
])
def test_mode_switches_and_copy_are_never_approved_sql(sql: str) -> None:
    """SET, RESET and COPY never become approved SQL at all (refused when the change is built)."""
    with pytest.raises(InvalidInput):
        Change((Statement(sql),), access=READ_ONLY)


def test_session_settings_made_by_a_read_do_not_outlive_it(ro_world: World) -> None:
    """A read that sets session defaults (read-only for later transactions, a search path
    where no table is) leaves the pooled connection as it found it: the savepoint rollback
    undoes them. (Not a tiny statement_timeout: it would also bind the read's own last
    messages, and fail the read itself on a loaded machine.)"""
    poison = issue(ro_world, ["SELECT set_config('default_transaction_read_only', 'on', false)",
                              "SELECT set_config('search_path', 'marque_nowhere', false)"])
    assert ro_world.execute(poison, "n-poison").status == "applied"
    for n in range(3):
        debit = ro_world.execute(
            issue(ro_world, ["UPDATE accounts SET balance = balance - 1 WHERE id = 1"],
                  access=None), f"n-debit-{n}")
        assert debit.status == "applied", debit
    assert ro_world.balances() == {1: 97, 2: 100, 3: 100}


def test_a_read_only_change_is_previewed_read_only(ro_world: World) -> None:
    """Preview runs a read_only change read-only too: a write in a function fails it."""
    target = ro_world.pilot.targets[TARGET]
    hidden = (Statement("SELECT drain()"),)
    with pytest.raises(PreviewFailed) as caught:
        target.preview(Change(hidden, access=READ_ONLY), mode="rollback", sample_rows=5,
                       statement_timeout_ms=5_000)
    assert caught.value.sqlstate == "25006"
    [plain] = target.preview(Change(hidden), mode="rollback", sample_rows=5,
                             statement_timeout_ms=5_000)
    assert plain["rows"] == 1
    assert ro_world.balances() == START and ro_world.stamps() == []


# -- routing and the database together (DESIGN §11.3) --------------------------------------

ISSUE_CASES = [
    "SELECT drain()",
    "SELECT nextval('s')",
    "WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d",
    "SELECT * INTO copy FROM accounts",
    "SELECT * FROM accounts FOR UPDATE",
    "COPY accounts FROM PROGRAM 'echo 9,9'",
]


@pytest.mark.parametrize("sql", ISSUE_CASES)
def test_what_routing_calls_a_read_cannot_write(ro_world: World, sql: str) -> None:
    """Each write path is either classified as no read at all, or — classified as a read and
    so issued read-only — refused by the database with the target unchanged."""
    from marque.harbour.routing import BOOTSTRAP_PROFILE, evaluate

    decision = evaluate(BOOTSTRAP_PROFILE, "alice", TARGET, [sql], "postgres")
    if not decision.all_read:
        assert decision.outcome == "delegate"  # a write waits for a person, never a read
        assert any(t.operation != "read" for t in decision.tuples)
        return
    assert decision.outcome == "allow"
    try:
        token = issue(ro_world, [sql])
    except InvalidInput:
        pytest.fail(f"{sql!r} passed routing as a read but cannot be issued")
    refused(ro_world.execute(token, "n-routed"))
    assert_target_unchanged(ro_world)
