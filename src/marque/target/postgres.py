"""A PostgreSQL target, through psycopg 3.

Same fenced flow as every target (see ``target/base.py``); what is particular
to PostgreSQL lives here:

* the stamp table is ``marque.stamps`` in a schema of its own, defined and
  migrated in ``target/stamps.py``;
* a server that cannot be reached or refuses the Pilot is reported at once as
  :class:`~marque.errors.TargetUnavailable` naming ``host:port/dbname`` (never
  the password), with libpq's reason — not after a pool timeout;
* ``statement_timeout`` and ``lock_timeout`` are the Pilot's, set on each
  pooled connection; a marque asking for another statement timeout gets it
  with ``SET LOCAL``, so it dies with the transaction;
* the isolation level is the marque's (READ COMMITTED by default);
* round trips are few: ``BEGIN`` travels with the stamp insert and, on a
  first attempt without guards to check before, the first statement right
  behind it; the stamp's ``rows_affected`` travels with ``COMMIT``. Each is
  one simple-protocol message with parameters bound client-side by psycopg
  (the Pilot's own values and the marque's signed ones). A first attempt's
  stamp is a plain INSERT, so a conflict fails the message before the
  statement runs; a later attempt's stamp (which may replace an older
  tombstone) goes alone, as the fence pre-check of DESIGN §3;
* the stamp insert returns ``txid_current()``, kept as corroborating evidence;
* errors are classified by *whether the server answered*: an error response
  received before or at COMMIT is provably not applied (the SQLSTATE is
  recorded); a connection lost while COMMIT was in flight is ``commit_unknown``;
* a read-only change (DESIGN §11.3) runs its guards and statements under a
  savepoint taken right after the stamp, in the same message, followed by
  ``SET TRANSACTION READ ONLY``: every write fails (SQLSTATE 25006), in a
  function or not. Approved SQL cannot ``SET`` it back (25001), but PostgreSQL
  before 16 lets ``RESET transaction_read_only`` lift it, so read-only is not
  the only wall: before COMMIT the Pilot checks that the mode is still on and
  that nothing under the savepoint took a transaction id (only a write does),
  then rolls back to the savepoint — whatever the statements did is undone,
  the stamp stays — and records ``rows_affected`` and commits. A failed check
  is a ``statement_error``, rolled back, stamp and all.

Statements use psycopg's ``%s`` placeholders.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg.rows import TupleRow
from psycopg.types.string import TextLoader

from marque.change import Change, Statement
from marque.dsn import describe
from marque.errors import (
    CommitUnknown,
    MarqueError,
    PreviewFailed,
    SerializationFailure,
    StatementError,
    StatementTimeout,
    TargetUnavailable,
)
from marque.outcome import Status
from marque.storage.pgpool import Pool, checkout, make_pool, reason
from marque.target import stamps as stamp_schema
from marque.target.base import (
    STAMP_APPLIED,
    STAMP_COLUMNS,
    Emit,
    Evidence,
    LiveStamps,
    SqlTarget,
    TargetAttempt,
    not_previewed,
)
from marque.target.values import jsonable as _jsonable

_ISOLATION = {
    "read_committed": "READ COMMITTED",
    "repeatable_read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}
_SERIALIZATION = {"40001", "40P01"}
_TIMEOUTS = {"57014", "55P03"}  # query_canceled (statement_timeout), lock_not_available
# read_only_sql_transaction, active_sql_transaction (e.g. SET TRANSACTION READ WRITE)
_READ_ONLY_REFUSALS = {"25006", "25001"}

#: What a BEGIN with each isolation level sends, made once.
_BEGIN = {name: f"BEGIN ISOLATION LEVEL {level}; " for name, level in _ISOLATION.items()}
_SET_TIMEOUT = "SET LOCAL statement_timeout = %s; "
# libpq's transaction states, read as plain ints: ``conn.info`` makes a new object and an
# enum member on every read, and the flow reads them several times per attempt.
_IDLE = int(psycopg.pq.TransactionStatus.IDLE)
_INTRANS = int(psycopg.pq.TransactionStatus.INTRANS)

_READ_ONLY_SAVEPOINT = "marque_read_only"
#: Sent right behind the stamp insert, in the same message, for a read-only change.
_READ_ONLY_ENTER = f"SAVEPOINT {_READ_ONLY_SAVEPOINT}; SET TRANSACTION READ ONLY"
_READ_ONLY_ENTER_RESULTS = 2
#: Before COMMIT: still read-only, and no transaction id but the stamp's one. A
#: subtransaction is given its own id (and holds its ExclusiveLock) only when it writes.
_READ_ONLY_CHECK = (
    "SELECT current_setting('transaction_read_only') = 'on', "
    "(SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
    "AND locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted)"
)


#: Longer message texts are joined anew each time rather than kept (psycopg does not
#: cache its parsing of such long queries either).
_KEPT_MESSAGE_CHARS = 4096


def _message(*parts: str) -> str:
    """The text of a message made of ``parts``, the same string object for the same parts:
    psycopg keeps a cursor's parameter adapters while the cursor runs the very same
    query object again, and rebuilds them for every other (see :class:`_Cursors`)."""
    if sum(map(len, parts)) > _KEPT_MESSAGE_CHARS:
        return "".join(parts)
    return _kept_message(*parts)


@functools.lru_cache(maxsize=512)
def _kept_message(*parts: str) -> str:
    return "".join(parts)



#: The types the row-image queries read as the server's text (see _ImageSession.query).
_TEXT_LOADED = ("json", "jsonb", "interval")


class _ImageSession:
    """The derived queries of row images (:mod:`marque.target.row_images`), each in a
    savepoint of the preview's transaction: one that fails leaves the preview going."""

    dialect = "postgres"

    def __init__(self, conn: psycopg.Connection[TupleRow],
                 row_keys: Mapping[str, Sequence[str]] | None = None) -> None:
        self.conn = conn
        #: Declared row keys (pilot.json ``row_keys``), by ``[schema.]table`` as written:
        #: the server resolves each name as it resolves the statement's (search_path).
        self.declared = {t: list(c) for t, c in (row_keys or {}).items()}

    def query(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            with self.conn.transaction():  # a savepoint: the preview's transaction is open
                cur = self.conn.cursor()
                # As the server writes them: json keeps its text verbatim, a jsonb number
                # its digits, an interval its months (marque.target.image_values).
                for name in _TEXT_LOADED:
                    cur.adapters.register_loader(name, TextLoader)
                cur.execute(sql, tuple(params) or None)
                return [d.name for d in cur.description or ()], list(cur.fetchall())
        except psycopg.Error as exc:
            from marque.target.image_capture import ImageUnavailable

            raise ImageUnavailable(
                f"the derived row-image query failed ({reason(exc)}): previewed by count "
                "only") from exc

    def column_types(self, table_sql: str) -> dict[str, str]:
        _, rows = self.query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            (table_sql,))
        return {str(name): str(type_name) for name, type_name in rows}

    def primary_key(self, table_sql: str, schema: str | None, name: str) -> list[str]:
        return self._own_key(table_sql)[0]

    def row_key(self, table_sql: str, schema: str | None, name: str) -> tuple[list[str], str]:
        key, source = self._own_key(table_sql)
        if key or not self.declared:
            return key, source
        _, rows = self.query("SELECT d FROM unnest(%s::text[]) AS d "
                             "WHERE to_regclass(d) = to_regclass(%s) ORDER BY d",
                             (list(self.declared), table_sql))
        keys = {tuple(self.declared[str(r[0])]) for r in rows}
        if len(keys) > 1:
            from marque.target.image_capture import ImageUnavailable

            raise ImageUnavailable(
                f"pilot.json declares different row keys for {table_sql} under different "
                f"names ({', '.join(str(r[0]) for r in rows)}): previewed by count only")
        return (list(keys.pop()), "declared") if keys else ([], "")

    def columns(self, table_sql: str) -> list[str] | None:
        """The table's columns in order (None when there is no such table)."""
        _, rows = self.query(
            "SELECT c.oid IS NOT NULL, array_remove(array_agg(a.attname::text "
            "ORDER BY a.attnum), NULL) FROM (SELECT to_regclass(%s) AS oid) c "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped GROUP BY c.oid", (table_sql,))
        return [str(c) for c in rows[0][1]] if rows and rows[0][0] else None

    def _own_key(self, table_sql: str) -> tuple[list[str], str]:
        # The primary key; else a unique index over NOT NULL columns (not partial, no
        # expressions), which names each row just as well: the fewest columns, then by name.
        _, rows = self.query(
            "SELECT array_agg(a.attname::text ORDER BY k.ord), i.indisprimary FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
            "AND i.indexprs IS NULL GROUP BY i.indexrelid, i.indisprimary "
            "HAVING bool_and(a.attnotnull) "
            "ORDER BY i.indisprimary DESC, count(*), i.indexrelid::regclass::text LIMIT 1",
            (table_sql,))
        if not rows:
            return [], ""
        return [str(c) for c in rows[0][0]], "primary_key" if rows[0][1] else "unique_index"


def table_shape(conn: psycopg.Connection[TupleRow], table: str) -> dict[str, Any] | None:
    """What ``marque pilot target row-key`` checks a declared key against: the table's
    ``{columns, key, key_source}`` (its own key, if any), or None if it does not exist."""
    session = _ImageSession(conn)
    columns = session.columns(table)
    if columns is None:
        return None
    key, source = session.row_key(table, None, table)
    return {"columns": columns, "key": key, "key_source": source or None}


class _Cursors:
    """One pooled connection's client-side cursors for the Pilot's own messages.

    Each cursor sends one kind of message again and again — the stamp's (with BEGIN and,
    often, the first statement), COMMIT's, the session reset — with texts from
    :func:`_message`, so psycopg keeps its adapters between attempts instead of making a
    cursor and its adapters for every message (measured: about as much client CPU as
    binding the parameters themselves). Made with the connection's first attempt; dropped
    once the connection is closed.
    """

    __slots__ = ("conn", "first", "commit", "reset")

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self.conn = conn
        self.first = psycopg.ClientCursor(conn)
        self.commit = psycopg.ClientCursor(conn)
        self.reset = psycopg.ClientCursor(conn)


class _Open:
    """A checked-out connection, its cursors, and the BEGIN that will travel with the
    stamp."""

    __slots__ = ("conn", "cursors", "begin", "begin_params", "preamble", "returned",
                 "read_only")

    def __init__(self, conn: psycopg.Connection[TupleRow], cursors: _Cursors, begin: str,
                 begin_params: tuple[Any, ...], preamble: int, *, read_only: bool) -> None:
        self.conn = conn
        self.cursors = cursors
        self.begin = begin
        self.begin_params = begin_params
        #: How many results ``begin`` produces before the stamp's (one per statement).
        self.preamble = preamble
        #: ``conn`` went back to the pool already (it broke, and no fresh one could be had).
        self.returned = False
        #: The change runs read-only from right after its stamp.
        self.read_only = read_only


class PostgresTarget(SqlTarget):
    """A target in one PostgreSQL database."""

    placeholder = "%s"
    stamp_table = stamp_schema.POSTGRES_TABLES.stamps
    stamp_returning = "attempt, txid_current()"
    row_stamp_table = stamp_schema.POSTGRES_TABLES.row_stamps
    identity_query = stamp_schema.POSTGRES_IDENTITY
    row_lock_clause = " FOR UPDATE"
    undefined_table_sqlstate = "42P01"
    undefined_column_sqlstate = "42703"

    def __init__(
        self,
        name: str,
        dsn: str,
        *,
        lock_timeout_ms: int = 5_000,
        statement_timeout_ms: int = 30_000,
        pool_size: int = 8,
    ) -> None:
        self.name = name
        self.dsn = dsn
        self.lock_timeout_ms = lock_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self._pool_size = pool_size
        self._pool: Pool | None = None
        self._pool_lock = threading.Lock()
        self._schema_ready = False
        #: The cursors of each pooled connection, by ``id`` (see :class:`_Cursors`).
        self._cursors: dict[int, _Cursors] = {}

    def location(self) -> str:
        """``host:port/dbname`` of the DSN (never its password)."""
        return describe(self.dsn)

    # -- connections ------------------------------------------------------------

    def _connections(self) -> Pool:
        pool = self._pool
        if pool is not None:  # made once: no lock to read it (twice per attempt)
            return pool
        with self._pool_lock:
            if self._pool is None:
                # The Pilot's timeouts start every session, so the reset each connection
                # gets on its way back to the pool (approved SQL may have changed its
                # session) comes back to them.
                self._pool = make_pool(
                    self.dsn, name=f"marque-target-{self.name}", max_size=self._pool_size,
                    autocommit=True, configure=self._configure, discard_on_return=True,
                    session={"statement_timeout": f"{self.statement_timeout_ms}ms",
                             "lock_timeout": f"{self.lock_timeout_ms}ms"},
                )
            return self._pool

    def _configure(self, conn: psycopg.Connection[TupleRow]) -> None:
        # Nothing here is worth preparing: the Pilot's messages carry their values bound
        # client-side (a new text each time), and approved SQL is run a few times at most.
        # Off, psycopg skips its per-query bookkeeping of candidates.
        conn.prepare_threshold = None

    def _ensure_schema(self, conn: psycopg.Connection[TupleRow]) -> None:
        if self._schema_ready:
            return
        stamp_schema.migrate_postgres(conn, f"{self.name} ({describe(self.dsn)})")
        self._schema_ready = True

    def _checkout(self) -> psycopg.Connection[TupleRow]:
        """A pooled connection, rolled back if needed, on a target whose stamp table is ready.

        Raises ``TargetUnavailable`` when no connection can be had, or the stamp table
        cannot be made ready: nothing of an attempt has been sent at that point.
        """
        pool = self._connections()
        try:
            conn = checkout(pool, self.dsn)
        except psycopg.Error as exc:
            raise self._unavailable(exc, "cannot be reached") from exc
        try:
            if conn.pgconn.transaction_status != _IDLE:
                conn.execute("ROLLBACK")
            self._ensure_schema(conn)
        except psycopg.Error as exc:
            pool.putconn(conn)
            raise self._unavailable(exc, "cannot hold Marque's stamps") from exc
        except BaseException:
            pool.putconn(conn)
            raise
        return conn

    def _cursors_of(self, conn: psycopg.Connection[TupleRow]) -> _Cursors:
        cursors = self._cursors.get(id(conn))
        if cursors is not None and cursors.conn is conn:
            return cursors
        with self._pool_lock:  # a new connection: forget the ones the pool has closed
            for key, old in list(self._cursors.items()):
                if old.conn.closed:
                    del self._cursors[key]
            cursors = self._cursors[id(conn)] = _Cursors(conn)
        return cursors

    def _unavailable(self, exc: psycopg.Error, what: str) -> TargetUnavailable:
        server = describe(self.dsn)
        return TargetUnavailable(
            f"target {self.name} at {server} {what}: {reason(exc)}. Nothing was sent; the "
            "same nonce may run again once the target is back",
            sqlstate=exc.sqlstate,
            detail={"target": self.name, "server": server},
        )

    # -- the hooks of the fenced flow ----------------------------------------------

    def _begin(self, attempt: TargetAttempt) -> _Open:
        assert attempt.change is not None
        begin = _BEGIN[attempt.change.isolation]
        params: tuple[Any, ...] = ()
        if attempt.statement_timeout_ms != self.statement_timeout_ms:
            begin += _SET_TIMEOUT
            params = (f"{attempt.statement_timeout_ms}ms",)
        # Nothing is sent yet: BEGIN travels with the stamp insert.
        conn = self._checkout()
        return _Open(conn, self._cursors_of(conn), begin, params, 1 + bool(params),
                     read_only=attempt.change.read_only)

    def _send_first(
        self, conn: _Open, sql: str, params: tuple[Any, ...]
    ) -> psycopg.ClientCursor[Any]:
        """BEGIN and ``sql`` in one message; the cursor is on the stamp's result."""
        for retry in (True, False):
            cur = conn.cursors.first
            try:
                cur.execute(_message(conn.begin, sql), (*conn.begin_params, *params))
            except psycopg.Error:
                if not (retry and conn.conn.broken):
                    raise
                # A pooled connection that died idle. COMMIT was never sent, so
                # nothing of this attempt can have committed: resend once, fresh.
                # What killed it (a server restart, a proxy) killed its idle siblings
                # too, and the next one handed out could be as dead: have the pool
                # check every idle connection first, so the resend gets a live one.
                pool = self._connections()
                pool.putconn(conn.conn)
                conn.returned = True
                pool.check()
                conn.conn = self._checkout()
                conn.cursors = self._cursors_of(conn.conn)
                conn.returned = False
                continue
            for _ in range(conn.preamble):
                cur.nextset()
            return cur
        raise AssertionError("unreachable")

    def _stamp(self, conn: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
        if not conn.read_only:
            return list(self._send_first(conn, sql, params).fetchall())
        cur = self._send_first(conn, _message(sql, "; ", _READ_ONLY_ENTER), params)
        rows = list(cur.fetchall())
        for _ in range(_READ_ONLY_ENTER_RESULTS):
            cur.nextset()
        return rows

    def _stamp_then(self, conn: Any, attempt: TargetAttempt, emit: Emit) -> tuple[list[Any], Any]:
        assert attempt.change is not None
        change = attempt.change
        if attempt.number != 1 or any(g.when in ("before", "both") for g in change.guards):
            return super()._stamp_then(conn, attempt, emit)
        statement = change.statements[0]
        # Attempt 1 has no older tombstone to replace, so the plain INSERT is the
        # whole fence — and its unique violation ends the message before the
        # statement behind it can run. One round trip fewer.
        sql = statement.sql if statement.params else statement.sql.replace("%", "%%")
        enter = f"{_READ_ONLY_ENTER}; " if conn.read_only else ""
        emit("statement_started", index=0, sql=statement.sql)
        try:
            cur = self._send_first(conn, _message(self._stamp_insert, "; ", enter, sql),
                                   (*self._stamp_row(attempt, STAMP_APPLIED), *statement.params))
        except pgerrors.UniqueViolation as exc:
            if exc.diag.schema_name == "marque" and exc.diag.table_name == "stamps":
                return [], None
            raise  # the approved statement's own unique violation
        inserted = list(cur.fetchall())
        for _ in range(1 + (_READ_ONLY_ENTER_RESULTS if conn.read_only else 0)):
            cur.nextset()
        return inserted, cur

    def _execute_statement(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        cur = conn.conn.cursor()
        # No parameters: pass None so a literal '%' in the SQL stays literal.
        cur.execute(sql, params if params else None)
        return cur

    def _finish(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        if conn.read_only:
            self._check_read_only(conn)
            sql = _message(f"ROLLBACK TO SAVEPOINT {_READ_ONLY_SAVEPOINT}; ", sql)
        try:
            conn.cursors.commit.execute(_message(sql, "; COMMIT"), params)
        except psycopg.Error as exc:
            if exc.sqlstate is not None and not conn.conn.broken:
                # The server answered with an error: the transaction rolled back.
                raise self._translate(exc) from exc
            raise CommitUnknown(f"connection lost during COMMIT: {exc}") from exc

    def _check_read_only(self, conn: _Open) -> None:
        """Prove, before COMMIT is sent, that a read-only change stayed read-only and wrote
        nothing; else it is a ``statement_error`` (the caller rolls everything back)."""
        try:
            row = conn.conn.execute(_READ_ONLY_CHECK).fetchone()
        except psycopg.Error as exc:  # COMMIT was not sent: nothing can have applied
            raise self._translate(exc) from exc
        still_read_only, transaction_ids = row if row else (False, None)
        if still_read_only is not True or transaction_ids != 1:
            raise StatementError(
                "the change is approved as read-only, but its statements "
                + ("lifted the read-only mode" if still_read_only is not True else "wrote")
                + "; the transaction was rolled back",
                detail={"access": "read_only", "still_read_only": still_read_only,
                        "transaction_ids": transaction_ids})

    def _abandon(self, conn: Any) -> None:
        if isinstance(conn, _Open):
            if conn.returned:
                return
            raw, cursors = conn.conn, conn.cursors
            if cursors.first.description is not None:
                # The first statement returned rows, still held by the cursor: let them go
                # with it rather than keep them while the connection idles.
                cursors.first = psycopg.ClientCursor(raw)
        else:
            raw, cursors = conn, self._cursors_of(conn)
        try:
            if not raw.broken and not raw.closed and raw.pgconn.transaction_status != _IDLE:
                raw.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the pool discards a broken connection
        finally:
            self._connections().putconn(raw, reset_with=cursors.reset)

    def _translate(self, exc: Exception) -> MarqueError:
        sqlstate = getattr(exc, "sqlstate", None)
        said = reason(exc)
        if sqlstate in _SERIALIZATION:
            return SerializationFailure(
                f"the target rolled the transaction back to keep it serializable: {said}",
                sqlstate=sqlstate)
        if sqlstate in _TIMEOUTS:
            return StatementTimeout(f"the target cancelled the transaction: {said}",
                                    sqlstate=sqlstate)
        if sqlstate in _READ_ONLY_REFUSALS:
            return StatementError(f"the change runs read-only and the target refused the "
                                  f"statement: {said}", sqlstate=sqlstate)
        if sqlstate is None and isinstance(exc, psycopg.OperationalError):
            # No answer, but COMMIT was never sent: the server rolls it back.
            return StatementError(f"connection to the target lost before COMMIT was sent: "
                                  f"{said}", sqlstate=sqlstate)
        return StatementError(f"the target refused the transaction: {said}", sqlstate=sqlstate)

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.conn.pgconn.transaction_status == _INTRANS)

    def _is_unique_violation(self, exc: Exception) -> bool:
        return isinstance(exc, pgerrors.UniqueViolation)

    def _reconcile_txn(self, attempt: TargetAttempt, tombstone: tuple[Any, ...]) -> Evidence:
        conn = self._checkout()
        try:
            # The identity first: a connection reaches one database for its whole life, so
            # what it reads here is where the tombstone below would go.
            foreign = self._refuses_tombstone(conn, attempt.target_id)
            if foreign is not None:
                return Evidence(Status.INDETERMINATE, reason=foreign)
            # Autocommit: the tombstone is its own transaction. It waits behind an
            # in-flight original, but only for the connection's lock_timeout.
            inserted = conn.execute(self._stamp_upsert, tombstone).fetchall()
            row = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque.stamps "
                "WHERE marque_id = %s AND nonce = %s",
                (attempt.marque_id, attempt.nonce),
            ).fetchone()
            corroboration = None
            if attempt.txid is not None:
                status = conn.execute("SELECT txid_status(%s)", (attempt.txid,)).fetchone()
                corroboration = {"txid": attempt.txid, "txid_status": status[0] if status else None}
        except psycopg.Error as exc:
            return Evidence(Status.INDETERMINATE, reason=f"tombstone not written: {exc}")
        finally:
            self._abandon(conn)
        stamp = dict(zip(STAMP_COLUMNS, row, strict=True)) if row else None
        evidence = self._stamp_evidence(attempt, stamp, bool(inserted))
        if corroboration is None:
            return evidence
        return Evidence(evidence.status, evidence.rows_affected, evidence.stamp,
                        evidence.reason, corroboration)

    def identity(self) -> str:
        conn = self._checkout()  # makes or upgrades the stamp table, identity and all
        try:
            return self._identity_on(conn)
        except psycopg.Error as exc:
            raise self._unavailable(exc, "cannot be read") from exc
        finally:
            self._abandon(conn)

    def live_stamps(self, incarnation: str, live_after: float) -> LiveStamps:
        conn = self._checkout()  # as identity(): the stamp table made or brought up to date
        try:
            target_id = self._identity_on(conn)
            rows = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque.stamps "
                "WHERE incarnation = %s AND expires_at > %s",
                (incarnation, live_after),
            ).fetchall()
            row_stamps = self._live_row_stamps_on(conn, incarnation, live_after)
        except psycopg.Error as exc:
            raise self._unavailable(exc, "cannot be read") from exc
        finally:
            self._abandon(conn)
        return LiveStamps(target_id, [dict(zip(STAMP_COLUMNS, r, strict=True)) for r in rows],
                          row_stamps)

    def _identity_on(self, conn: psycopg.Connection[TupleRow]) -> str:
        row = conn.execute(self.identity_query).fetchone()
        if row is None:
            raise TargetUnavailable(
                f"target {self.name} ({describe(self.dsn)}) has a stamp table without its "
                "identity row (marque.target_identity): someone edited it; nothing was sent "
                "to it")
        return str(row[0])

    def preview(
        self, change: Change, *, mode: str, sample_rows: int, statement_timeout_ms: int
    ) -> list[dict[str, Any]]:
        # Imported here, not with the module: they load sqlglot, which an execution never
        # needs (as in the SQLite target).
        from marque.preview_caveats import statement_caveats
        from marque.target.caveat_catalog import PostgresCatalog

        conn = self._checkout()
        results: list[dict[str, Any]] = []
        index = 0
        try:
            conn.execute(f"BEGIN ISOLATION LEVEL {_ISOLATION[change.isolation]}")
            if change.read_only:
                # As its execution will: a read approval is previewed read-only too.
                conn.execute("SET TRANSACTION READ ONLY")
            conn.execute("SELECT set_config('statement_timeout', %s, true)",
                         (f"{statement_timeout_ms}ms",))
            images = _ImageSession(conn, self.row_keys)
            catalog = PostgresCatalog(conn)
            for index, statement in enumerate(change.statements):
                caveats, previewable = statement_caveats(statement.sql, "postgres", catalog)
                if not previewable:
                    results.append(not_previewed(statement.sql, caveats))
                elif mode == "explain":
                    results.append(_explained(conn, statement, caveats))
                else:
                    results.append(_rolled_back_run(conn, images, statement, index,
                                                    sample_rows, caveats))
        except psycopg.Error as exc:
            raise self._preview_failed(exc, index, statement_timeout_ms) from exc
        finally:
            self._abandon(conn)  # ROLLBACK, always
        return results

    def _preview_failed(self, exc: psycopg.Error, index: int,
                        statement_timeout_ms: int) -> PreviewFailed:
        """What a preview that PostgreSQL stopped at statement ``index`` raises."""
        if exc.sqlstate == "57014":
            what = (f"statement {index} ran past the statement timeout "
                    f"({statement_timeout_ms} ms) and was cancelled")
        elif exc.sqlstate == "55P03":
            what = (f"statement {index} waited longer than the lock timeout "
                    f"({self.lock_timeout_ms} ms) for a lock")
        else:
            what = f"statement {index} failed: {reason(exc)}"
        return PreviewFailed(
            f"preview on target {self.name} ({describe(self.dsn)}): {what}; everything was "
            "rolled back", sqlstate=exc.sqlstate,
            detail={"sqlstate": exc.sqlstate, "statement": index})

    def stamps_of(self, marque_id: str) -> list[dict[str, Any]]:
        conn = self._checkout()
        try:
            rows = conn.execute(
                f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque.stamps WHERE marque_id = %s "
                "ORDER BY nonce", (marque_id,)).fetchall()
        except psycopg.Error as exc:
            raise self._unavailable(exc, "cannot be read") from exc
        finally:
            self._abandon(conn)
        return [dict(zip(STAMP_COLUMNS, r, strict=True)) for r in rows]

    def close(self) -> None:
        with self._pool_lock:
            self._cursors.clear()
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # -- Effect Set rows (target/rows.py) ------------------------------------------------

    def _row_open(self, statement_timeout_ms: int) -> psycopg.Connection[TupleRow]:
        conn = self._checkout()
        try:
            conn.execute("BEGIN")
            if statement_timeout_ms != self.statement_timeout_ms:
                conn.execute("SELECT set_config('statement_timeout', %s, true)",
                             (f"{statement_timeout_ms}ms",))
        except psycopg.Error as exc:  # nothing of the row was sent yet
            self._abandon(conn)
            raise self._unavailable(exc, "cannot be reached") from exc
        return conn

    def _row_read_open(self) -> psycopg.Connection[TupleRow]:
        return self._checkout()

    def _row_stamp_version(self, conn: Any) -> int:
        return stamp_schema.postgres_version(conn)

    def _table_columns(self, conn: Any, table: str) -> frozenset[str] | None:
        from marque.target.rows import quote

        # to_regclass resolves the name as a statement would (search_path, quoting) and is
        # NULL for no such relation; a PostgreSQL table may have no column at all.
        rows = self._row_exec(conn, (
            "SELECT r.oid IS NULL, a.attname FROM (SELECT to_regclass(%s) AS oid) r "
            "LEFT JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped"), (quote(table),)).fetchall()
        if rows and rows[0][0]:
            return None
        return frozenset(r[1] for r in rows if r[1] is not None)

    def _row_exec(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        cur = conn.cursor()
        cur.execute(sql, params if params else None)
        return cur

    def _row_commit(self, conn: Any) -> None:
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            if exc.sqlstate is not None and not conn.broken:
                raise self._translate(exc) from exc  # answered: rolled back
            raise CommitUnknown(f"connection lost during COMMIT: {exc}") from exc

    def _upsert_row(self, conn: Any, table: str, key: tuple[str, ...],
                    row: dict[str, Any], values: dict[str, Any]) -> str:
        """``INSERT … ON CONFLICT (key) DO UPDATE … RETURNING (xmax = 0)``: PostgreSQL's own
        answer — a freshly inserted row version has no deleting transaction (``xmax`` 0),
        the version an ``ON CONFLICT`` update wrote carries the updater's."""
        from marque.target.rows import quote

        columns = sorted(row)
        changed = sorted(values) or [key[0]]  # nothing to change: a no-op update answers
        cur = conn.cursor()
        cur.execute(
            f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in columns)}) VALUES "
            f"({', '.join('%s' for _ in columns)}) ON CONFLICT "
            f"({', '.join(quote(c) for c in key)}) DO UPDATE SET "
            + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in changed)
            + " RETURNING (xmax = 0)", tuple(row[c] for c in columns))
        answer = cur.fetchone()
        return "created" if answer and answer[0] else "updated"


# -- a preview's steps ------------------------------------------------------------------


def _explained(conn: psycopg.Connection[TupleRow], statement: Statement,
               caveats: list[dict[str, Any]]) -> dict[str, Any]:
    """An explain preview of one statement: the planner's estimate, nothing run."""
    from marque.target.row_images import explain_images

    # EXPLAIN without ANALYZE plans the statement and executes nothing.
    row = conn.execute("EXPLAIN (FORMAT JSON) " + statement.sql,
                       tuple(statement.params) or None).fetchone()
    plan = row[0] if row else None
    if isinstance(plan, str):
        plan = json.loads(plan)
    estimate = plan[0]["Plan"].get("Plan Rows") if plan else None
    return {"sql": statement.sql, "rows": estimate, "sample": None, "plan": plan,
            "row_images": explain_images(statement.sql, "postgres"),
            "preview_caveats": caveats}


def _rolled_back_run(conn: psycopg.Connection[TupleRow], images: _ImageSession,
                     statement: Statement, index: int, sample_rows: int,
                     caveats: list[dict[str, Any]]) -> dict[str, Any]:
    """One statement run inside the preview's transaction: its exact count, a sample of
    what it returns, and its row images."""
    from marque.target.row_images import finish_capture, start_capture

    capture = start_capture(images, statement.sql, statement.params)
    cur = conn.cursor()
    cur.execute(statement.sql, tuple(statement.params) or None)
    sample = None
    returned = None
    if cur.description is not None:
        rows = cur.fetchall()  # all of them: the count must be exact
        returned = ([d.name for d in cur.description], rows)
        count = len(rows)
        sample = {"columns": [d.name for d in cur.description],
                  "rows": [[_jsonable(v) for v in r] for r in rows[:sample_rows]]}
    else:
        count = max(cur.rowcount, 0)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise PreviewFailed(f"statement {index} ended the preview's transaction")
    return {"sql": statement.sql, "rows": count, "sample": sample, "plan": None,
            "row_images": finish_capture(capture, images, count, returned),
            "preview_caveats": caveats}
