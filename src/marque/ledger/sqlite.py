"""The SQLite ledger: the embedded default.

WAL journal with ``synchronous=FULL`` so a claim that returned is on disk
before anything touches the target. SQLite allows one writer, so this ledger
has one writing connection and lets it serve many threads by *group commit*:
each caller's statements run inside a savepoint of one shared transaction, and
one COMMIT (one fsync) makes a whole group durable before any of its callers
returns. A caller whose statements fail rolls back to its savepoint and leaves
the others' work alone. Reads go through a second connection and see only
committed data. Between processes, ``BEGIN IMMEDIATE`` and a busy timeout
take turns.

Every driver error leaves this module typed, by its ``sqlite_errorname``: a
file that is not a database (garbage, truncated, overwritten) is
:class:`~marque.errors.LedgerCorrupt` naming the file; a file that cannot be
opened, stays locked, is read-only or sits on a full disk is
:class:`~marque.errors.LedgerUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from marque.errors import InvalidInput, LedgerCorrupt, LedgerMissing, LedgerUnavailable
from marque.ledger.base import Durability
from marque.ledger.sql import SqlLedger
from marque.ledger.sqlite_schema import WITHOUT_ROWID_MIGRATION
from marque.storage import sqlite as sqlite_files
from marque.storage.tx import Tx

BUSY_TIMEOUT_MS = 30_000
#: ``PRAGMA synchronous`` levels, by the number SQLite reads back; FULL and EXTRA are durable.
_SYNCHRONOUS = {0: "off", 1: "normal", 2: "full", 3: "extra"}
#: Pages given back to the OS per transaction when compacting after a reap.
COMPACT_PAGES = 2048


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()


class SqliteLedger(SqlLedger):
    """A ledger in one SQLite file."""

    carries_settles = True

    def __init__(self, path: str, *, creating: bool = False) -> None:
        super().__init__()
        self.path = path
        try:
            self._conn = self._connect(path)
        except sqlite3.Error as exc:
            raise ledger_error(path, exc) from exc
        try:
            if not creating:
                # Read before anything is written: a file that is not a ledger is
                # reported as it is, never converted to WAL or given our tables.
                self._check_is_ledger()
            # Takes effect only on a new, empty file (before WAL mode writes its header):
            # lets reaping give pages back to the OS.
            self._conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            sqlite_files.use_wal(self._conn)
            self._reader = self._connect(path)
        except sqlite3.Error as exc:
            self._conn.close()
            raise ledger_error(path, exc) from exc
        except BaseException:
            self._conn.close()
            raise
        self._read_lock = threading.Lock()
        # Group commit state, all guarded by one condition's lock.
        self._cond = threading.Condition(threading.Lock())
        self._open_batch = 0  # the batch whose transaction is open, 0 for none
        self._last_batch = 0
        self._members = 0  # callers whose work is in the open batch, awaiting its COMMIT
        self._committed = 0  # the newest batch known durable (or failed)
        self._failures: dict[int, BaseException] = {}
        self._arriving = 0  # callers about to join (guarded by _arriving_lock)
        self._arriving_lock = threading.Lock()

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        # WAL is set on the writer's connection once the file is known to be a ledger.
        # Room for every statement the ledger prepares (batches of several sizes among
        # them), so that none on the execution path is ever prepared again.
        return sqlite_files.connect(path, busy_timeout_ms=BUSY_TIMEOUT_MS, wal=False,
                                    cached_statements=256)

    def _check_is_ledger(self) -> None:
        """Raise ``LedgerCorrupt`` unless the file holds a ledger (reads only)."""
        if os.path.getsize(self.path) == 0 and self._size_bytes() == 0:
            raise LedgerCorrupt(
                f"the ledger file {self.path} is empty: it was truncated, or a `pilot init` "
                "was interrupted before it wrote anything. Nothing was claimed. "
                + _CORRUPT_ADVICE,
                detail={"path": self.path},
            )
        found = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
        if found is None:
            raise LedgerCorrupt(
                f"the file {self.path} is a SQLite database but not a Marque ledger (it has "
                "no ledger tables): the Pilot's configuration points at the wrong file, or "
                "the ledger was overwritten. Nothing was claimed. " + _CORRUPT_ADVICE,
                detail={"path": self.path},
            )

    @classmethod
    def create(cls, path: str, pilot_id: str) -> SqliteLedger:
        """Create a new ledger file with a fresh incarnation; refuses an existing ledger."""
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise InvalidInput(
                f"cannot create the ledger {path}: its directory {directory} does not exist; "
                "create the directory first, or choose another ledger path"
            )
        return cls(path, creating=True)._created(pilot_id)

    @classmethod
    def open(cls, path: str) -> SqliteLedger:
        """Open an existing ledger; a missing file is ``LedgerMissing``, never a silent reset."""
        if not os.path.exists(path):
            directory = os.path.dirname(os.path.abspath(path))
            where = "" if os.path.isdir(directory) else f" (nor does its directory {directory})"
            raise LedgerMissing(
                f"ledger {path} does not exist{where}; a lost ledger is a new incarnation "
                "and must be created deliberately with `marque pilot init`"
            )
        return cls(path)._opened()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        try:
            with self._group_member() as tx:
                yield tx
        except sqlite3.Error as exc:
            raise ledger_error(self.path, exc) from exc

    @contextlib.contextmanager
    def _group_member(self) -> Iterator[Tx]:
        """One caller's part of a group-committed transaction (see the module docstring)."""
        with self._arriving_lock:
            self._arriving += 1
        with self._cond:
            with self._arriving_lock:
                self._arriving -= 1
            if not self._open_batch:
                self._conn.execute("BEGIN IMMEDIATE")
                self._last_batch += 1
                self._open_batch = self._last_batch
            batch = self._open_batch
            # Alone in the batch, a failure can roll the whole transaction back;
            # with others' work already in it, only this caller's savepoint.
            shared = self._members > 0
            if shared:
                self._conn.execute("SAVEPOINT caller")
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                if shared:
                    self._conn.execute("ROLLBACK TO caller")
                    self._conn.execute("RELEASE caller")
                else:
                    self._end_batch(commit=False)
                raise
            if shared:
                self._conn.execute("RELEASE caller")
            self._members += 1
            self._await_commit(batch)

    def _await_commit(self, batch: int) -> None:
        """Wait (holding the condition) until ``batch`` is durable; lead its COMMIT if free."""
        lingered = False
        while self._committed < batch:
            # Until it ends, our batch is the open one: a batch opens only once the
            # previous one has ended, and ending one marks it committed (or failed).
            if self._arriving and not lingered:
                # Others are about to join: let them, once, then commit for all.
                lingered = True
                self._cond.wait(0.0005)
                continue
            self._end_batch(commit=True)
        failure = self._failures.get(batch)
        if failure is not None:
            raise failure

    def _end_batch(self, *, commit: bool) -> None:
        batch = self._open_batch
        try:
            self._conn.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.Error as exc:
            self._failures[batch] = exc
            while len(self._failures) > 64:  # members read theirs at once; keep a few
                self._failures.pop(next(iter(self._failures)))
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # closing the batch matters more
                    self._conn.execute("ROLLBACK")
        self._open_batch = 0
        self._members = 0
        self._committed = batch
        self._cond.notify_all()

    @contextlib.contextmanager
    def _between_batches(self) -> Iterator[None]:
        """Hold the writer, never inside a group's open transaction."""
        with self._cond:
            while self._open_batch:
                self._cond.wait()
            yield

    def durability(self) -> Durability:
        """``journal_mode`` and ``synchronous`` as SQLite reads them back on both connections.

        Marque sets WAL and ``synchronous=FULL`` itself on connect, so this checks
        that they *took*: ``PRAGMA journal_mode = WAL`` does not fail where WAL is
        impossible (a file system without shared memory, for one) — it answers the
        mode it kept. ``synchronous`` is per connection; both are read.
        """
        try:
            with self._between_batches(), self._read_lock:
                modes = {str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                         for conn in (self._conn, self._reader)}
                levels = {int(conn.execute("PRAGMA synchronous").fetchone()[0])
                          for conn in (self._conn, self._reader)}
        except sqlite3.Error as exc:
            raise ledger_error(self.path, exc) from exc
        mode = "/".join(sorted(modes))
        level = "/".join(_SYNCHRONOUS.get(n, str(n)) for n in sorted(levels))
        problems = []
        if modes != {"wal"}:
            problems.append(f"journal_mode is {mode}, not wal: SQLite kept another journal "
                            "(the file system may not support WAL's shared memory)")
        if min(levels) < 2:
            problems.append(f"synchronous is {level}, not full: a commit may be lost on "
                            "power failure")
        return Durability("sqlite", {"journal_mode": mode, "synchronous": level},
                          tuple(problems))

    def _migration(self, index: int) -> list[str]:
        # Migration 7 is SQLite's own: the execution path's tables WITHOUT ROWID.
        return WITHOUT_ROWID_MIGRATION if index == 6 else super()._migration(index)

    def _pragma(self, name: str) -> int:
        return int(self._conn.execute(f"PRAGMA {name}").fetchone()[0])

    def _compact(self) -> None:
        try:
            self._compact_pages()
        except sqlite3.Error as exc:
            raise ledger_error(self.path, exc) from exc

    def _compact_pages(self) -> None:
        with self._between_batches():
            if self._pragma("freelist_count") * 2 >= self._pragma("page_count"):
                # Mostly free: rebuilding the live part is far cheaper than moving it
                # page by page (measured: 1.0 s against 29 s for an 841 MB ledger with
                # a tenth live). One lock, for as long as copying the live set takes.
                self._conn.execute("VACUUM")
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                return
        # Otherwise give the freed pages back a bounded number per transaction: the
        # writer is shared with every execution, which must not wait for all of it.
        while True:
            with self._between_batches():
                if not self._pragma("freelist_count"):
                    # Fold the WAL back into the (now smaller) file.
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    return
                # Each step of this pragma frees one page, and sqlite3's execute()
                # steps a column-less statement once; executescript runs it out.
                self._conn.executescript(f"PRAGMA incremental_vacuum({COMPACT_PAGES});")

    @contextlib.contextmanager
    def reading(self) -> Iterator[Tx]:
        # Autocommit reads on their own connection: each sees the latest commit.
        try:
            with self._read_lock:
                yield _SqliteTx(self._reader)
        except sqlite3.Error as exc:
            raise ledger_error(self.path, exc) from exc

    @contextlib.contextmanager
    def _point_read(self) -> Iterator[Tx]:
        # The writing connection's page cache stays current across its own commits; the
        # reading connection's is thrown away at its first read after every commit of the
        # other (a fresh nonce's replay check cost 0.066 ms there, mostly re-reading
        # pages). So a point read goes to the writer when it sits between batches (it
        # then sees the latest commit of any process, never an open group's work) and is
        # free this instant: it never waits behind another caller's COMMIT.
        if not self._open_batch and self._cond.acquire(blocking=False):
            try:
                if not self._open_batch and not self._conn.in_transaction:
                    try:
                        yield _SqliteTx(self._conn)
                    except sqlite3.Error as exc:
                        raise ledger_error(self.path, exc) from exc
                    return
            finally:
                self._cond.release()
        with self.reading() as tx:
            yield tx

    def _has_schema(self) -> bool:
        with self.reading() as tx:
            row = tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'")
        return row is not None

    def _size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total

    def close(self) -> None:
        self._jtis.close()
        with self._cond:
            self._conn.close()
        with self._read_lock:
            self._reader.close()


_CORRUPT_ADVICE = (
    "Move the file aside and put back a copy of this Pilot's ledger if you have one (an "
    "older copy is detected and rotated to a new incarnation), or create a new ledger with "
    "`marque pilot init` (a new incarnation: marques issued for the old one are refused)."
)


def ledger_error(path: str, exc: sqlite3.Error) -> LedgerUnavailable:
    """A driver error on the ledger file, as the most specific typed error (by error name)."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    detail = {"sqlite_errorname": name or None, "path": path}
    if name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT"):
        what = "is not a database" if name == "SQLITE_NOTADB" else "is damaged"
        return LedgerCorrupt(
            f"the ledger file {path} {what} ({name}): it was truncated, overwritten or "
            "corrupted. This Pilot wrote nothing to it. " + _CORRUPT_ADVICE,
            detail=detail,
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        what = (f"the ledger {path} stayed locked by another process for more than "
                f"{BUSY_TIMEOUT_MS // 1000} s; find what holds it (another Pilot process, a "
                "backup tool, an open sqlite3 shell) and retry")
    elif name.startswith("SQLITE_CANTOPEN"):
        what = (f"the ledger file {path} cannot be opened: check that it and its directory "
                "exist and that this user may read and write both")
    elif name.startswith(("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH")):
        what = (f"the ledger file {path} cannot be written by this user; check the "
                "permissions of the file and its directory (SQLite also writes -wal and "
                "-shm files next to it)")
    elif name == "SQLITE_FULL":
        what = f"the disk holding the ledger {path} is full; free space and retry"
    elif name.startswith("SQLITE_IOERR"):
        what = (f"the disk holding the ledger {path} reported an I/O error ({name}); check "
                "the disk and the file system, then retry")
    else:
        what = (f"the ledger {path} could not be used ({name or 'no error name'}: "
                f"{' '.join(str(exc).split())})")
    return LedgerUnavailable(what, detail=detail)
