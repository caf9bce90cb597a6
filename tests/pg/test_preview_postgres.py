"""Previews on a real PostgreSQL target: rolled back, exact, sampled, explained, and failing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from marque.errors import PreviewFailed
from marque.target.postgres import PostgresTarget
from marque.token import Change, Statement


@pytest.fixture
def target(pg_dsn: str) -> Iterator[PostgresTarget]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100), (3, 100)")
    target = PostgresTarget("bank", pg_dsn)
    try:
        yield target
    finally:
        target.close()


def _balances(target: PostgresTarget) -> list[tuple[Any, ...]]:
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        return conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()


def _change(*sql: str) -> Change:
    return Change(tuple(Statement(s) for s in sql))


def test_rollback_preview_counts_rows_samples_and_changes_nothing(target: PostgresTarget) -> None:
    """UPDATE and RETURNING report exact rows and samples; the table is unchanged after."""
    result = target.preview(_change(
        "UPDATE accounts SET balance = balance - 10",
        "UPDATE accounts SET balance = 0 WHERE id >= 2 RETURNING id, balance"),
        mode="rollback", sample_rows=1, statement_timeout_ms=5_000)
    assert [s["rows"] for s in result] == [3, 2]
    assert result[1]["sample"]["columns"] == ["id", "balance"]
    assert len(result[1]["sample"]["rows"]) == 1 and result[1]["sample"]["rows"][0][1] == 0
    assert _balances(target) == [(1, 100), (2, 100), (3, 100)]
    assert target.stamps_of("mq_any") == []


def test_explain_preview_estimates_and_executes_nothing(target: PostgresTarget) -> None:
    """Mode explain returns the planner's JSON plan and its row estimate only."""
    (statement,) = target.preview(_change("UPDATE accounts SET balance = 0"), mode="explain",
                                  sample_rows=5, statement_timeout_ms=5_000)
    assert isinstance(statement["rows"], int)
    assert statement["plan"][0]["Plan"]["Node Type"] == "ModifyTable"
    assert _balances(target) == [(1, 100), (2, 100), (3, 100)]


def test_a_failing_statement_is_preview_failed_with_its_sqlstate(target: PostgresTarget) -> None:
    """A statement the server refuses is preview_failed carrying the SQLSTATE; nothing kept."""
    with pytest.raises(PreviewFailed) as caught:
        target.preview(_change("UPDATE accounts SET balance = 0", "SELECT 1/0"),
                       mode="rollback", sample_rows=1, statement_timeout_ms=5_000)
    assert caught.value.sqlstate == "22012"
    assert _balances(target) == [(1, 100), (2, 100), (3, 100)]
