"""The SQLite Harbourmaster store: the default, one file in the Harbourmaster's home.

WAL journal with ``synchronous=FULL``. Each store transaction takes its own
connection from a small free list and opens with ``BEGIN IMMEDIATE``, so
writers — threads of this process or other processes on the same file — take
turns on SQLite's write lock (waiting up to the busy timeout) and every
constraint and compare-and-set is decided by the database, not by this
process. Reads open a deferred transaction: one consistent snapshot.

Driver errors leave typed, by ``sqlite_errorname``: a broken constraint is
:class:`~marque.errors.Conflict`; anything else (locked past the timeout,
unwritable, not a database) is :class:`~marque.errors.HarbourUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from marque.errors import Conflict, HarbourUnavailable, InvalidInput, NotFound
from marque.harbour.store.sql import SqlHarbourStore
from marque.storage import sqlite as sqlite_files
from marque.storage.tx import Tx

#: How long a write waits for another writer of the same file before giving up.
BUSY_TIMEOUT_MS = 30_000
#: Idle connections kept for reuse.
KEEP_IDLE = 8


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()


class SqliteHarbourStore(SqlHarbourStore):
    """A Harbourmaster store in one SQLite file."""

    engine = "sqlite"

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._idle: list[sqlite3.Connection] = []
        # Guards only the free list of connections; the database decides everything else.
        self._idle_lock = threading.Lock()
        self._closed = False

    @classmethod
    def create(cls, path: str, *, now: float | None = None) -> SqliteHarbourStore:
        """Create a new store file; refuses one that already holds a store."""
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise InvalidInput(f"cannot create the Harbourmaster store {path}: its directory "
                               f"{directory} does not exist")
        return cls(path)._created(now)

    @classmethod
    def create_at_version(cls, path: str, version: int) -> SqliteHarbourStore:
        """A new store left at an older schema ``version`` (for migration tests)."""
        return cls(path)._created(upto=version)

    @classmethod
    def open(cls, path: str) -> SqliteHarbourStore:
        """Open an existing store, migrating its schema forward; ``NotFound`` if missing."""
        if not os.path.exists(path):
            raise NotFound(f"no Harbourmaster store at {path}; create one with "
                           "`marque harbour init`", detail={"path": path})
        return cls(path)._opened()

    # -- connections -----------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        return sqlite_files.connect(self.path, busy_timeout_ms=BUSY_TIMEOUT_MS)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise HarbourUnavailable(f"the Harbourmaster store {self.path} is closed")
        with self._idle_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        finally:
            with self._idle_lock:
                keep = not self._closed and len(self._idle) < KEEP_IDLE \
                    and not conn.in_transaction
                if keep:
                    self._idle.append(conn)
            if not keep:
                conn.close()

    @contextlib.contextmanager
    def _begin(self, statement: str) -> Iterator[Tx]:
        try:
            with self._connection() as conn:
                conn.execute(statement)
                yield _SqliteTx(conn)
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise store_error(self.path, exc) from exc

    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        return self._begin("BEGIN IMMEDIATE")

    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        return self._begin("BEGIN")

    def _has_schema(self) -> bool:
        with self.reading() as tx:
            row = tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'")
        return row is not None

    def close(self) -> None:
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def store_error(path: str, exc: sqlite3.Error) -> Conflict | HarbourUnavailable:
    """A driver error on the store file, as the most specific typed error (by error name)."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    detail = {"sqlite_errorname": name or None, "path": path}
    if name.startswith("SQLITE_CONSTRAINT"):
        return Conflict(f"the Harbourmaster store refused a write ({name}): "
                        f"{' '.join(str(exc).split())}", detail=detail)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        what = (f"stayed locked by another process for more than {BUSY_TIMEOUT_MS // 1000} s")
    elif name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT"):
        what = f"is not a usable database ({name}); restore it from a backup"
    else:
        what = f"could not be used ({name or 'no error name'}: {' '.join(str(exc).split())})"
    return HarbourUnavailable(f"the Harbourmaster store {path} {what}", detail=detail)

