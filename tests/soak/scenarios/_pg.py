"""What the PostgreSQL rows (2–6) share: a target database, marques of several statements,
setup SQL, lock holders and a look at the server's own sessions.

:class:`SoakWorld` makes the ``effects`` table and one-statement marques; the
PostgreSQL rows need more: a marque that updates a contended row *and* inserts
its effect row, at an isolation level, with its own statement timeout and
``max_rows``; triggers that fail with a chosen SQLSTATE; a row locked by a
session of the harness; private clusters the scenario may crash. Everything
here is real: psycopg sessions on real servers, real marques from the world's
issuer. The effect row stays the one thing the checker counts, so every
operation's marque still inserts exactly one ``effects`` row tagged with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from support.pgcluster import PgCluster, create_database

from marque.change import Budget, Change, Statement
from marque.pilot.setup import add_target
from marque.token import issue_marque, public_jwk, unverified_claims
from soak.world import TARGET, Op, SoakWorld

__all__ = ["EFFECT", "LockHolder", "attempts_of", "backends", "effect", "fresh_database", "query",
           "pg_op", "point_target", "private_cluster", "run_sql", "stamps_of"]

#: The effect row every operation inserts (psycopg placeholders: a PostgreSQL target).
EFFECT = "INSERT INTO effects (op, at) VALUES (%s, 0)"


def effect(name: str) -> tuple[str, tuple[Any, ...]]:
    """The effect statement of operation ``name``."""
    return EFFECT, (name,)


def fresh_database(admin_dsn: str) -> str:
    """A new empty database on the server of ``admin_dsn``; its DSN."""
    return create_database(admin_dsn)[1]


@contextmanager
def private_cluster() -> Iterator[PgCluster]:
    """A throwaway server of the scenario's own, which it may crash and restart."""
    cluster = PgCluster(max_connections=100).init().start()
    try:
        yield cluster
    finally:
        cluster.destroy()


def run_sql(dsn: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    """Run setup statements, each in its own autocommit transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            sql, params = statement if isinstance(statement, tuple) else (statement, None)
            conn.execute(sql, params)  # type: ignore[arg-type]


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql, params or None).fetchall())  # type: ignore[arg-type]


def pg_op(world: SoakWorld, name: str, statements: Sequence[tuple[str, tuple[Any, ...]]], *,
          isolation: str = "read_committed", statement_timeout_ms: int | None = None,
          executions: int = 1, attempts: int = 3, max_rows: int | None = None,
          ttl_seconds: int = 3600) -> Op:
    """An operation whose marque runs ``statements`` in order (one of them its effect row).

    ``max_rows`` defaults to the number of statements: each affects (or returns) one row.
    """
    change = Change(tuple(Statement(sql, params) for sql, params in statements),
                    isolation=isolation, statement_timeout_ms=statement_timeout_ms)
    token = issue_marque(
        world.issuer, pilot_id=world.pilot_id, incarnation=world.incarnation, target=TARGET,
        holder_jwk=public_jwk(world.holder), change=change,
        budget=Budget(executions, len(statements) if max_rows is None else max_rows, attempts),
        ttl_seconds=ttl_seconds, subject="soak")
    claims = unverified_claims(token) or {}
    return Op(name, token, str(claims["jti"]), executions)


def point_target(world: SoakWorld, dsn: str) -> None:
    """Make the Pilot reach its target through ``dsn`` (a proxy), or directly again."""
    add_target(world.home, TARGET, dsn)


def backends(dsn: str, like: str, *, waiting: bool | None = None) -> int:
    """Sessions on the server running a query matching ``like`` (not this one), optionally
    only those waiting for a lock."""
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s "
           "AND pid <> pg_backend_pid() AND state = 'active'")
    if waiting is not None:
        sql += " AND wait_event_type " + ("= 'Lock'" if waiting else "IS DISTINCT FROM 'Lock'")
    [(count,)] = query(dsn, sql, (like,))
    return int(count)


def stamps_of(dsn: str, marque_id: str) -> list[tuple[str, int, str]]:
    """``(nonce, attempt, kind)`` of every stamp the target holds for one marque."""
    return [(n, int(a), k) for n, a, k in query(
        dsn, "SELECT nonce, attempt, kind FROM marque.stamps WHERE marque_id = %s "
             "ORDER BY nonce", (marque_id,))]


def attempts_of(world: SoakWorld) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every attempt the ledger holds now: (marque_id, nonce, attempt) → status, error."""
    from soak.checker import final_state

    return final_state(world).attempts


class LockHolder:
    """A session of the harness holding a transaction open (and what it locked)."""

    def __init__(self, dsn: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
        self.conn = psycopg.connect(dsn, autocommit=False)
        for statement in statements:
            sql, params = statement if isinstance(statement, tuple) else (statement, None)
            self.conn.execute(sql, params)  # type: ignore[arg-type]
        [(self.pid,)] = self.conn.execute("SELECT pg_backend_pid()").fetchall()

    def release(self, *, commit: bool = True) -> None:
        """End the transaction (its locks go with it) and close the session."""
        try:
            if commit:
                self.conn.commit()
            else:
                self.conn.rollback()
        finally:
            self.conn.close()

    def blocking(self, dsn: str) -> int:
        """How many sessions wait for a lock this session holds."""
        [(count,)] = query(dsn, "SELECT count(*) FROM pg_stat_activity "
                                "WHERE %s = ANY(pg_blocking_pids(pid))", (self.pid,))
        return int(count)


def check_first_attempts(world: SoakWorld, expected: dict[str, tuple[str, str, str]],
                         violations: list[str]) -> None:
    """Attempt 1 of each marque in ``expected`` ended ``(status, code, sqlstate)`` in the
    ledger: the error the target answered with is recorded, with its SQLSTATE."""
    held = {m: a for (m, _, number), a in attempts_of(world).items() if number == 1}
    for marque_id, (status, code, sqlstate) in sorted(expected.items()):
        attempt = held.get(marque_id)
        error = (attempt or {}).get("error") or {}
        found = ((attempt or {}).get("status"), error.get("code"), error.get("sqlstate"))
        if found != (status, code, sqlstate):
            violations.append(f"{marque_id}: attempt 1 recorded {found}, expected "
                              f"{(status, code, sqlstate)}")
