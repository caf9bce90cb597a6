"""Approved statements: exactly one, and never transaction control."""

from __future__ import annotations

import pytest

from marque.sqltext import SqlTextError, check_statement


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE accounts SET balance = balance - 10 WHERE id = ?",
        "update accounts set balance = 1;",
        "SELECT ';' AS semi",
        "SELECT 'it''s; fine'",
        'SELECT 1 AS "a;b"',
        "SELECT $$;COMMIT;$$",
        "SELECT $tag$ ; $tag$",
        "-- leading comment\nSELECT 1",
        "/* ; */ SELECT 1",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "(SELECT 1)",
        "SELECT settings FROM t",  # 'SET' inside a word is not the SET keyword
    ],
)
def test_single_statements_pass(sql: str) -> None:
    """One ordinary statement (with quoting, comments, a trailing semicolon) is accepted."""
    assert check_statement(sql) == sql


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("COMMIT", "COMMIT"),
        ("  rollback", "ROLLBACK"),
        ("/* x */ BEGIN", "BEGIN"),
        ("-- c\nSTART TRANSACTION", "START"),
        ("SAVEPOINT s", "SAVEPOINT"),
        ("RELEASE SAVEPOINT s", "RELEASE"),
        ("END", "END"),
        ("SET LOCAL statement_timeout = 0", "SET"),
        ("RESET ALL", "RESET"),
        ("PRAGMA foreign_keys = OFF", "PRAGMA"),
        ("ATTACH DATABASE 'x' AS y", "ATTACH"),
        ("PREPARE TRANSACTION 'x'", "PREPARE"),
        ("UPDATE a SET b = 1; COMMIT", "more than one"),
        ("SELECT 1; SELECT 2", "more than one"),
        ("SELECT ';'; DELETE FROM t", "more than one"),
        ("", "no statement"),
        ("-- only a comment", "no statement"),
        ("SELECT 'unterminated", "unterminated"),
        ("SELECT 1 /* unterminated", "unterminated"),
        ("SELECT $q$ unterminated", "unterminated"),
    ],
)
def test_forbidden_or_multiple_statements_fail(sql: str, why: str) -> None:
    """Transaction control, several statements, or unterminated quoting are refused by name."""
    with pytest.raises(SqlTextError, match=why):
        check_statement(sql)
