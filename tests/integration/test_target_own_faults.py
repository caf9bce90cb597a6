"""A fault of ours inside a target's transaction is not the database's answer: a real SQLite
target lets it through as it is — never ``target_unavailable`` or ``statement_error`` —
rolls back, and a later reconciliation settles the attempt from the stamp
(``marque.target.drivers``)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from marque.errors import MarqueError, StatementError
from marque.outcome import Status
from marque.target.base import TargetAttempt
from marque.target.rows import RowWrite
from marque.target.sqlite import SqliteTarget
from marque.token import Change, Statement


def _bank(tmp_path: Path) -> Path:
    path = tmp_path / "bank.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
    conn.close()
    return path


def _balances(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
    conn.close()
    return rows


def _attempt(sql: str) -> TargetAttempt:
    return TargetAttempt("mq_x", "n-1", 1, "p1", "inc_1", Change((Statement(sql),)),
                         max_rows=5, statement_timeout_ms=5_000)


def test_a_fault_of_ours_mid_transaction_surfaces_and_nothing_applies(tmp_path: Path) -> None:
    path = _bank(tmp_path)
    target = SqliteTarget("bank", str(path))
    attempt = _attempt("UPDATE accounts SET balance = balance - 10 WHERE id = 1")

    def emit(kind: str, **fields: Any) -> None:
        if kind == "statement_finished":  # the statement ran; COMMIT was not sent
            raise TypeError("a bug in the caller's event sink")

    with pytest.raises(TypeError, match="a bug in the caller"):
        target.execute(attempt, emit)
    assert _balances(path) == [(1, 100), (2, 100)]
    # The Pilot records such an attempt as unknown; reconciliation proves it never applied.
    evidence = target.reconcile(replace(attempt, target_id=target.identity()))
    assert evidence.status is Status.ABORTED_NOT_APPLIED
    target.close()


def test_the_database_s_own_refusal_is_still_translated(tmp_path: Path) -> None:
    target = SqliteTarget("bank", str(_bank(tmp_path)))
    with pytest.raises(StatementError) as refused:
        target.execute(_attempt("UPDATE no_such_table SET x = 1"), lambda *a, **k: None)
    assert "no_such_table" in refused.value.message
    target.close()


def test_a_fault_of_ours_in_an_effect_row_surfaces_and_the_row_is_not_written(
        tmp_path: Path) -> None:
    path = _bank(tmp_path)
    target = SqliteTarget("bank", str(path))
    write = RowWrite(
        marque_id="mq_x", nonce="n-1", dispatch_attempt=1, pilot_id="p1", incarnation="inc_1",
        effect_apply_key="eak_1", row_idempotency_key="rik_1", kind="update",
        table="accounts", key=("id",), identity={"id": 1}, values={"balance": 5},
        guard=None,  # type: ignore[arg-type]  # what a bug upstream might hand over
        statement_timeout_ms=5_000)
    with pytest.raises(AttributeError) as raised:
        target.apply_row(write)
    assert not isinstance(raised.value, MarqueError)
    assert _balances(path) == [(1, 100), (2, 100)]
    assert target.row_stamps_of_marque("mq_x") == []  # its stamp rolled back with it
    target.close()
