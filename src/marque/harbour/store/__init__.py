"""The Harbourmaster's store: one interface, SQLite and PostgreSQL siblings (DESIGN §11)."""

from __future__ import annotations

from marque.dsn import is_postgres, is_sqlite, require_postgres_support, sqlite_path
from marque.errors import InvalidInput
from marque.harbour.store.base import (
    AdoptedConfig,
    Checkpoint,
    ConsoleSession,
    HarbourStore,
    LogbookEntry,
    PilotRecord,
    Report,
    RequestDraft,
    Resolution,
    StoredRequest,
)

__all__ = [
    "Checkpoint",
    "ConsoleSession",
    "HarbourStore",
    "LogbookEntry",
    "PilotRecord",
    "Report",
    "StoredRequest",
    "RequestDraft",
    "Resolution",
    "AdoptedConfig",
    "create_store",
    "open_store",
]


def create_store(dsn: str) -> HarbourStore:
    """Create a new store at ``dsn`` (``sqlite:///path`` or ``postgresql://…``)."""
    if is_sqlite(dsn):
        from marque.harbour.store.sqlite import SqliteHarbourStore

        return SqliteHarbourStore.create(sqlite_path(dsn))
    if is_postgres(dsn):
        require_postgres_support(dsn)
        from marque.harbour.store.postgres import PostgresHarbourStore

        return PostgresHarbourStore.create(dsn)
    raise InvalidInput("unsupported store DSN: use sqlite:///path or postgresql://…")


def open_store(dsn: str) -> HarbourStore:
    """Open the existing store at ``dsn``."""
    if is_sqlite(dsn):
        from marque.harbour.store.sqlite import SqliteHarbourStore

        return SqliteHarbourStore.open(sqlite_path(dsn))
    if is_postgres(dsn):
        require_postgres_support(dsn)
        from marque.harbour.store.postgres import PostgresHarbourStore

        return PostgresHarbourStore.open(dsn)
    raise InvalidInput("unsupported store DSN: use sqlite:///path or postgresql://…")
