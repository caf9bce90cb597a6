"""Is a target there? A probe for ``target add``, before any marque depends on it.

A target that cannot be reached is found when it is added, not when an
execution has already claimed a nonce. The probe only connects and asks the
engine one harmless question; it creates nothing (no stamp table, no file)
and reads no user data.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from marque.dsn import describe, is_postgres, is_sqlite, require_postgres_support, sqlite_path
from marque.errors import TargetUnavailable

#: Seconds a PostgreSQL probe waits for a connection (libpq's minimum is 2).
PROBE_CONNECT_TIMEOUT = 3
_AFTER = "; add it with --no-check if it is down on purpose"


def check_reachable(name: str, dsn: str) -> None:
    """Raise ``TargetUnavailable`` unless target ``name`` at ``dsn`` (resolved) answers."""
    if is_sqlite(dsn):
        _check_sqlite(name, Path(sqlite_path(dsn)))
    elif is_postgres(dsn):
        _check_postgres(name, dsn)


def _check_sqlite(name: str, path: Path) -> None:
    if not path.parent.is_dir():
        raise TargetUnavailable(
            f"target {name}: the directory {path.parent} does not exist" + _AFTER)
    if not path.exists():
        raise TargetUnavailable(
            f"target {name}: {path} does not exist; create the database first (the Pilot "
            "never creates a target)" + _AFTER)
    if not path.is_file():
        raise TargetUnavailable(f"target {name}: {path} is not a file" + _AFTER)
    if not os.access(path, os.R_OK | os.W_OK):
        raise TargetUnavailable(
            f"target {name}: {path} is not readable and writable by this user" + _AFTER)
    try:
        # Read-only and by URI, so the probe can never create or change the file.
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        errorname = getattr(exc, "sqlite_errorname", None)
        if errorname == "SQLITE_BUSY":
            return  # someone holds a lock: the file is a database, and it is there
        what = ("is not a SQLite database" if errorname == "SQLITE_NOTADB"
                else f"cannot be opened ({errorname or type(exc).__name__})")
        raise TargetUnavailable(f"target {name}: {path} {what}" + _AFTER,
                                detail={"sqlite_errorname": errorname}) from exc


def _check_postgres(name: str, dsn: str) -> None:
    require_postgres_support(dsn)
    import psycopg  # only a PostgreSQL target pays for the driver

    try:
        with psycopg.connect(dsn, connect_timeout=PROBE_CONNECT_TIMEOUT,
                             autocommit=True) as conn:
            conn.execute("SELECT 1").fetchone()
    except psycopg.Error as exc:
        # The driver's own reason (refused, unknown host, authentication): one line, no DSN.
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TargetUnavailable(
            f"target {name}: cannot connect to {describe(dsn)}: {reason}" + _AFTER,
            sqlstate=exc.sqlstate,
        ) from exc


def probe_table(name: str, dsn: str, table: str) -> dict[str, Any] | None:
    """Target ``name``'s table ``table`` as :func:`marque.target.sqlite.table_shape` (or its
    PostgreSQL sibling) gives it, read-only; ``TargetUnavailable`` if the target does not
    answer. Nothing is created or changed."""
    check_reachable(name, dsn)
    if is_sqlite(dsn):
        from marque.target.sqlite import table_shape

        try:
            conn = sqlite3.connect(f"file:{sqlite_path(dsn)}?mode=ro", uri=True, timeout=1.0)
        except sqlite3.Error as exc:
            raise TargetUnavailable(f"target {name}: {sqlite_path(dsn)} cannot be opened "
                                    f"({type(exc).__name__})") from exc
        try:
            return table_shape(conn, table)
        finally:
            conn.close()
    import psycopg

    from marque.target.postgres import table_shape as pg_table_shape
    from marque.target.row_images import ImageUnavailable

    try:
        with psycopg.connect(dsn, connect_timeout=PROBE_CONNECT_TIMEOUT,
                             autocommit=True) as pg:
            return pg_table_shape(pg, table)
    except ImageUnavailable as exc:  # the catalog query itself failed (a permission…)
        raise TargetUnavailable(f"target {name}: cannot read the table {table} at "
                                f"{describe(dsn)}: {exc}") from exc
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TargetUnavailable(f"target {name}: cannot read the table {table} at "
                                f"{describe(dsn)}: {reason}", sqlstate=exc.sqlstate) from exc
