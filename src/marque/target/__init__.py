"""Target databases: fenced execution and reconciliation by stamps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from marque.dsn import is_postgres, is_sqlite, require_postgres_support, sqlite_path
from marque.errors import InvalidInput
from marque.target.base import Committed, Evidence, StampConflict, Target, TargetAttempt

__all__ = [
    "Committed",
    "Evidence",
    "TargetAttempt",
    "StampConflict",
    "Target",
    "open_target",
    "check_dsn",
]


def check_dsn(dsn: str) -> str:
    """Validate a target DSN's shape; returns it unchanged."""
    if is_sqlite(dsn):
        sqlite_path(dsn)
        return dsn
    if is_postgres(dsn):
        return dsn
    raise InvalidInput("unsupported target DSN: use sqlite:///path or postgresql://…")


def open_target(
    name: str, dsn: str, *, lock_timeout_ms: int = 5_000, statement_timeout_ms: int = 30_000,
    row_keys: Mapping[str, Sequence[str]] | None = None,
) -> Target:
    """The target ``name`` behind ``dsn``; connects lazily, per transaction. ``row_keys``
    are the row keys declared for its tables (pilot.json ``row_keys``)."""
    check_dsn(dsn)
    target: Target
    if is_postgres(dsn):
        require_postgres_support(dsn)
        from marque.target.postgres import PostgresTarget

        target = PostgresTarget(name, dsn, lock_timeout_ms=lock_timeout_ms,
                                statement_timeout_ms=statement_timeout_ms)
    else:
        from marque.target.sqlite import SqliteTarget

        target = SqliteTarget(name, sqlite_path(dsn), lock_timeout_ms=lock_timeout_ms)
    if row_keys:
        target.row_keys = MappingProxyType({t: tuple(c) for t, c in row_keys.items()})
    return target
