"""The Pilot's embedded logbook: the Harbourmaster's hash chain, kept in one SQLite file.

A Pilot without a Harbourmaster still journals what happened — outcome
reports, previews, findings — in ``logbook.sqlite3`` in its home. Its entries
are chained exactly as the Harbourmaster's (:mod:`marque.logbook.chain`,
DESIGN §11.6): ``{seq, at, kind, actor, subject, body, prev_hash}`` and
``hash``, with ``actor`` the Pilot's id (``"pilot"`` when the body does not
say) and ``subject`` the marque the entry is about, when its body names one.
:meth:`Logbook.check` names the first edited, removed or reordered entry by its
``seq``, and with a saved head also a cut-off or rewritten tail.

**The idempotency key.** Appends are idempotent on a caller-chosen key, so an
outcome report retried after a lost acknowledgement lands once. The key is
kept in its own ``entry_key`` column, whose ``UNIQUE`` constraint *is* the
deduplication, and is also hashed: it is copied into the stored body as the
member ``logbook_key``, and an entry verifies only if that member equals the
column. It is not left outside the hash because it decides whether a later
report is written at all: a key edited unseen to that of a report still to
come would silently swallow that report (and the outbox, told it landed,
would drop it). It is not a chain field of its own because the chain's fields
are the same for every store, and the Harbourmaster's logbook has no such key.
:meth:`Logbook.entries` hands callers their body without it.

**Older files.** The schema is versioned (``logbook_meta.schema_version``)
and moved forward by :data:`MIGRATIONS` when a file is opened; a file written
before versions were recorded holds exactly version 1. Schema 1 hashed
entries differently (:func:`legacy_entry_hash`, over ``{prev, kind, key,
body, at}``). Migration 2 never rewrites a row: each row records the format
it was chained in (``chain_format``, 1 for every row already there), rows of
format 1 are checked with the legacy preimage, and the first new row chains
onto the last old row's hash, so one walk verifies the whole file. A row of
format 1 after one of format 2 is a break: the old format is never written
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from typing import Any

from marque.cid import canonicalize
from marque.errors import HarbourUnavailable, InvalidInput
from marque.logbook import chain
from marque.logbook.chain import GENESIS, BreakKind, ChainBreak
from marque.storage import sqlite as sqlite_files
from marque.storage.migrations import Schema, Stored, migrate

__all__ = [
    "BUSY_TIMEOUT_MS",
    "GENESIS",
    "KEY_MEMBER",
    "MIGRATIONS",
    "BreakKind",
    "ChainBreak",
    "Logbook",
    "legacy_entry_hash",
]

#: How long a write waits for another writer of the same file before giving up.
BUSY_TIMEOUT_MS = 30_000
#: The body member that carries an entry's idempotency key under the hash.
KEY_MEMBER = "logbook_key"
#: The actor of an entry whose body does not name its Pilot.
DEFAULT_ACTOR = "pilot"

#: ``chain_format`` of a row: schema 1's preimage, and the shared chain's.
LEGACY_FORMAT = 1
CHAIN_FORMAT = 2

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
    [
        # The shared chain's fields; rows already there keep NULL and format 1.
        "ALTER TABLE logbook ADD COLUMN actor TEXT",
        "ALTER TABLE logbook ADD COLUMN subject TEXT",
        "ALTER TABLE logbook ADD COLUMN chain_format INTEGER NOT NULL DEFAULT 1",
    ],
]

_META_DDL = "CREATE TABLE IF NOT EXISTS logbook_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_COLUMNS = "seq, entry_key, kind, actor, subject, body, at, prev_hash, hash, chain_format"


def legacy_entry_hash(prev_hash: str, kind: str, key: str, body: dict[str, Any], at: float) -> str:
    """Schema 1's entry hash: SHA-256 of the JCS of ``{prev, kind, key, body, at}``.

    Only for checking rows written before migration 2; nothing new is hashed so.
    """
    preimage = canonicalize({"prev": prev_hash, "kind": kind, "key": key, "body": body, "at": at})
    return hashlib.sha256(preimage).hexdigest()



class Logbook:
    """A hash-chained journal in one SQLite file.

    ``actor`` names who appends when a body does not (``body["pilot"]["id"]``
    wins when present).
    """

    def __init__(self, path: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 actor: str = DEFAULT_ACTOR) -> None:
        if not isinstance(actor, str) or not actor:
            raise InvalidInput("a logbook's actor must be a non-empty string")
        self.path = path
        self.actor = actor
        self._lock = threading.Lock()
        try:
            self._conn = sqlite_files.connect(path, busy_timeout_ms=busy_timeout_ms)
        except sqlite3.Error as exc:
            raise self._unavailable(exc, "be opened") from exc
        try:
            schema = _LogbookSchema(path)
            migrate(schema, lambda: contextlib.nullcontext(self._conn),
                    lambda: sqlite_files.immediate(self._conn))
            self.schema_version = schema.latest
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._unavailable(exc, "be opened") from exc
            raise

    # -- appending ----------------------------------------------------------------

    def append(self, kind: str, key: str, body: dict[str, Any]) -> bool:
        """Append an entry once per ``key``; False if that key is already there."""
        return self.append_all([(kind, key, body)]) == 1

    def append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
        """Append entries ``(kind, key, body)`` in one transaction; returns how many were new.

        A logbook that cannot be written (another writer holds it past the busy
        timeout, the disk refuses) raises :class:`HarbourUnavailable` and
        appends nothing; an entry that cannot be chained (a body that is not
        plain JSON, or that uses the reserved member ``logbook_key``) raises
        :class:`InvalidInput` and appends nothing.
        """
        with self._lock:
            try:
                return self._append_all(entries)
            except sqlite3.Error as exc:
                raise self._unavailable(exc, "be written") from exc

    def _append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
        with sqlite_files.immediate(self._conn):
            row = self._conn.execute(
                "SELECT seq, hash FROM logbook ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (row[0], row[1]) if row else (0, GENESIS)
            added = 0
            for kind, key, body in entries:
                entry = self._new_entry(seq + 1, kind, key, body, prev)
                # The UNIQUE key is the deduplication: a retried report inserts nothing.
                inserted = self._conn.execute(
                    f"INSERT INTO logbook ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (entry_key) DO NOTHING RETURNING seq",
                    (entry["seq"], key, kind, entry["actor"], entry["subject"],
                     canonicalize(entry["body"]).decode(), entry["at"], prev, entry["hash"],
                     CHAIN_FORMAT),
                ).fetchone()
                if inserted is None:
                    continue
                seq, prev = entry["seq"], entry["hash"]
                added += 1
        return added

    def _new_entry(self, seq: int, kind: str, key: str, body: dict[str, Any],
                   prev: str) -> dict[str, Any]:
        """The chain entry ``(kind, key, body)`` becomes as entry ``seq`` after ``prev``."""
        if not isinstance(key, str) or not key:
            raise InvalidInput("a logbook entry's key must be a non-empty string")
        if not isinstance(body, dict):
            raise InvalidInput("a logbook entry's body must be a JSON object")
        if KEY_MEMBER in body:
            raise InvalidInput(f"a logbook entry's body may not use the member {KEY_MEMBER!r}: "
                               "it carries the entry's key")
        pilot = body.get("pilot")
        actor = pilot.get("id") if isinstance(pilot, dict) else None
        subject = body.get("marque_id")
        entry: dict[str, Any] = {
            "seq": seq,
            "at": round(time.time(), 6),
            "kind": kind,
            "actor": actor if isinstance(actor, str) and actor else self.actor,
            "subject": subject if isinstance(subject, str) and subject else None,
            "body": {**body, KEY_MEMBER: key},
            "prev_hash": prev,
        }
        entry["hash"] = chain.entry_hash(chain.check_entry(entry))
        return entry

    # -- reading ------------------------------------------------------------------

    def entries(self, kind_prefix: str = "") -> list[dict[str, Any]]:
        """Entries in order, optionally only those whose kind starts with ``kind_prefix``.

        Each is ``{seq, key, kind, actor, subject, body, at, prev_hash, hash}``
        with ``body`` as its caller gave it (without ``logbook_key``); rows of
        schema 1 have no ``actor`` or ``subject`` (None).
        """
        with self._lock:
            # substr, not LIKE: LIKE ignores case, and a prefix may hold '_' or '%'.
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM logbook WHERE substr(kind, 1, ?) = ? ORDER BY seq",
                (len(kind_prefix), kind_prefix),
            ).fetchall()
        result = []
        for seq, key, kind, actor, subject, text, at, prev_hash, digest, _ in rows:
            body = json.loads(text)
            if isinstance(body, dict):
                body.pop(KEY_MEMBER, None)
            result.append({"seq": seq, "key": key, "kind": kind, "actor": actor,
                           "subject": subject, "body": body, "at": at,
                           "prev_hash": prev_hash, "hash": digest})
        return result

    def head(self) -> dict[str, Any]:
        """The last entry as a head ``{seq, hash, at}``; ``{0, GENESIS, None}`` when empty.

        Save it (or have it signed, :mod:`marque.logbook.heads`) to detect a
        later truncation or rewrite with :meth:`check`.
        """
        with self._lock:
            row = self._conn.execute(
                "SELECT seq, hash, at FROM logbook ORDER BY seq DESC LIMIT 1").fetchone()
        if row is None:
            return {"seq": 0, "hash": GENESIS, "at": None}
        return {"seq": row[0], "hash": row[1], "at": row[2]}

    # -- verifying ----------------------------------------------------------------

    def check(self, head: dict[str, Any] | None = None) -> ChainBreak | None:
        """Walk the chain from its first entry; the first entry where it breaks, or None.

        Entries of both formats are checked in one walk (see the module
        docstring), each by its own preimage. An entry edited in place is named
        itself; edited *and* re-hashed, the next one is named; a removed entry
        is named by the ``seq`` it had; moved entries by the first ``seq`` that
        holds the wrong one. Without ``head`` a chain cut short at its end
        still holds; with a saved ``head`` (``{seq, hash}``) a cut-off tail is
        named by its first missing ``seq`` and a rewritten one at the head's.
        """
        with self._lock:
            rows = self._conn.execute(f"SELECT {_COLUMNS} FROM logbook ORDER BY seq")
            return chain.walk_chain((_row_entry(row) for row in rows),
                                    hash_of=_RowHasher(), head=head)

    def first_broken(self) -> int | None:
        """The ``seq`` of the first edited, removed or reordered entry; None if intact."""
        found = self.check()
        return None if found is None else found.seq

    def verify(self) -> bool:
        """Whether the whole chain is intact."""
        return self.check() is None

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


def _row_entry(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, key, kind, actor, subject, text, at, prev_hash, digest, chain_format = row
    return {"seq": seq, "key": key, "kind": kind, "actor": actor, "subject": subject,
            "text": text, "at": at, "prev_hash": prev_hash, "hash": digest,
            "format": chain_format}


class _RowHasher:
    """The hash a stored row should have, by the format it was chained in.

    Returns None when the stored body is not exactly the canonical JSON object
    it was hashed as (any byte of it changed) or its key column no longer
    matches it: the row was edited.
    """

    def __init__(self) -> None:
        self._chain_seen = False

    def __call__(self, row: dict[str, Any]) -> str | None:
        body = _canonical_body(row["text"])
        if row["format"] == LEGACY_FORMAT:
            if self._chain_seen:
                raise InvalidInput("it claims the schema-1 format after entries in the current "
                                   "one, which is never written again")
            if body is None:
                return None
            return legacy_entry_hash(row["prev_hash"], row["kind"], row["key"], body, row["at"])
        if row["format"] != CHAIN_FORMAT:
            raise InvalidInput(f"its chain format {row['format']!r} is not one Marque writes")
        self._chain_seen = True
        if body is None or body.get(KEY_MEMBER) != row["key"]:
            return None
        entry = {name: row[name] for name in chain.ENTRY_FIELDS if name != "body"}
        return chain.entry_hash(chain.check_entry({**entry, "body": body}))


def _canonical_body(text: Any) -> dict[str, Any] | None:
    """The JSON object ``text`` is the canonical form of; None if it is not exactly that."""
    if not isinstance(text, str):
        return None
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or canonicalize(body).decode() != text:
            return None
    except (ValueError, InvalidInput, RecursionError):
        return None
    return body


class _LogbookSchema(Schema[sqlite3.Connection]):
    """The logbook file's versions (:data:`MIGRATIONS`), kept in ``logbook_meta``."""

    latest = len(MIGRATIONS)

    def __init__(self, path: str) -> None:
        self.path = path

    def stored(self, conn: sqlite3.Connection) -> Stored:
        tables = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "logbook_meta" in tables:
            row = conn.execute(
                "SELECT value FROM logbook_meta WHERE key = 'schema_version'").fetchone()
            if row is not None:
                return Stored(int(row[0]))
        # Made before versions were recorded: its one table is exactly version 1.
        return Stored(1 if "logbook" in tables else 0, recorded=False)

    def step(self, conn: sqlite3.Connection, index: int) -> None:
        for statement in MIGRATIONS[index]:
            conn.execute(statement)

    def record(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute(_META_DDL)
        conn.execute(
            "INSERT INTO logbook_meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(version),),
        )

    def newer(self, found: int) -> Exception:
        return HarbourUnavailable(
            f"the logbook {self.path} has schema version {found}, newer than the "
            f"{self.latest} this Marque knows: it was written by a newer Marque; upgrade "
            "Marque to use it",
            detail={"logbook": self.path, "schema_version": found})
