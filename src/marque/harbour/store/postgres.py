"""The PostgreSQL Harbourmaster store: the same SQL as SQLite's, for shared deployments.

Several ``harbour serve`` processes may share one store (DESIGN §11): every
invariant is a constraint or a compare-and-set, which PostgreSQL decides under
READ COMMITTED — ``INSERT … ON CONFLICT DO NOTHING`` waits for a concurrent
insert of the same key, and a conditional ``UPDATE`` re-checks its ``WHERE``
on the newest row version after waiting for its lock.

Tables live in their own schema (``marque_harbour``) so the store can share a
database with anything else. Each store transaction is one pooled connection
inside ``conn.transaction()``. Driver errors leave typed: a broken constraint
(SQLSTATE class 23) is :class:`~marque.errors.Conflict`, anything else
:class:`~marque.errors.HarbourUnavailable`, both carrying the SQLSTATE and
naming the server, never the password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from marque.dsn import describe
from marque.errors import Conflict, HarbourUnavailable
from marque.harbour.store.sql import SqlHarbourStore
from marque.storage.pgpool import CONNECT_TIMEOUT_SECONDS, connection, make_pool, reason
from marque.storage.tx import Tx

SCHEMA = "marque_harbour"


class _PgTx(Tx):
    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Our own statements never hold a literal '%' or '?' other than placeholders.
        cur = self._conn.execute(sql.replace("?", "%s"), tuple(params) if params else None)
        return cur.fetchall() if cur.description is not None else []


def _configure(conn: psycopg.Connection[TupleRow]) -> None:
    conn.execute(f"SET search_path TO {SCHEMA}")
    conn.commit()


class PostgresHarbourStore(SqlHarbourStore):
    """A Harbourmaster store in a PostgreSQL database (schema ``marque_harbour``)."""

    engine = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 10) -> None:
        super().__init__()
        self.dsn = dsn
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = make_pool(
            dsn, name="marque-harbour", min_size=1, max_size=pool_size, configure=_configure,
            check_always=True)

    @classmethod
    def _with_schema(cls, dsn: str) -> PostgresHarbourStore:
        try:
            with psycopg.connect(dsn, autocommit=True,
                                 connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        except psycopg.Error as exc:
            raise store_error(dsn, exc) from exc
        return cls(dsn)

    @classmethod
    def create(cls, dsn: str, *, now: float | None = None) -> PostgresHarbourStore:
        """Create the store's schema and identity; refuses a database that holds one."""
        return cls._with_schema(dsn)._created(now)

    @classmethod
    def create_at_version(cls, dsn: str, version: int) -> PostgresHarbourStore:
        """A new store left at an older schema ``version`` (for migration tests)."""
        return cls._with_schema(dsn)._created(upto=version)

    @classmethod
    def open(cls, dsn: str) -> PostgresHarbourStore:
        """Open an existing store, migrating its schema forward; ``NotFound`` if none."""
        return cls(dsn)._opened()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Tx]:
        try:
            with connection(self._pool, self.dsn) as conn, conn.transaction():
                yield _PgTx(conn)
        except psycopg.Error as exc:
            raise store_error(self.dsn, exc) from exc

    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        return self._transaction()

    def _has_schema(self) -> bool:
        with self.reading() as tx:
            row = tx.one("SELECT to_regclass(?)", (f"{SCHEMA}.meta",))
        return bool(row and row[0] is not None)

    def close(self) -> None:
        self._pool.close()


def store_error(dsn: str, exc: psycopg.Error) -> Conflict | HarbourUnavailable:
    """A driver error of the store, as the typed error an operator can act on."""
    server = describe(dsn)
    detail = {"server": server}
    if exc.sqlstate is not None and exc.sqlstate.startswith("23"):
        return Conflict(f"the Harbourmaster store refused a write: {reason(exc)}",
                        sqlstate=exc.sqlstate, detail=detail)
    return HarbourUnavailable(
        f"the Harbourmaster store at {server} is unavailable: {reason(exc)}. Check that "
        "PostgreSQL is running there and accepts the Harbourmaster's connections, then retry",
        sqlstate=exc.sqlstate, detail=detail)
