"""The logbook: an append-only, hash-chained journal of what happened.

Each entry's hash covers the previous entry's hash and the entry's canonical
JSON, so an edited or removed entry breaks the chain. Appends are idempotent
on a caller-chosen key — an outcome report retried after a lost
acknowledgement lands once. Embedded deployments keep it in a SQLite file in
the Pilot's home; the Harbourmaster keeps the same journal for many Pilots.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from typing import Any

from marque.cid import canonicalize

GENESIS = "0" * 64

_DDL = """CREATE TABLE IF NOT EXISTS logbook (
    seq INTEGER PRIMARY KEY,
    entry_key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    at REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL)"""


def entry_hash(prev_hash: str, kind: str, key: str, body: dict[str, Any], at: float) -> str:
    """The chained hash of one entry."""
    preimage = canonicalize({"prev": prev_hash, "kind": kind, "key": key, "body": body, "at": at})
    return hashlib.sha256(preimage).hexdigest()


class Logbook:
    """A hash-chained journal in one SQLite file."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                     timeout=30)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.execute(_DDL)

    def append(self, kind: str, key: str, body: dict[str, Any]) -> bool:
        """Append an entry once per ``key``; False if that key is already there."""
        return self.append_all([(kind, key, body)]) == 1

    def append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
        """Append entries ``(kind, key, body)`` in one transaction; returns how many were new."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._conn.execute(
                    "SELECT hash FROM logbook ORDER BY seq DESC LIMIT 1"
                ).fetchone()
                prev = row[0] if row else GENESIS
                added = 0
                for kind, key, body in entries:
                    if self._conn.execute(
                        "SELECT 1 FROM logbook WHERE entry_key = ?", (key,)
                    ).fetchone():
                        continue  # a retried report: it is already here
                    at = round(time.time(), 6)
                    digest = entry_hash(prev, kind, key, body, at)
                    self._conn.execute(
                        "INSERT INTO logbook (entry_key, kind, body, at, prev_hash, hash) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (key, kind, canonicalize(body).decode(), at, prev, digest),
                    )
                    prev = digest
                    added += 1
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return added

    def entries(self, kind_prefix: str = "") -> list[dict[str, Any]]:
        """Entries in order, optionally only those whose kind starts with ``kind_prefix``."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, entry_key, kind, body, at, prev_hash, hash FROM logbook "
                "WHERE kind LIKE ? ORDER BY seq",
                (kind_prefix + "%",),
            ).fetchall()
        return [
            {"seq": r[0], "key": r[1], "kind": r[2], "body": json.loads(r[3]), "at": r[4],
             "prev_hash": r[5], "hash": r[6]}
            for r in rows
        ]

    def verify(self) -> bool:
        """Whether the whole chain is intact."""
        prev = GENESIS
        for entry in self.entries():
            if entry["prev_hash"] != prev:
                return False
            if entry_hash(prev, entry["kind"], entry["key"], entry["body"], entry["at"]) != \
                    entry["hash"]:
                return False
            prev = entry["hash"]
        return True

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()
