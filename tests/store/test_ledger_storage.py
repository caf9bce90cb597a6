"""Migration 7 (issue 15): the engine's own storage of the ledger's rows, on every engine.

On SQLite, ``budgets``, ``claims``, ``observations`` and ``pop_jtis`` become WITHOUT
ROWID tables (``ledger/sqlite_schema.py``): one b-tree each instead of the rows plus
their primary key's index, so a fresh execution writes fewer pages of WAL. On
PostgreSQL migration 7 changes nothing. Either way a ledger made by schema 6 opens at
7 with every row it held, its keys still refusing duplicates; on SQLite the rebuild is
one transaction, and a claim then writes no page of a primary-key index.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from marque.errors import LedgerUnavailable
from marque.ledger import schema as ledger_schema
from marque.ledger.base import Ledger, Observed
from marque.ledger.sql import SqlLedger
from marque.ledger.sqlite_schema import WITHOUT_ROWID_TABLES
from marque.outcome import Status

from .conftest import LedgerEngine, LedgerPool, make_ticket
from .test_ledger import LEDGER_V1, _schema_of, write_plain

#: Every table the execution path writes, and the identity table.
TABLES = ("meta", "budgets", "claims", "attempts", "observations", "events", "outbox",
          "pop_jtis")
INCARNATION = "inc_" + "6" * 32


def _schema_6_statements(now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """The schema a ledger had at version 6 (version 1 as released, then migrations 2–6)
    and a history in it: three marques, some nonces settled and reported, one in progress,
    one aborted and retried."""
    statements: list[tuple[str, tuple[Any, ...]]] = [(s, ()) for s in LEDGER_V1]
    statements += [(s, ()) for index in range(1, 6) for s in ledger_schema.MIGRATIONS[index]]
    for key, value in (("schema_version", "6"), ("pilot_id", "pilot-v6"),
                       ("incarnation", INCARNATION), ("created_at", repr(now - 60))):
        statements.append(("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value)))
    for m in range(3):
        marque = f"mq_v6_{m}"
        statements.append(("INSERT INTO budgets VALUES (?, ?, ?, ?, ?, ?)",
                           (marque, "bank", 5 - m, 10, 3, now + 600 * (m - 1))))
        for n in range(4):
            nonce = f"nonce-{m}-{n}"
            status = Status.IN_PROGRESS if n == 3 else Status.APPLIED
            statements += [
                ("INSERT INTO claims VALUES (?, ?, ?, ?)", (marque, nonce, 1, now - 30)),
                ("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (marque, nonce, 1, status.value, status.rank, None if n == 3 else 1, None,
                  None if n == 3 else '{"columns":["n"],"rows":[[1]]}', INCARNATION,
                  "proc_old", now + 30, now - 30, None if n == 3 else now - 29)),
                ("INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (f"obs-{m}-{n}", marque, nonce, 1, status.value, "execution",
                  '{"error":null,"rows_affected":1}', now - 29)),
                ("INSERT INTO events VALUES (?, ?, ?, ?)",
                 (marque, nonce, 1, '[{"event":"claimed","attempt":1}]')),
                ("INSERT INTO pop_jtis VALUES (?, ?)", (f"jti-{m}-{n}", now + 300)),
            ]
            if n != 3:
                statements.append(("INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                   (marque, nonce, 1, "applied", '{"status":"applied"}', 1,
                                    now - 29, None if n == 2 else now - 28)))
    return statements


def _build_schema_6(engine: LedgerEngine, location: str, now: float) -> None:
    """A version-6 ledger at ``location``, written with the engine's plain driver."""
    write_plain(engine, location, _schema_6_statements(now),
                sqlite_pragmas=("PRAGMA auto_vacuum = INCREMENTAL",))


def _rows(engine: LedgerEngine, location: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of :data:`TABLES`, in a stable order."""
    def dump(execute: Any) -> dict[str, list[tuple[Any, ...]]]:
        return {t: sorted((tuple(r) for r in execute(f"SELECT * FROM {t}")), key=repr)
                for t in TABLES}

    if engine.name == "sqlite":
        conn = sqlite3.connect(location)
        try:
            return dump(lambda sql: conn.execute(sql).fetchall())
        finally:
            conn.close()
    import psycopg

    from marque.ledger.postgres import SCHEMA

    with psycopg.connect(location) as pg:
        pg.execute(f"SET search_path TO {SCHEMA}")
        return dump(lambda sql: pg.execute(sql).fetchall())


def _rowless_tables(location: str) -> set[str]:
    """The SQLite tables stored WITHOUT ROWID."""
    conn = sqlite3.connect(location)
    try:
        return {name for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table'")
            if sql.upper().rstrip().endswith("WITHOUT ROWID")}
    finally:
        conn.close()


def test_a_schema_6_ledger_opens_at_7_with_every_row_and_key(
    engine: LedgerEngine, pool: LedgerPool
) -> None:
    """Opening a schema-6 ledger migrates it in place: every row stays, every key still
    refuses a duplicate, and its schema is exactly a new ledger's."""
    now = time.time()
    location = pool.location()
    _build_schema_6(engine, location, now)
    before = _rows(engine, location)

    ledger = pool.open(location)

    assert ledger.schema_version == len(ledger_schema.MIGRATIONS) == 7
    after = _rows(engine, location)
    assert after == {**before, "meta": sorted(
        [r for r in before["meta"] if r[0] != "schema_version"] + [("schema_version", "7")],
        key=repr)}
    # The keys are constraints still: a claimed nonce is the same claim, a seen jti is
    # refused, and the budget left counts on from where schema 6 left it.
    again = ledger.claim(make_ticket("mq_v6_1", "nonce-1-0", now=now))
    assert not again.fresh and again.record.status is Status.APPLIED
    assert ledger.remember_pop_jti("jti-1-2", now + 300) is False
    fresh = ledger.claim(make_ticket("mq_v6_1", "nonce-new", now=now, pop_jti="jti-new"))
    assert fresh.fresh
    assert ledger.budget("mq_v6_1")["executions_left"] == 3  # type: ignore[index]
    assert [o["cause"] for o in ledger.observations("mq_v6_0", "nonce-0-1")] == ["execution"]
    assert [p.nonce for p in ledger.outbox_pending()] == [
        "nonce-0-2", "nonce-1-2", "nonce-2-2"]
    # Reaping reads and deletes through the rebuilt tables: mq_v6_0 expired, settled and
    # reported except for its in-progress nonce, so nothing of it goes yet.
    assert ledger.reap(now + 3600)["marques"] == 0
    ledger.close()

    new_location = pool.location()
    pool.create(new_location)
    assert _schema_of(engine, location) == _schema_of(engine, new_location)
    if engine.name == "sqlite":
        assert _rowless_tables(location) == _rowless_tables(new_location) == set(
            WITHOUT_ROWID_TABLES) == {"budgets", "claims", "observations", "pop_jtis"}
    assert pool.open(location).schema_version == 7  # nothing more to do


def test_a_failed_rebuild_leaves_the_schema_6_ledger_as_it_was(
    engine: LedgerEngine, pool: LedgerPool
) -> None:
    """The rebuild is one transaction with the version bump: stopped midway (a table in
    the way of its third table's copy), it leaves schema 6 and every row; once the
    obstacle is gone, the next open migrates."""
    if engine.name != "sqlite":
        pytest.skip("migration 7 has no statement on PostgreSQL")
    now = time.time()
    location = pool.location()
    _build_schema_6(engine, location, now)
    conn = sqlite3.connect(location, isolation_level=None)
    conn.execute("CREATE TABLE observations_rebuilt (x)")
    conn.close()
    before = _rows(engine, location)

    with pytest.raises(LedgerUnavailable):
        pool.open(location)

    assert _rows(engine, location) == before
    assert _rowless_tables(location) == set()
    conn = sqlite3.connect(location, isolation_level=None)
    conn.execute("DROP TABLE observations_rebuilt")
    conn.close()
    assert pool.open(location).schema_version == 7
    assert _rowless_tables(location) == set(WITHOUT_ROWID_TABLES)


def _wal_pages(path: str) -> list[int]:
    """The page number of each frame in the ledger's WAL file."""
    data = Path(path + "-wal").read_bytes()
    size = struct.unpack(">I", data[8:12])[0]
    return [struct.unpack(">I", data[at:at + 4])[0]
            for at in range(32, len(data) - size - 23, size + 24)]


def test_a_claim_and_its_settle_write_no_primary_key_index_page(
    engine: LedgerEngine, ledger: Ledger
) -> None:
    """What the WAL holds after a claim that carries the previous settle: pages of the
    tables and their secondary indexes, none of a primary-key index of a rebuilt table
    (each was a page of WAL per execution)."""
    if engine.name != "sqlite":
        pytest.skip("WAL pages are SQLite's")
    assert isinstance(ledger, SqlLedger)
    path = ledger.path  # type: ignore[attr-defined]
    now = time.time()
    first = ledger.claim(make_ticket(nonce="first", now=now, pop_jti="jti-first"))
    conn = sqlite3.connect(path)  # an empty WAL: everything after this is the claim's
    try:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    finally:
        conn.close()
    carried = Observed(
        "mq_test", "first", first.record.attempt, Status.APPLIED, now=now, cause="test",
        rows_affected=1, events=[{"event": "committed"}])
    ticket = make_ticket(nonce="second", now=now, pop_jti="jti-second")
    claim = ledger.claim(dataclasses.replace(ticket, carried=(carried,)))
    assert claim.fresh and ledger.outcome("mq_test", "first").status is Status.APPLIED  # type: ignore[union-attr]

    conn = sqlite3.connect(path)
    try:
        owners = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    finally:
        conn.close()
    written = {owners.get(page, "") for page in _wal_pages(path)}
    assert {"claims", "budgets", "observations", "pop_jtis", "attempts"} <= written
    assert not {name for name in written if name.startswith(tuple(
        f"sqlite_autoindex_{table}" for table in WITHOUT_ROWID_TABLES))}
    assert "observations_nonce" not in written
