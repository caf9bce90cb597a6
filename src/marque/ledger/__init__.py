"""The execution ledger: interface, SQL implementation, and the engines behind it."""

from __future__ import annotations

from marque.dsn import is_postgres, is_sqlite, require_postgres_support, sqlite_path
from marque.errors import InvalidInput
from marque.ledger.base import (
    AttemptRecord,
    Claim,
    ClaimTicket,
    Ledger,
    Observed,
    OutboxEntry,
)

__all__ = [
    "AttemptRecord",
    "Claim",
    "ClaimTicket",
    "Ledger",
    "Observed",
    "OutboxEntry",
    "create_ledger",
    "open_ledger",
]


def create_ledger(dsn: str, pilot_id: str) -> Ledger:
    """Create a new ledger (fresh incarnation) at ``dsn``; refuses an existing one."""
    if is_sqlite(dsn):
        from marque.ledger.sqlite import SqliteLedger

        return SqliteLedger.create(sqlite_path(dsn), pilot_id)
    if is_postgres(dsn):
        require_postgres_support(dsn)
        from marque.ledger.postgres import PostgresLedger

        return PostgresLedger.create(dsn, pilot_id)
    raise InvalidInput("unsupported ledger DSN: use sqlite:///path or postgresql://…")


def open_ledger(dsn: str) -> Ledger:
    """Open the existing ledger at ``dsn``."""
    if is_sqlite(dsn):
        from marque.ledger.sqlite import SqliteLedger

        return SqliteLedger.open(sqlite_path(dsn))
    if is_postgres(dsn):
        require_postgres_support(dsn)
        from marque.ledger.postgres import PostgresLedger

        return PostgresLedger.open(dsn)
    raise InvalidInput("unsupported ledger DSN: use sqlite:///path or postgresql://…")
