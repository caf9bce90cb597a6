"""Opening a SQLite file the way every Marque store needs it: durable, and shared.

Every store file (ledger, Harbourmaster store, logbook) runs in WAL mode with
``synchronous=FULL``, so a commit that returned is on disk and survives power
loss, and readers never block the writer. Connections are in autocommit mode
(``isolation_level=None``): each store opens its own transactions, explicitly.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator


def connect(path: str, *, busy_timeout_ms: int, wal: bool = True,
            cached_statements: int = 128) -> sqlite3.Connection:
    """A connection to ``path`` with ``synchronous=FULL`` and a busy timeout, usable from any
    thread; in WAL mode unless ``wal`` is False (a caller that must look at the file
    first, or set a pragma that only takes before WAL, calls :func:`use_wal` itself).
    Closed again if a pragma fails."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           timeout=busy_timeout_ms / 1000, cached_statements=cached_statements)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if wal:
            use_wal(conn)
        conn.execute("PRAGMA synchronous = FULL")
    except BaseException:
        conn.close()
        raise
    return conn


def use_wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode (it stays so for every later connection)."""
    conn.execute("PRAGMA journal_mode = WAL")


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction (``BEGIN IMMEDIATE``: the writer's lock from the start) that
    commits on success and rolls back on any error, a failed ``COMMIT`` included."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # Also after a failed COMMIT: the connection must not stay in a transaction.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
