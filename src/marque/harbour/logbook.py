"""The logbook: an append-only, hash-chained journal of what happened.

Each entry's hash covers the previous entry's hash and the entry's canonical
JSON, so an edited, removed or reordered entry breaks the chain, and
:meth:`Logbook.check` names the first entry at which it breaks, by its
``seq``. Appends are idempotent on a caller-chosen key — an outcome report
retried after a lost acknowledgement lands once. Embedded deployments keep it
in a SQLite file in the Pilot's home; the Harbourmaster keeps the same journal
for many Pilots.

The file's schema is versioned (``logbook_meta.schema_version``) and moved
forward by :data:`MIGRATIONS` when opened; a logbook written before versions
were recorded holds exactly version 1.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from marque.cid import canonicalize
from marque.errors import HarbourUnavailable, InvalidInput

GENESIS = "0" * 64
#: How long a write waits for another writer of the same file before giving up.
BUSY_TIMEOUT_MS = 30_000

# Forward-only migrations: index i holds the statements that take the schema
# from version i to i + 1. Never edit a released one; append a new one.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE logbook (
    seq INTEGER PRIMARY KEY,
    entry_key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    at REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL)""",
    ],
]

_META_DDL = "CREATE TABLE IF NOT EXISTS logbook_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def entry_hash(prev_hash: str, kind: str, key: str, body: dict[str, Any], at: float) -> str:
    """The chained hash of one entry: SHA-256 of the JCS of ``{prev, kind, key, body, at}``."""
    preimage = canonicalize({"prev": prev_hash, "kind": kind, "key": key, "body": body, "at": at})
    return hashlib.sha256(preimage).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    """Where a logbook's chain stops holding: the first broken entry's ``seq``, and why."""

    seq: int
    reason: str


class Logbook:
    """A hash-chained journal in one SQLite file."""

    def __init__(self, path: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                         timeout=busy_timeout_ms / 1000)
        except sqlite3.Error as exc:
            raise self._unavailable(exc, "be opened") from exc
        try:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self.schema_version = self._migrate()
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._unavailable(exc, "be opened") from exc
            raise

    # -- schema -------------------------------------------------------------------

    def _stored_version(self) -> tuple[int, bool]:
        """The schema version the file holds (0 for a new file), and whether it says so."""
        tables = {row[0] for row in self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "logbook_meta" in tables:
            row = self._conn.execute(
                "SELECT value FROM logbook_meta WHERE key = 'schema_version'").fetchone()
            if row is not None:
                return int(row[0]), True
        # Made before versions were recorded: its one table is exactly version 1.
        return (1 if "logbook" in tables else 0), False

    def _migrate(self) -> int:
        """Bring the file's schema to the newest version and record it; returns that version."""
        newest = len(MIGRATIONS)
        # Read first: an up-to-date logbook is opened without taking the write lock.
        version, recorded = self._stored_version()
        if version > newest:
            raise HarbourUnavailable(
                f"the logbook {self.path} has schema version {version}, newer than the "
                f"{newest} this Marque knows: it was written by a newer Marque; upgrade "
                "Marque to use it",
                detail={"logbook": self.path, "schema_version": version})
        if version == newest and recorded:
            return version
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            version, _ = self._stored_version()  # another process may have moved it meanwhile
            for index in range(version, newest):
                for statement in MIGRATIONS[index]:
                    self._conn.execute(statement)
            self._conn.execute(_META_DDL)
            self._conn.execute(
                "INSERT INTO logbook_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(newest),),
            )
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        return newest

    # -- appending ----------------------------------------------------------------

    def append(self, kind: str, key: str, body: dict[str, Any]) -> bool:
        """Append an entry once per ``key``; False if that key is already there."""
        return self.append_all([(kind, key, body)]) == 1

    def append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
        """Append entries ``(kind, key, body)`` in one transaction; returns how many were new.

        A logbook that cannot be written (another writer holds it past the busy
        timeout, the disk refuses) raises :class:`HarbourUnavailable` and
        appends nothing.
        """
        with self._lock:
            try:
                return self._append_all(entries)
            except sqlite3.Error as exc:
                raise self._unavailable(exc, "be written") from exc

    def _append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
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
            self._conn.execute("COMMIT")
        except BaseException:
            # Also after a failed COMMIT: the connection must not stay in a transaction.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        return added

    # -- reading and verifying ----------------------------------------------------------

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

    def check(self) -> ChainBreak | None:
        """Walk the chain from its first entry; the first entry where it breaks, or None.

        Entries are numbered 1, 2, 3… without gaps, each ``prev_hash`` is the
        hash of the entry before it, and each entry hashes to its ``hash``. An
        entry edited in place is named itself; a removed entry is named by the
        ``seq`` it had; moved entries are named by the first ``seq`` that holds
        the wrong one. An entry edited *and* re-hashed is caught one entry
        later, where the next entry's ``prev_hash`` no longer matches. Removing
        entries from the end leaves a shorter chain that still holds: only a
        saved head (``seq`` and ``hash``) can tell that.
        """
        expected_seq = 1
        prev = GENESIS
        for seq, key, kind, text, at, prev_hash, digest in self._rows():
            if seq != expected_seq:
                return ChainBreak(expected_seq, f"entry {expected_seq} is missing: removed")
            if prev_hash != prev:
                return ChainBreak(seq, f"entry {seq} does not follow entry {seq - 1}: an "
                                       "entry was removed, moved or rewritten here")
            if _recomputed(prev, kind, key, text, at) != digest:
                return ChainBreak(seq, f"entry {seq} was edited: its content no longer hashes "
                                       "to its recorded hash")
            prev = digest
            expected_seq = seq + 1
        return None

    def first_broken(self) -> int | None:
        """The ``seq`` of the first edited, removed or reordered entry; None if intact."""
        found = self.check()
        return None if found is None else found.seq

    def verify(self) -> bool:
        """Whether the whole chain is intact."""
        return self.check() is None

    def _rows(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(
                "SELECT seq, entry_key, kind, body, at, prev_hash, hash FROM logbook "
                "ORDER BY seq").fetchall()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._conn.close()

    def _unavailable(self, exc: sqlite3.Error, doing: str) -> HarbourUnavailable:
        name = getattr(exc, "sqlite_errorname", None)
        return HarbourUnavailable(
            f"the logbook {self.path} could not {doing} ({exc}); outcome reports stay in "
            "the ledger's outbox and are delivered once it can",
            detail={"logbook": self.path, **({"sqlite_errorname": name} if name else {})},
        )


def _recomputed(prev: str, kind: Any, key: Any, text: Any, at: Any) -> str | None:
    """The hash a stored entry should have; None if its body is not the canonical JSON
    object it was written as (any byte of it changed), or a column holds a foreign type."""
    if not isinstance(text, str):
        return None
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or canonicalize(body).decode() != text:
            return None
        return entry_hash(prev, kind, key, body, at)
    except (ValueError, InvalidInput):
        return None
