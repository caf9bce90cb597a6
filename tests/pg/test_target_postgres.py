"""The PostgreSQL target's fenced transaction, driven directly (DESIGN §3 steps 3–5).

A first attempt without guards to check before sends its first statement in
the same message as the stamp, right behind it. These tests pin what that must
not change: a stamp conflict stops the message before the statement runs (a
non-transactional sequence proves the statement never executed, not merely
that it rolled back), the statement's own errors stay its own, and literal
``%`` signs, reads, ``max_rows`` and further statements behave as on the
one-statement-per-message path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from marque.errors import MaxRowsExceeded, StatementError
from marque.outcome import Status
from marque.target.base import STAMP_TOMBSTONE, StampConflict, TargetAttempt
from marque.target.postgres import PostgresTarget
from marque.token import Change, Guard, Statement

PROBE = "UPDATE accounts SET balance = balance - 10 + 0 * nextval('probe') WHERE id = 1"


@pytest.fixture
def target(pg_dsn: str) -> Iterator[PostgresTarget]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, "
                     "note text)")
        conn.execute("INSERT INTO accounts VALUES (1, 100, NULL), (2, 100, NULL)")
        # Sequences do not roll back: a statement that ran leaves its mark here.
        conn.execute("CREATE SEQUENCE probe")
    target = PostgresTarget("bank", pg_dsn)
    try:
        yield target
    finally:
        target.close()


def _run(
    change: Change, nonce: str = "n-1", *, attempt: int = 1, max_rows: int = 5
) -> TargetAttempt:
    return TargetAttempt("mq_pg", nonce, attempt, "pilot-pg", "inc_pg", change, max_rows, 30_000,
                         expires_at=time.time() + 600)


def _query(target: PostgresTarget, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _probe_calls(target: PostgresTarget) -> int:
    last_value, is_called = _query(target, "SELECT last_value, is_called FROM probe")[0]
    return int(last_value) if is_called else 0


def _stamps(target: PostgresTarget) -> list[tuple[Any, ...]]:
    return _query(target, "SELECT nonce, attempt, kind, rows_affected FROM marque.stamps "
                          "ORDER BY nonce")


def _execute(target: PostgresTarget, run: TargetAttempt) -> tuple[Any, list[str]]:
    events: list[str] = []
    applied = target.execute(run, lambda kind, **_: events.append(kind))
    return applied, events


def test_first_attempt_applies_with_its_statement_behind_the_stamp(target: PostgresTarget):
    applied, events = _execute(target, _run(Change((Statement(PROBE),))))
    assert applied.rows_affected == 1 and applied.txid is not None
    assert _query(target, "SELECT balance FROM accounts WHERE id = 1") == [(90,)]
    assert _stamps(target) == [("n-1", 1, "applied", 1)]
    assert _probe_calls(target) == 1
    # Sent together: the statement is reported started as the message leaves.
    assert events == ["statement_started", "fence_checked", "statement_finished", "asserted",
                      "committed"]


@pytest.mark.parametrize("kind", ["applied", STAMP_TOMBSTONE])
def test_a_stamp_conflict_stops_the_statement_before_it_runs(target: PostgresTarget, kind: str):
    # Another attempt 1 of this nonce already left its stamp (committed, or tombstoned).
    target.execute(_run(Change((Statement("SELECT 1"),))), lambda *a, **k: None)
    if kind == STAMP_TOMBSTONE:
        _query(target, "UPDATE marque.stamps SET kind = 'tombstone' RETURNING 1")
    before = _probe_calls(target)

    with pytest.raises(StampConflict):
        target.execute(_run(Change((Statement(PROBE),))), lambda *a, **k: None)

    assert _probe_calls(target) == before  # the statement never executed
    assert _query(target, "SELECT balance FROM accounts WHERE id = 1") == [(100,)]
    assert _stamps(target) == [("n-1", 1, kind, 1)]


def test_a_later_attempt_replaces_an_older_tombstone_and_applies(target: PostgresTarget):
    tombstoned = target.reconcile(replace(_run(Change((Statement(PROBE),))),
                                          target_id=target.identity()))
    assert tombstoned.status is Status.ABORTED_NOT_APPLIED  # attempt 1 tombstoned
    applied, events = _execute(target, _run(Change((Statement(PROBE),)), attempt=2))
    assert applied.rows_affected == 1
    assert _stamps(target) == [("n-1", 2, "applied", 1)]
    # A later attempt's stamp goes alone: the fence is checked before the statement starts.
    assert events[:2] == ["fence_checked", "statement_started"]


def test_reconciliation_writes_no_tombstone_in_a_database_of_another_identity(
        target: PostgresTarget):
    """The stamp table carries the database's identity; a tombstone for an attempt sent to
    another identity (or to one not known) is never written: the attempt stays unknown."""
    identity = target.identity()
    assert identity.startswith("tgt_") and target.identity() == identity
    assert _query(target, "SELECT target_id FROM marque.target_identity") == [(identity,)]

    for sent_to in ("tgt_elsewhere", None):
        evidence = target.reconcile(replace(_run(Change((Statement(PROBE),))),
                                            target_id=sent_to))
        assert evidence.status is Status.INDETERMINATE
        assert evidence.reason.startswith("target_replaced:")
    assert _stamps(target) == []


def test_a_guard_before_keeps_the_stamp_alone(target: PostgresTarget):
    change = Change((Statement(PROBE),), guards=(Guard("SELECT balance = 100 FROM accounts "
                                                       "WHERE id = 1"),))
    applied, events = _execute(target, _run(change))
    assert applied.rows_affected == 1
    assert events[:3] == ["fence_checked", "guard_checked", "statement_started"]


def test_the_statements_own_unique_violation_is_a_statement_error(target: PostgresTarget):
    with pytest.raises(StatementError) as caught:
        target.execute(_run(Change((Statement("UPDATE accounts SET id = 2 WHERE id = 1"),))),
                       lambda *a, **k: None)
    assert caught.value.sqlstate == "23505"
    assert _stamps(target) == []  # rolled back with the statement
    assert _query(target, "SELECT id FROM accounts ORDER BY id") == [(1,), (2,)]


def test_a_literal_percent_without_parameters_stays_literal(target: PostgresTarget):
    change = Change((Statement("UPDATE accounts SET note = '50%' WHERE id = 1 AND '%s' = '%s'"),))
    applied, _ = _execute(target, _run(change))
    assert applied.rows_affected == 1
    assert _query(target, "SELECT note FROM accounts WHERE id = 1") == [("50%",)]


def test_parameters_of_the_first_statement_are_bound(target: PostgresTarget):
    change = Change((Statement("UPDATE accounts SET note = %s WHERE id = %s",
                               ("it's 100% ; DROP TABLE accounts --", 2)),))
    applied, _ = _execute(target, _run(change))
    assert applied.rows_affected == 1
    assert _query(target, "SELECT note FROM accounts WHERE id = 2") == [
        ("it's 100% ; DROP TABLE accounts --",)]


def test_a_read_first_returns_its_rows_and_respects_max_rows(target: PostgresTarget):
    read = Change((Statement("SELECT id, balance FROM accounts ORDER BY id"),))
    applied, _ = _execute(target, _run(read, "read-ok", max_rows=2))
    assert applied.result == {"columns": ["id", "balance"], "rows": [[1, 100], [2, 100]]}

    with pytest.raises(MaxRowsExceeded):
        target.execute(_run(read, "read-over", max_rows=1), lambda *a, **k: None)
    assert [s[0] for s in _stamps(target)] == ["read-ok"]


def test_a_second_statement_runs_after_the_first(target: PostgresTarget):
    change = Change((Statement(PROBE), Statement("UPDATE accounts SET balance = balance + 10 "
                                                 "WHERE id = 2")))
    applied, events = _execute(target, _run(change))
    assert applied.rows_affected == 2
    assert _query(target, "SELECT balance FROM accounts ORDER BY id") == [(90,), (110,)]
    assert events.count("statement_started") == 2
    assert _stamps(target) == [("n-1", 1, "applied", 2)]


def test_live_stamps_reads_identity_and_an_incarnations_live_stamps_in_one_checkout(
        target: PostgresTarget, monkeypatch: pytest.MonkeyPatch):
    """The continuity read: the target's identity, and the stamps of one incarnation's
    marques still live (not another incarnation's, not an expired one), over one pooled
    connection."""
    target.execute(_run(Change((Statement("SELECT 1"),))), lambda *a, **k: None)
    target.execute(replace(_run(Change((Statement("SELECT 1"),)), "n-2"),
                           incarnation="inc_other"), lambda *a, **k: None)
    checkouts: list[int] = []
    checkout = PostgresTarget._checkout

    def counted(self: PostgresTarget) -> Any:
        checkouts.append(1)
        return checkout(self)

    monkeypatch.setattr(PostgresTarget, "_checkout", counted)
    live = target.live_stamps("inc_pg", time.time())
    expired = target.live_stamps("inc_pg", time.time() + 3600)
    monkeypatch.undo()
    assert len(checkouts) == 2
    assert live.target_id == target.identity()
    assert [(s["nonce"], s["kind"], s["incarnation"]) for s in live.stamps] == [
        ("n-1", "applied", "inc_pg")]
    assert live.row_stamps == []
    assert (expired.target_id, expired.stamps) == (live.target_id, [])
