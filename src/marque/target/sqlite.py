"""A SQLite file as a target: the embedded default and the demo's bank.

SQLite serialises writers, so every target transaction starts with
``BEGIN IMMEDIATE`` (it takes the write lock up front, bounded by the busy
timeout) and the isolation level a marque asks for is always met. The
statement timeout is a progress handler that interrupts the statement.

A target that cannot be opened or used before anything of the attempt was
sent (the file or its directory is missing, it is not a database, it is
read-only) is :class:`~marque.errors.TargetUnavailable`: provably not applied,
and the same nonce may run again once the target is back. A write lock held
by someone else past ``lock_timeout_ms`` is a :class:`~marque.errors.StatementTimeout`.

A read-only change (DESIGN §11.3) runs with ``PRAGMA query_only = 1`` from
right after its stamp: every write is ``SQLITE_READONLY``. Approved SQL cannot
lift it, because the authorizer refuses every ``PRAGMA`` (statement and
``pragma_*`` table function alike); the Pilot lifts it itself, only to record
the stamp's ``rows_affected`` before COMMIT, after checking it was still on.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from marque.change import Change, Statement
from marque.errors import (
    MarqueError,
    PreviewFailed,
    StatementError,
    StatementTimeout,
    TargetUnavailable,
)
from marque.outcome import Status
from marque.target import stamps as stamp_schema
from marque.target.base import (
    STAMP_COLUMNS,
    Emit,
    Evidence,
    LiveStamps,
    SqlTarget,
    TargetAttempt,
    not_previewed,
)
from marque.target.values import jsonable as _jsonable

# Progress handler granularity, in SQLite VM instructions.
_PROGRESS_STEPS = 10_000


_DENIED_ACTIONS = frozenset({
    sqlite3.SQLITE_TRANSACTION,
    sqlite3.SQLITE_SAVEPOINT,
    sqlite3.SQLITE_ATTACH,
    sqlite3.SQLITE_DETACH,
    sqlite3.SQLITE_PRAGMA,
})


def _deny_transaction_control(action: int, *_: object) -> int:
    return sqlite3.SQLITE_DENY if action in _DENIED_ACTIONS else sqlite3.SQLITE_OK


class _ImageSession:
    """The derived queries of row images (:mod:`marque.target.row_images`), in the
    preview's transaction: only they may read the schema's pragmas."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection,
                 row_keys: Mapping[str, Sequence[str]] | None = None) -> None:
        self.conn = conn
        #: Declared row keys (pilot.json ``row_keys``), by ``[schema.]table`` lowered:
        #: SQLite's names are case-insensitive.
        self.declared = {(t if "." in t else "main." + t).lower(): list(c)
                         for t, c in (row_keys or {}).items()}

    def query(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        self.conn.set_authorizer(None)
        try:
            cur = self.conn.execute(sql, tuple(params))
            return [d[0] for d in cur.description or ()], list(cur.fetchall())
        except sqlite3.Error as exc:
            from marque.target.image_capture import ImageUnavailable

            raise ImageUnavailable(
                f"the derived row-image query failed ({' '.join(str(exc).split())}): "
                "previewed by count only") from exc
        finally:
            self.conn.set_authorizer(_deny_transaction_control)

    def primary_key(self, table_sql: str, schema: str | None, name: str) -> list[str]:
        return self._own_key(schema, name)[0]

    def column_types(self, table_sql: str) -> dict[str, str]:
        return {}  # each SQLite value says its own type (a BLOB is bytes)

    def row_key(self, table_sql: str, schema: str | None, name: str) -> tuple[list[str], str]:
        key, source = self._own_key(schema, name)
        if key:
            return key, source
        declared = self.declared.get(f"{schema or 'main'}.{name}".lower())
        return (list(declared), "declared") if declared else ([], "")

    def columns(self, schema: str | None, name: str) -> list[str]:
        """The table's columns in order ([] when there is no such table)."""
        _, rows = self.query("SELECT name FROM pragma_table_info(?, ?) ORDER BY cid",
                             (name, schema or "main"))
        return [str(r[0]) for r in rows]

    def _own_key(self, schema: str | None, name: str) -> tuple[list[str], str]:
        where = (name, schema or "main")
        _, rows = self.query("SELECT name, pk FROM pragma_table_info(?, ?) WHERE pk > 0 "
                             "ORDER BY pk", where)
        if rows:
            return [str(r[0]) for r in rows], "primary_key"
        # No primary key: a unique index over NOT NULL columns (not partial, no
        # expressions) names each row just as well; the fewest columns, then by name.
        _, indexes = self.query('SELECT name FROM pragma_index_list(?, ?) WHERE "unique" = 1 '
                                "AND partial = 0 ORDER BY name", where)
        keys: list[list[str]] = []
        for (index,) in indexes:
            _, columns = self.query(
                'SELECT ii.name, ti."notnull" FROM pragma_index_info(?, ?) ii LEFT JOIN '
                "pragma_table_info(?, ?) ti ON ti.name = ii.name ORDER BY ii.seqno",
                (index, schema or "main", *where))
            if columns and all(c[0] is not None and c[1] for c in columns):
                keys.append([str(c[0]) for c in columns])
        return (min(keys, key=len), "unique_index") if keys else ([], "")


def table_shape(conn: sqlite3.Connection, table: str) -> dict[str, Any] | None:
    """What ``marque pilot target row-key`` checks a declared key against: the table's
    ``{columns, key, key_source}`` (its own key, if any), or None if it does not exist."""
    from marque.target.image_capture import ImageUnavailable

    schema, _, name = table.rpartition(".")
    session = _ImageSession(conn)
    try:
        columns = session.columns(schema or None, name)
        key, source = session.row_key(table, schema or None, name) if columns else ([], "")
    except ImageUnavailable:
        return None  # an unknown schema: no such table either
    if not columns:
        return None
    return {"columns": columns, "key": key, "key_source": source or None}


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


def _unhex(text: Any) -> bytes | None:
    if text is None:
        return None
    text = text.decode("latin-1") if isinstance(text, bytes) else str(text)
    return bytes.fromhex(text) if _HEX.fullmatch(text) else None


def provide_unhex(conn: sqlite3.Connection) -> None:
    """Give ``conn`` SQLite 3.41's ``unhex(X)`` where the library is older: an undo binds
    a BLOB as hex text (a statement's parameters are JSON scalars) and decodes it so."""
    if sqlite3.sqlite_version_info < (3, 41, 0):
        conn.create_function("unhex", 1, _unhex, deterministic=True)


class _TargetConnection(sqlite3.Connection):
    """A target connection that knows whether its transaction runs read-only."""

    read_only = False


class SqliteTarget(SqlTarget):
    """A target in one existing SQLite file."""

    stamp_table = stamp_schema.SQLITE_TABLES.stamps
    row_stamp_table = stamp_schema.SQLITE_TABLES.row_stamps
    identity_query = stamp_schema.SQLITE_IDENTITY

    def __init__(self, name: str, path: str, *, lock_timeout_ms: int = 5_000) -> None:
        self.name = name
        self.path = path
        self.lock_timeout_ms = lock_timeout_ms
        self._stamps_ready = False

    def location(self) -> str:
        """The target file's absolute path."""
        return os.path.abspath(self.path)

    def _connect(self) -> _TargetConnection:
        # mode=rw: a missing target file is an error, never a new empty database.
        conn = sqlite3.connect(
            f"file:{self.path}?mode=rw",
            uri=True,
            isolation_level=None,
            timeout=self.lock_timeout_ms / 1000,
            factory=_TargetConnection,
        )
        provide_unhex(conn)
        return conn

    def _ensure_stamps(self, conn: sqlite3.Connection) -> None:
        """Create or upgrade the stamp table, inside the caller's transaction (once per run)."""
        if self._stamps_ready:
            return
        stamp_schema.migrate_sqlite(conn, f"{self.name} ({self.path})")
        self._stamps_ready = True

    def _begin(self, attempt: TargetAttempt) -> _TargetConnection:
        assert attempt.change is not None
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._ensure_stamps(conn)
        except BaseException:
            self._stamps_ready = False  # the DDL rolled back with the transaction
            conn.close()
            raise
        # Defence in depth behind statement validation: approved SQL may not
        # end, split or reconfigure the transaction, or reach other files.
        conn.set_authorizer(_deny_transaction_control)
        deadline = time.monotonic() + attempt.statement_timeout_ms / 1000

        def interrupt_when_late() -> int:
            return 1 if time.monotonic() > deadline else 0

        conn.set_progress_handler(interrupt_when_late, _PROGRESS_STEPS)
        conn.read_only = attempt.change.read_only
        return conn

    def _stamp_then(self, conn: Any, attempt: TargetAttempt, emit: Emit) -> tuple[list[Any], Any]:
        inserted, first = super()._stamp_then(conn, attempt, emit)
        if inserted and conn.read_only:
            # Right after the stamp (which commits with the reads), before any guard or
            # statement. Only the Pilot may run a PRAGMA: the authorizer steps aside once.
            conn.set_authorizer(None)
            try:
                conn.execute("PRAGMA query_only = 1")
            finally:
                conn.set_authorizer(_deny_transaction_control)
        return inserted, first

    def _execute_statement(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        return conn.execute(sql, params)

    def _finish(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        try:
            if conn.read_only:
                self._leave_read_only(conn)
            conn.execute(sql, params)
        except sqlite3.Error as exc:  # received before COMMIT was sent
            raise self._translate(exc) from exc
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
        conn.execute("COMMIT")

    def _leave_read_only(self, conn: _TargetConnection) -> None:
        """Lift ``query_only`` to write the stamp's rows_affected, after proving that
        nothing lifted it before (the authorizer should make that impossible)."""
        conn.set_authorizer(None)
        row = conn.execute("PRAGMA query_only").fetchone()
        if not row or row[0] != 1:
            raise StatementError(
                "the change is approved as read-only, but its transaction no longer was when "
                "its statements finished; it was rolled back",
                detail={"access": "read_only"})
        conn.execute("PRAGMA query_only = 0")

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def _abandon(self, conn: Any) -> None:
        try:
            conn.set_progress_handler(None, 0)  # a row transaction's statement deadline
            conn.set_authorizer(None)
            if conn.in_transaction:
                # A first-use stamp table rolls back with the transaction that made it.
                self._stamps_ready = False
                conn.execute("ROLLBACK")
            if conn.read_only:
                # query_only belongs to the connection, not to the transaction.
                conn.read_only = False
                conn.execute("PRAGMA query_only = 0")
        except sqlite3.Error:
            pass  # closing the connection rolls back whatever is left
        finally:
            conn.close()

    def _translate_begin(self, exc: Exception) -> MarqueError:
        name = getattr(exc, "sqlite_errorname", None) or ""
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return StatementTimeout(
                f"target {self.name} ({self.path}) stayed locked by another writer for longer "
                f"than the lock timeout ({self.lock_timeout_ms} ms); nothing was sent, the "
                "same nonce may run again",
                detail={"sqlite_errorname": name})
        if isinstance(exc, sqlite3.Error):
            return self._unavailable(exc)
        return self._translate(exc)

    def _unavailable(self, exc: sqlite3.Error) -> TargetUnavailable:
        """The target file could not be opened or prepared: nothing of the attempt was sent."""
        name = getattr(exc, "sqlite_errorname", None) or ""
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            what = f"its directory {directory} does not exist"
        elif not os.path.exists(self.path):
            what = "the file does not exist (a target is never created by the Pilot)"
        elif name == "SQLITE_NOTADB" or name.startswith("SQLITE_CORRUPT"):
            what = "the file is not a SQLite database, or is damaged"
        elif name.startswith(("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_CANTOPEN")):
            what = ("this user may not read and write it (check the file's and its "
                    "directory's permissions)")
        else:
            what = f"SQLite reports {name or 'an error'}: {' '.join(str(exc).split())}"
        return TargetUnavailable(
            f"target {self.name} at {self.path} cannot be used: {what}. Nothing was sent; the "
            "same nonce may run again once the target is back",
            detail={"sqlite_errorname": name or None, "path": self.path},
        )

    def _translate(self, exc: Exception) -> MarqueError:
        name = getattr(exc, "sqlite_errorname", None)
        # Only our progress handler interrupts a target connection.
        if name == "SQLITE_INTERRUPT":
            return StatementTimeout("the statement timeout was reached; the statement was "
                                    "interrupted and rolled back",
                                    detail={"sqlite_errorname": name})
        return StatementError(f"the target refused the transaction: {' '.join(str(exc).split())}",
                              detail={"sqlite_errorname": name} if name else None)

    def _is_unique_violation(self, exc: Exception) -> bool:
        return getattr(exc, "sqlite_errorname", None) in (
            "SQLITE_CONSTRAINT_PRIMARYKEY",
            "SQLITE_CONSTRAINT_UNIQUE",
        )

    def _reconcile_txn(self, attempt: TargetAttempt, tombstone: tuple[Any, ...]) -> Evidence:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            self._ensure_stamps(conn)
            foreign = self._refuses_tombstone(conn, attempt.target_id)
            if foreign is not None:
                conn.execute("ROLLBACK")
                return Evidence(Status.INDETERMINATE, reason=foreign)
            inserted = conn.execute(self._stamp_upsert, tombstone).fetchall()
            row = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque_stamps "
                "WHERE marque_id = ? AND nonce = ?",
                (attempt.marque_id, attempt.nonce),
            ).fetchone()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._stamps_ready = False
            return Evidence(Status.INDETERMINATE, reason=f"tombstone not written: {exc}")
        finally:
            conn.close()
        stamp = dict(zip(STAMP_COLUMNS, row, strict=True)) if row else None
        return self._stamp_evidence(attempt, stamp, bool(inserted))

    def identity(self) -> str:
        conn = self._stamps_open()
        try:
            return self._identity_on(conn)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        finally:
            conn.close()

    def live_stamps(self, incarnation: str, live_after: float) -> LiveStamps:
        conn = self._stamps_open()
        try:
            target_id = self._identity_on(conn)
            rows = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque_stamps "
                "WHERE incarnation = ? AND expires_at > ?",
                (incarnation, live_after),
            ).fetchall()
            row_stamps = self._live_row_stamps_on(conn, incarnation, live_after)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        finally:
            conn.close()
        return LiveStamps(target_id, [dict(zip(STAMP_COLUMNS, r, strict=True)) for r in rows],
                          row_stamps)

    def _stamps_open(self) -> _TargetConnection:
        """A connection to a target whose stamp table is there and up to date (made, or
        brought up to date — a newer one refused — under the write lock)."""
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            if stamp_schema.sqlite_version(conn) != stamp_schema.VERSION:
                conn.execute("BEGIN IMMEDIATE")
                self._stamps_ready = False
                self._ensure_stamps(conn)
                conn.execute("COMMIT")
            self._stamps_ready = True
        except sqlite3.Error as exc:
            self._stamps_ready = False
            conn.close()
            raise self._unavailable(exc) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _identity_on(self, conn: sqlite3.Connection) -> str:
        row = conn.execute(self.identity_query).fetchone()
        if row is None:
            raise TargetUnavailable(
                f"target {self.name} ({self.path}) has a stamp table without its identity row "
                "(marque_target_identity): someone edited it; nothing was sent to it")
        return str(row[0])

    def preview(
        self, change: Change, *, mode: str, sample_rows: int, statement_timeout_ms: int
    ) -> list[dict[str, Any]]:
        # Imported here, not with the module: they load sqlglot (tens of ms), which an
        # execution never needs and a fresh `marque exec` process would pay for.
        from marque.preview_caveats import statement_caveats
        from marque.target.caveat_catalog import SqliteCatalog

        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        deadline = time.monotonic() + statement_timeout_ms / 1000
        results: list[dict[str, Any]] = []
        index = 0
        try:
            _begin_preview(conn, change, mode, deadline)
            images = _ImageSession(conn, self.row_keys)
            catalog = SqliteCatalog(conn, _deny_transaction_control)
            for index, statement in enumerate(change.statements):
                caveats, previewable = statement_caveats(statement.sql, "sqlite", catalog)
                if not previewable:
                    results.append(not_previewed(statement.sql, caveats))
                elif mode == "explain":
                    results.append(_explained(conn, statement, caveats))
                else:
                    results.append(_rolled_back_run(conn, images, statement, index,
                                                    sample_rows, caveats))
        except sqlite3.Error as exc:
            raise self._preview_failed(exc, index, statement_timeout_ms) from exc
        finally:
            _end_preview(conn, change)
        return results

    def _preview_failed(self, exc: sqlite3.Error, index: int,
                        statement_timeout_ms: int) -> PreviewFailed:
        """What a preview that SQLite stopped at statement ``index`` raises."""
        name = getattr(exc, "sqlite_errorname", None)
        if name == "SQLITE_INTERRUPT":
            what = (f"statement {index} ran past the statement timeout "
                    f"({statement_timeout_ms} ms) and was interrupted")
        elif name and name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            what = (f"statement {index} waited longer than the lock timeout "
                    f"({self.lock_timeout_ms} ms) for another writer")
        else:
            what = f"statement {index} failed: {' '.join(str(exc).split())}"
        return PreviewFailed(
            f"preview on target {self.name} ({self.path}): {what}; everything was rolled "
            "back", detail={"sqlite_errorname": name, "statement": index})

    def stamps_of(self, marque_id: str) -> list[dict[str, Any]]:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            if stamp_schema.sqlite_version(conn) == 0:
                return []
            rows = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque_stamps WHERE marque_id = ? "
                "ORDER BY nonce", (marque_id,)).fetchall()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        finally:
            conn.close()
        return [dict(zip(STAMP_COLUMNS, r, strict=True)) for r in rows]

    # -- Effect Set rows (target/rows.py) ------------------------------------------------

    def _row_open(self, statement_timeout_ms: int) -> sqlite3.Connection:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock: the row read below stays true
            self._ensure_stamps(conn)
        except sqlite3.Error as exc:
            self._stamps_ready = False
            conn.close()
            raise self._translate_begin(exc) from exc
        deadline = time.monotonic() + statement_timeout_ms / 1000
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0,
                                  _PROGRESS_STEPS)
        return conn

    def _row_read_open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def _row_stamp_version(self, conn: Any) -> int:
        return stamp_schema.sqlite_version(conn)

    def _row_exec(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        return conn.execute(sql, params)

    def _table_columns(self, conn: Any, table: str) -> frozenset[str] | None:
        # ``pragma_table_xinfo`` names hidden and generated columns too; a table has at
        # least one column, so none means no such table.
        schema, _, name = table.rpartition(".")
        rows = conn.execute("SELECT name FROM pragma_table_xinfo(?, ?)", (name, schema)
                            ).fetchall() if schema else conn.execute(
            "SELECT name FROM pragma_table_xinfo(?)", (name,)).fetchall()
        return frozenset(self._column_name(r[0]) for r in rows) or None

    def _column_name(self, column: str) -> str:
        # SQLite compares identifiers ASCII case-insensitively; declared names are ASCII.
        return column.lower()

    def _row_commit(self, conn: Any) -> None:
        conn.set_progress_handler(None, 0)
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # SQLite answered: the transaction did not commit
            raise self._translate(exc) from exc

    def _upsert_row(self, conn: Any, table: str, key: tuple[str, ...],
                    row: dict[str, Any], values: dict[str, Any]) -> str:
        """SQLite has no ``xmax``; its own answer is its change count, asked twice inside
        the row's ``BEGIN IMMEDIATE`` transaction (no other writer can come between):
        ``INSERT … ON CONFLICT (key) DO NOTHING`` changed one row → ``created``; it changed
        none (the key exists) → ``UPDATE … WHERE key`` changed one row → ``updated``."""
        from marque.target.rows import RowConditionFailed, quote

        columns = sorted(row)
        cur = conn.execute(
            f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in columns)}) VALUES "
            f"({', '.join('?' for _ in columns)}) ON CONFLICT "
            f"({', '.join(quote(c) for c in key)}) DO NOTHING", tuple(row[c] for c in columns))
        if cur.rowcount == 1:
            return "created"
        if not values:  # the key exists and there is nothing to change: the insert said so
            return "updated"
        changed = sorted(values)
        where = " AND ".join(f"{quote(c)} = ?" for c in key)
        cur = conn.execute(
            f"UPDATE {quote(table)} SET {', '.join(f'{quote(c)} = ?' for c in changed)} "
            f"WHERE {where}", tuple(values[c] for c in changed) + tuple(row[c] for c in key))
        if cur.rowcount != 1:
            raise RowConditionFailed(f"the upsert of {table} row {[row[c] for c in key]} "
                                     f"neither inserted nor updated one row")
        return "updated"


# -- a preview's steps ------------------------------------------------------------------


def _begin_preview(conn: sqlite3.Connection, change: Change, mode: str,
                   deadline: float) -> None:
    """Open the preview's transaction, guarded: no transaction control, no running past
    ``deadline``, read-only for a read approval."""
    from marque.target.row_images import writes_rows

    # Deferred: an explain preview never takes the write lock, nor a read. A rollback
    # preview of writes takes it at once (bounded by the lock timeout): its row
    # images read before the first write, and a read lock that then has to become
    # a write lock could fail at once instead of waiting its turn.
    conn.execute("BEGIN IMMEDIATE" if mode != "explain" and not change.read_only
                 and any(writes_rows(s.sql, "sqlite") for s in change.statements)
                 else "BEGIN")
    if change.read_only:
        # As its execution will: a read approval is previewed read-only too.
        conn.execute("PRAGMA query_only = 1")
    conn.set_authorizer(_deny_transaction_control)
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0,
                              _PROGRESS_STEPS)


def _explained(conn: sqlite3.Connection, statement: Statement,
               caveats: list[dict[str, Any]]) -> dict[str, Any]:
    """An explain preview of one statement: SQLite's query plan, nothing run."""
    from marque.target.row_images import explain_images

    plan = conn.execute("EXPLAIN QUERY PLAN " + statement.sql,
                        tuple(statement.params)).fetchall()
    return {"sql": statement.sql, "rows": None, "sample": None,
            "plan": [str(r[-1]) for r in plan],
            "row_images": explain_images(statement.sql, "sqlite"),
            "preview_caveats": caveats}


def _rolled_back_run(conn: sqlite3.Connection, images: _ImageSession, statement: Statement,
                     index: int, sample_rows: int,
                     caveats: list[dict[str, Any]]) -> dict[str, Any]:
    """One statement run inside the preview's transaction: its exact count, a sample of
    what it returns, and its row images."""
    from marque.target.row_images import finish_capture, start_capture

    capture = start_capture(images, statement.sql, statement.params)
    cur = conn.execute(statement.sql, tuple(statement.params))
    sample = None
    returned = None
    if cur.description is not None:
        rows = cur.fetchall()  # all of them: the count must be exact
        returned = ([d[0] for d in cur.description], rows)
        count = len(rows)
        sample = {"columns": [d[0] for d in cur.description],
                  "rows": [[_jsonable(v) for v in r] for r in rows[:sample_rows]]}
    else:
        count = max(cur.rowcount, 0)
    if not conn.in_transaction:
        raise PreviewFailed(f"statement {index} ended the preview's transaction")
    return {"sql": statement.sql, "rows": count, "sample": sample, "plan": None,
            "row_images": finish_capture(capture, images, count, returned),
            "preview_caveats": caveats}


def _end_preview(conn: sqlite3.Connection, change: Change) -> None:
    """Undo the preview's guards, roll everything back and close the connection."""
    try:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
        if change.read_only:
            conn.execute("PRAGMA query_only = 0")
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # closing the connection rolls back whatever is left
    finally:
        conn.close()
