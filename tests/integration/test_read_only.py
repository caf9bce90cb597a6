"""Reads enforced by the database, on a SQLite target (DESIGN §11.3).

A change issued with ``"access": "read_only"`` runs with ``PRAGMA
query_only = 1`` from right after its stamp, and the authorizer refuses every
``PRAGMA`` in approved SQL. Every test drives the real Pilot over a real
SQLite file and looks at what an operator can look at: the outcome, the
events, the accounts and the stamp table. Each refusal has a control: the
same statement without ``access`` applies, so the refusal is read-only's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import pytest

from marque.change import READ_ONLY
from marque.errors import InvalidInput, PreviewFailed
from marque.outcome import Outcome
from marque.token import Budget, Change, Guard, Statement, issue_marque, public_jwk

from .conftest import Env, marque_id_of

START = {1: 100, 2: 100, 3: 100}
READ_ALL = "SELECT id, balance FROM accounts ORDER BY id"


def issue(env: Env, statements: Sequence[str], *, access: str | None = READ_ONLY,
          max_rows: int = 10, guards: Sequence[Guard] = ()) -> str:
    """A marque for ``statements`` on ``bank``, read-only unless ``access`` is None."""
    change = Change(tuple(Statement(sql) for sql in statements), tuple(guards), access=access)
    return issue_marque(env.issuer, pilot_id=env.pilot.pilot_id,
                        incarnation=env.pilot.incarnation, target="bank",
                        holder_jwk=public_jwk(env.holder), change=change,
                        budget=Budget(3, max_rows, 1), ttl_seconds=600)


def refused(outcome: Outcome) -> dict[str, Any]:
    """The error of a not-applied outcome, after checking it is exactly that."""
    assert outcome.status == "aborted_not_applied", outcome
    assert outcome.error is not None
    assert outcome.error["code"] == "statement_error"
    assert outcome.rows_affected in (None, 0)
    return outcome.error


def test_a_read_under_read_only_applies_and_its_stamp_commits(env: Env) -> None:
    """A plain SELECT runs read-only: applied, rows returned, applied stamp with its count."""
    token = issue(env, [READ_ALL])
    outcome = env.run(token, "n-read")

    assert outcome.status == "applied"
    assert outcome.rows_affected == 3
    assert outcome.result == {"columns": ["id", "balance"],
                              "rows": [[1, 100], [2, 100], [3, 100]]}
    [stamp] = env.stamps()
    assert (stamp["marque_id"], stamp["nonce"]) == (marque_id_of(token), "n-read")
    assert stamp["kind"] == "applied" and stamp["rows_affected"] == 3
    fence = [e for e in env.events if e["event"] == "fence_checked"]
    assert fence and fence[0]["access"] == "read_only"
    assert env.balances() == START


def test_guards_run_under_read_only_too(env: Env) -> None:
    """Guards before and after the statements are reads as well, and pass read-only."""
    token = issue(env, [READ_ALL], guards=[
        Guard("SELECT balance FROM accounts WHERE id = 1", (), 100, "both")])
    outcome = env.run(token, "n-guarded")
    assert outcome.status == "applied" and outcome.rows_affected == 3
    assert [s["kind"] for s in env.stamps()] == ["applied"]


WRITES = [
    pytest.param(["UPDATE accounts SET balance = 0 WHERE id = 1"], id="update"),
    pytest.param(["DELETE FROM accounts WHERE id = 1"], id="delete"),
    pytest.param(["INSERT INTO accounts (id, balance) VALUES (9, 9)"], id="insert"),
    pytest.param(["REPLACE INTO accounts (id, balance) VALUES (1, 0)"], id="replace"),
    pytest.param(["UPDATE accounts SET balance = 0 WHERE id = 1 RETURNING id"],
                 id="update-returning"),
    pytest.param(["CREATE TABLE copy AS SELECT * FROM accounts"], id="create-table-as"),
    pytest.param(["CREATE TEMP TABLE scratch (x)"], id="temp-table"),
    pytest.param([READ_ALL, "DELETE FROM accounts WHERE id = 3"], id="read-then-write"),
]


@pytest.mark.parametrize("statements", WRITES)
def test_a_write_under_read_only_is_refused_and_never_applied(
    env: Env, statements: list[str]
) -> None:
    """Every write path is a statement_error: rolled back, stamp and all, accounts unchanged."""
    outcome = env.run(issue(env, statements), "n-write")
    error = refused(outcome)
    assert "readonly" in error["message"]  # SQLite's SQLITE_READONLY, as the target said it
    assert env.balances() == START
    assert env.stamps() == []  # not applied: the stamp vanished with the transaction
    assert "rolled_back" in [e["event"] for e in env.events]


@pytest.mark.parametrize("statements", WRITES[:3])
def test_the_same_write_without_access_applies(env: Env, statements: list[str]) -> None:
    """Control: without read_only the very same statements apply."""
    outcome = env.run(issue(env, statements, access=None), "n-control")
    assert outcome.status == "applied"
    assert env.balances() != START
    assert [s["kind"] for s in env.stamps()] == ["applied"]


@pytest.mark.parametrize("sql", [
    # SQLite has no data-modifying CTEs, SELECT INTO or locking clauses: each is a
    # syntax error here, so it is refused before anything runs.
    "WITH d AS (DELETE FROM accounts RETURNING *) SELECT * FROM d",
    "SELECT * INTO copy FROM accounts",
    "SELECT * FROM accounts FOR UPDATE",
    # Table-valued pragmas reach PRAGMA through a SELECT: the authorizer refuses them.
    "SELECT * FROM pragma_query_only",
    "SELECT * FROM pragma_table_info('accounts')",
])
def test_non_reads_sqlite_does_not_parse_or_allow_are_refused(env: Env, sql: str) -> None:
    """What SQLite cannot run as a read is refused as a statement_error, accounts unchanged."""
    refused(env.run(issue(env, [sql]), "n-odd"))
    assert env.balances() == START
    assert env.stamps() == []


@pytest.mark.parametrize("sql", ["PRAGMA query_only = 0", "PRAGMA query_only = OFF",
                                 "VACUUM", "ATTACH DATABASE 'x.db' AS x"])
def test_approved_sql_cannot_reach_the_pragma(sql: str) -> None:
    """A PRAGMA (or other connection control) never becomes approved SQL at all."""
    with pytest.raises(InvalidInput):
        Change((Statement(sql),), access=READ_ONLY)


def test_read_only_leaves_nothing_behind_for_the_next_change(env: Env) -> None:
    """After a read and a refused write under read_only, a read-write change applies."""
    assert env.run(issue(env, [READ_ALL]), "n-1").status == "applied"
    refused(env.run(issue(env, ["UPDATE accounts SET balance = 1"]), "n-2"))
    debit = env.run(issue(env, ["UPDATE accounts SET balance = balance - 10 WHERE id = 1"],
                          access=None), "n-3")
    assert debit.status == "applied" and debit.rows_affected == 1
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    conn = sqlite3.connect(env.bank_path)
    try:
        assert conn.execute("PRAGMA query_only").fetchone() == (0,)
    finally:
        conn.close()


def test_a_refused_read_only_nonce_may_run_again_and_is_refused_again(env: Env) -> None:
    """The refusal is provably not applied: the nonce's next attempt runs, and fails alike."""
    change = Change((Statement("DELETE FROM accounts"),), access=READ_ONLY)
    token = issue_marque(env.issuer, pilot_id=env.pilot.pilot_id,
                         incarnation=env.pilot.incarnation, target="bank",
                         holder_jwk=public_jwk(env.holder), change=change,
                         budget=Budget(1, 10, 2), ttl_seconds=600)
    first = env.run(token, "n-again")
    second = env.run(token, "n-again")
    refused(first)
    refused(second)
    assert (first.attempt, second.attempt) == (1, 2)
    assert env.balances() == START and env.stamps() == []


def test_a_read_only_change_is_previewed_read_only(env: Env) -> None:
    """Preview runs a read_only change read-only too: a hidden write fails the preview."""
    target = env.pilot.targets["bank"]
    write = (Statement("UPDATE accounts SET balance = 0 WHERE id = 1"),)
    with pytest.raises(PreviewFailed):
        target.preview(Change(write, access=READ_ONLY), mode="rollback", sample_rows=5,
                       statement_timeout_ms=5_000)
    [plain] = target.preview(Change(write), mode="rollback", sample_rows=5,
                             statement_timeout_ms=5_000)
    assert plain["rows"] == 1
    [read] = target.preview(Change((Statement(READ_ALL),), access=READ_ONLY), mode="rollback",
                            sample_rows=2, statement_timeout_ms=5_000)
    assert read["rows"] == 3 and len(read["sample"]["rows"]) == 2
    assert env.balances() == START and env.stamps() == []
