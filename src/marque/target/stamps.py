"""The stamp table: its one definition per engine, and its forward migrations.

The stamp table lives in the *target* database, which Marque does not own, so
its version is kept in a table of its own (``marque_versions`` on SQLite,
``marque.versions`` on PostgreSQL: one row per Marque component, here
``stamps``), never in ``PRAGMA user_version`` or anything else the database's
owner may use. Index ``i`` of a ``*_MIGRATIONS`` tuple takes the table from
version ``i`` to ``i + 1``; they only ever move forward.

Version 3 adds the per-row stamps of Effect Sets (``marque_row_stamps`` /
``marque.row_stamps``), keyed by ``(effect_apply_key, row_idempotency_key)``;
version 4 gives them the ``(incarnation, expires_at)`` index the nonce stamps
have had since version 2, so the continuity check reads live row stamps
without scanning every row an Effect Set ever wrote. Version 5 gives the target
its *identity* (``marque_target_identity`` / ``marque.target_identity``): one
row holding a random ``target_id``, made once, with the table. A copy of the
database (a dump restored, a replica promoted) carries it along; another
database never has the same one. The Pilot's ledger remembers which identity
each target name stands for, so a name re-pointed at another database is
noticed before any tombstone is written there (docs/model.md, "A target's
identity").

Stamp tables made before they carried a version row (by older Pilots, or by
hand from DESIGN §3) are adopted: their version is read off their columns
(no ``expires_at``: version 1; with it: version 2), then they move forward
like any other.

Migrations run inside the caller's transaction, which on SQLite holds the
write lock (``BEGIN IMMEDIATE``) and on PostgreSQL takes an advisory lock
first, so two Pilots upgrading one target take turns.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marque.errors import TargetUnavailable
from marque.storage.migrations import Schema, Stored, migrate, migrate_within

if TYPE_CHECKING:  # a SQLite-only Pilot never imports the PostgreSQL driver
    import psycopg
    from psycopg.rows import TupleRow

    PgConn = psycopg.Connection[TupleRow]

#: The stamp table's current version.
VERSION = 5


@dataclass(frozen=True)
class StampTables:
    """Where one engine keeps the stamps in a target: the names the migrations below create.
    A target's tables keep these names for good (renaming one would need a migration)."""

    #: The nonce stamps of DESIGN §3.
    stamps: str
    #: The per-row stamps of Effect Sets (version 3 on).
    row_stamps: str


SQLITE_TABLES = StampTables(stamps="marque_stamps", row_stamps="marque_row_stamps")
POSTGRES_TABLES = StampTables(stamps="marque.stamps", row_stamps="marque.row_stamps")

#: This component's row in the version table.
COMPONENT = "stamps"

SQLITE_VERSIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS marque_versions ("
    " component TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL)"
)
SQLITE_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the stamp row of DESIGN §3.
    (
        "CREATE TABLE marque_stamps ("
        " marque_id TEXT NOT NULL, nonce TEXT NOT NULL, attempt INTEGER NOT NULL,"
        " kind TEXT NOT NULL CHECK (kind IN ('applied', 'tombstone')),"
        " pilot_id TEXT NOT NULL, incarnation TEXT NOT NULL, rows_affected INTEGER,"
        " created_at REAL NOT NULL, PRIMARY KEY (marque_id, nonce))",
    ),
    # 2: stamps carry their marque's expiry, so the start-up continuity check
    #    (DESIGN §5) reads only the stamps of marques still live.
    (
        "ALTER TABLE marque_stamps ADD COLUMN expires_at REAL",
        "CREATE INDEX IF NOT EXISTS marque_stamps_live ON marque_stamps (incarnation, expires_at)",
    ),
    # 3: per-row stamps of Effect Sets (DESIGN §7): one row per (effect_apply_key,
    #    row_idempotency_key) — a row key alone may repeat across members (docs/effects.md,
    #    choice 10) — written in the row's own commit unit, together with its change.
    (
        "CREATE TABLE marque_row_stamps ("
        " effect_apply_key TEXT NOT NULL, row_idempotency_key TEXT NOT NULL,"
        " marque_id TEXT NOT NULL, nonce TEXT NOT NULL, dispatch_attempt INTEGER NOT NULL,"
        " kind TEXT NOT NULL CHECK (kind IN ('applied', 'tombstone')),"
        " pilot_id TEXT NOT NULL, incarnation TEXT NOT NULL, rows_affected INTEGER,"
        " action TEXT CHECK (action IN ('created', 'updated')),"
        " created_at REAL NOT NULL, expires_at REAL,"
        " PRIMARY KEY (effect_apply_key, row_idempotency_key))",
        "CREATE INDEX IF NOT EXISTS marque_row_stamps_nonce ON marque_row_stamps "
        "(marque_id, nonce)",
    ),
    # 4: the start-up continuity check (DESIGN §5) reads the row stamps of one incarnation's
    #    live marques, as migration 2 let it read the nonce stamps: the same index.
    (
        "CREATE INDEX IF NOT EXISTS marque_row_stamps_live ON marque_row_stamps "
        "(incarnation, expires_at)",
    ),
    # 5: the target's identity: one row, made here once, never changed.
    (
        "CREATE TABLE marque_target_identity ("
        " one INTEGER PRIMARY KEY CHECK (one = 1),"
        " target_id TEXT NOT NULL, created_at REAL NOT NULL)",
        "INSERT INTO marque_target_identity (one, target_id, created_at) VALUES "
        "(1, 'tgt_' || lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0)",
    ),
)

POSTGRES_VERSIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS marque.versions ("
    " component TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL)"
)
POSTGRES_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the stamp row of DESIGN §3, in a schema of Marque's own.
    (
        "CREATE SCHEMA IF NOT EXISTS marque",
        "CREATE TABLE marque.stamps ("
        " marque_id TEXT NOT NULL, nonce TEXT NOT NULL, attempt INTEGER NOT NULL,"
        " kind TEXT NOT NULL CHECK (kind IN ('applied', 'tombstone')),"
        " pilot_id TEXT NOT NULL, incarnation TEXT NOT NULL, rows_affected BIGINT,"
        " created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (marque_id, nonce))",
    ),
    # 2: as SQLite's migration 2.
    (
        "ALTER TABLE marque.stamps ADD COLUMN expires_at DOUBLE PRECISION",
        "CREATE INDEX IF NOT EXISTS stamps_live ON marque.stamps (incarnation, expires_at)",
    ),
    # 3: as SQLite's migration 3.
    (
        "CREATE TABLE marque.row_stamps ("
        " effect_apply_key TEXT NOT NULL, row_idempotency_key TEXT NOT NULL,"
        " marque_id TEXT NOT NULL, nonce TEXT NOT NULL, dispatch_attempt INTEGER NOT NULL,"
        " kind TEXT NOT NULL CHECK (kind IN ('applied', 'tombstone')),"
        " pilot_id TEXT NOT NULL, incarnation TEXT NOT NULL, rows_affected BIGINT,"
        " action TEXT CHECK (action IN ('created', 'updated')),"
        " created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,"
        " PRIMARY KEY (effect_apply_key, row_idempotency_key))",
        "CREATE INDEX IF NOT EXISTS row_stamps_nonce ON marque.row_stamps (marque_id, nonce)",
    ),
    # 4: as SQLite's migration 4.
    (
        "CREATE INDEX IF NOT EXISTS row_stamps_live ON marque.row_stamps "
        "(incarnation, expires_at)",
    ),
    # 5: as SQLite's migration 5.
    (
        "CREATE TABLE marque.target_identity ("
        " one INTEGER PRIMARY KEY CHECK (one = 1),"
        " target_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)",
        "INSERT INTO marque.target_identity (one, target_id, created_at) VALUES "
        "(1, 'tgt_' || replace(gen_random_uuid()::text, '-', ''), "
        "extract(epoch FROM clock_timestamp()))",
    ),
)
#: pg_advisory_xact_lock key serialising stamp migrations on one PostgreSQL database.
POSTGRES_LOCK_KEY = 0x6D61_7271_7565_0001


# -- SQLite --------------------------------------------------------------------------------


def sqlite_version(conn: sqlite3.Connection) -> int:
    """The stamp table's version in a SQLite target; 0 if it has no stamp table."""
    tables = {row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "AND name IN ('marque_stamps', 'marque_versions')")}
    if "marque_versions" in tables:
        row = conn.execute(
            "SELECT version FROM marque_versions WHERE component = ?", (COMPONENT,)).fetchone()
        if row is not None:
            return int(row[0])
    if "marque_stamps" not in tables:
        return 0
    columns = {row[1] for row in conn.execute("PRAGMA table_info(marque_stamps)")}
    return 2 if "expires_at" in columns else 1


def migrate_sqlite(conn: sqlite3.Connection, where: str) -> int:
    """Bring a SQLite target's stamp table to :data:`VERSION`, inside the caller's write
    transaction; returns the version it found. ``where`` names the target in errors."""
    return migrate_within(_SqliteStamps(where), conn)


class _SqliteStamps(Schema[sqlite3.Connection]):
    """The stamp table's versions in a SQLite target (``marque_versions``)."""

    latest = VERSION

    def __init__(self, where: str) -> None:
        self.where = where

    def stored(self, conn: sqlite3.Connection) -> Stored:
        return Stored(sqlite_version(conn))

    def step(self, conn: sqlite3.Connection, index: int) -> None:
        for statement in SQLITE_MIGRATIONS[index]:
            conn.execute(statement)

    def record(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute(SQLITE_VERSIONS_DDL)
        conn.execute(
            "INSERT INTO marque_versions (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            (COMPONENT, version),
        )

    def newer(self, found: int) -> Exception:
        return _too_new(found, self.where)


# -- PostgreSQL ----------------------------------------------------------------------------


def postgres_version(conn: PgConn) -> int:
    """The stamp table's version in a PostgreSQL target; 0 if it has no stamp table."""
    row = conn.execute(
        "SELECT to_regclass('marque.versions') IS NOT NULL, "
        "to_regclass('marque.stamps') IS NOT NULL").fetchone()
    has_versions, has_stamps = (bool(row[0]), bool(row[1])) if row else (False, False)
    if has_versions:
        found = conn.execute(
            "SELECT version FROM marque.versions WHERE component = %s", (COMPONENT,)).fetchone()
        if found is not None:
            return int(found[0])
    if not has_stamps:
        return 0
    column = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = 'marque' "
        "AND table_name = 'stamps' AND column_name = 'expires_at'").fetchone()
    return 2 if column else 1


def migrate_postgres(conn: PgConn, where: str) -> int:
    """Bring a PostgreSQL target's stamp table to :data:`VERSION` in one transaction of
    its own (``conn`` is in autocommit); returns the version it found (read first, the
    common case, without taking any lock)."""
    return migrate(_PostgresStamps(where), lambda: contextlib.nullcontext(conn),
                   lambda: _transaction(conn))


@contextlib.contextmanager
def _transaction(conn: PgConn) -> Iterator[PgConn]:
    with conn.transaction():
        yield conn


class _PostgresStamps(Schema["PgConn"]):
    """The stamp table's versions in a PostgreSQL target (``marque.versions``)."""

    latest = VERSION

    def __init__(self, where: str) -> None:
        self.where = where

    def stored(self, conn: PgConn) -> Stored:
        return Stored(postgres_version(conn))

    def lock(self, conn: PgConn) -> None:
        # Another Pilot upgrading the same target waits here, then finds it moved.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (POSTGRES_LOCK_KEY,))

    def step(self, conn: PgConn, index: int) -> None:
        for statement in POSTGRES_MIGRATIONS[index]:
            conn.execute(statement)

    def record(self, conn: PgConn, version: int) -> None:
        conn.execute(POSTGRES_VERSIONS_DDL)
        conn.execute(
            "INSERT INTO marque.versions (component, version) VALUES (%s, %s) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            (COMPONENT, version),
        )

    def newer(self, found: int) -> Exception:
        return _too_new(found, self.where)


SQLITE_IDENTITY = "SELECT target_id FROM marque_target_identity WHERE one = 1"
POSTGRES_IDENTITY = "SELECT target_id FROM marque.target_identity WHERE one = 1"


def _too_new(found: int, where: str) -> TargetUnavailable:
    return TargetUnavailable(
        f"the stamp table of target {where} is at version {found}, newer than this Pilot "
        f"understands (up to {VERSION}): another, newer Marque upgraded it. Upgrade Marque "
        "on this Pilot; nothing was sent to the target",
        detail={"stamps_version": found, "supported": VERSION},
    )
