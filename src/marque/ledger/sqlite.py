"""The SQLite ledger: the embedded default.

WAL journal with ``synchronous=FULL`` so a claim that returned is on disk
before anything touches the target. One connection per ledger object, one
writer at a time (a process-wide lock; ``BEGIN IMMEDIATE`` and a busy timeout
between processes), which is what SQLite allows anyway.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from marque.errors import LedgerMissing
from marque.ledger.sql import SqlLedger, Tx

BUSY_TIMEOUT_MS = 30_000


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()


class SqliteLedger(SqlLedger):
    """A ledger in one SQLite file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")

    @classmethod
    def create(cls, path: str, pilot_id: str) -> SqliteLedger:
        """Create a new ledger file with a fresh incarnation; refuses an existing ledger."""
        ledger = cls(path)
        try:
            ledger._initialise(pilot_id, time.time())
        except BaseException:
            ledger.close()
            raise
        return ledger

    @classmethod
    def open(cls, path: str) -> SqliteLedger:
        """Open an existing ledger; a missing file is ``LedgerMissing``, never a silent reset."""
        if not os.path.exists(path):
            raise LedgerMissing(
                f"ledger {path} does not exist; a lost ledger is a new incarnation and must be "
                "created deliberately with `marque pilot init`"
            )
        ledger = cls(path)
        try:
            ledger._open_existing()
        except BaseException:
            ledger.close()
            raise
        return ledger

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _has_schema(self) -> bool:
        with self._lock:
            row = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
        return row is not None

    def _size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total

    def close(self) -> None:
        with self._lock:
            self._conn.close()
