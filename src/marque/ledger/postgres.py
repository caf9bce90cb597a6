"""The PostgreSQL ledger: the same SQL as SQLite's, for shared deployments.

Tables live in their own schema (``marque_ledger``) so a ledger can share a
database with anything else. Connections come from a pool; each ledger
transaction is one pooled connection inside ``conn.transaction()``; reads go
through a second pool of autocommit connections and see the latest commit. Claims
rely on ``INSERT … ON CONFLICT DO NOTHING`` waiting for a concurrent insert of
the same key, and the budget on a conditional ``UPDATE`` re-checking its
``WHERE`` after a row lock — both READ COMMITTED guarantees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from marque.ledger.sql import SqlLedger, Tx
from marque.pgpool import make_pool

SCHEMA = "marque_ledger"


class _PgTx(Tx):
    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Our own statements never hold a literal '%' or '?' other than placeholders.
        cur = self._conn.execute(sql.replace("?", "%s"), tuple(params) if params else None)
        return cur.fetchall() if cur.description is not None else []


class _PgReadTx(Tx):
    """Reads, each one autocommit statement on a pooled connection."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[TupleRow]]) -> None:
        self._pool = pool

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        for retry in (True, False):
            with self._pool.connection() as conn:
                try:
                    return _PgTx(conn).execute(sql, params)
                except psycopg.OperationalError:
                    if not (retry and conn.broken):
                        raise
            # Connections died idle (a server restart): weed out the pool, ask again.
            self._pool.check()
        raise AssertionError("unreachable")


def _configure(conn: psycopg.Connection[TupleRow]) -> None:
    conn.execute(f"SET search_path TO {SCHEMA}")
    conn.commit()


class PostgresLedger(SqlLedger):
    """A ledger in a PostgreSQL database (schema ``marque_ledger``)."""

    def __init__(self, dsn: str, *, pool_size: int = 10) -> None:
        super().__init__()
        self.dsn = dsn
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = make_pool(
            dsn, name="marque-ledger", min_size=1, max_size=pool_size, configure=_configure,
            check_always=True,
        )
        self._pool.wait(timeout=30)
        # Reads are one autocommit statement each (one round trip, no BEGIN or
        # COMMIT), on connections pinged only after sitting idle: a read that
        # fails can simply be asked again, unlike a write mid-transaction.
        self._read_pool: ConnectionPool[psycopg.Connection[TupleRow]] = make_pool(
            dsn, name="marque-ledger-reads", max_size=pool_size, configure=_configure,
            autocommit=True,
        )

    @classmethod
    def create(cls, dsn: str, pilot_id: str) -> PostgresLedger:
        """Create the ledger schema with a fresh incarnation; refuses an existing ledger."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        return cls(dsn)._created(pilot_id)

    @classmethod
    def open(cls, dsn: str) -> PostgresLedger:
        """Open an existing ledger; ``LedgerMissing`` if it holds no incarnation."""
        return cls(dsn)._opened()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        with self._pool.connection() as conn, conn.transaction():
            yield _PgTx(conn)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Tx]:
        yield _PgReadTx(self._read_pool)

    def _has_schema(self) -> bool:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.meta",)).fetchone()
        return bool(row and row[0] is not None)

    def _size_bytes(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (SCHEMA,),
            ).fetchone()
        return int(row[0]) if row else 0

    def _json_array_length(self, column: str) -> str:
        return f"json_array_length({column}::json)"

    def close(self) -> None:
        self._jtis.close()
        self._read_pool.close()
        self._pool.close()
