"""Effect Set rows on a SQL target: read a row's state, apply one row in its own commit
unit with its per-row stamp, and reconcile a row by a tombstone (DESIGN §7, seed 002).

The flow is written once here (:class:`RowTarget`, a mixin of
:class:`~marque.target.base.SqlTarget`); engines supply the hooks — how to open
a row transaction, run one statement, commit, and upsert.

One row, one commit unit, in order:

1. the **row stamp** ``(effect_apply_key, row_idempotency_key)`` is inserted
   first (``marque_row_stamps`` / ``marque.row_stamps``): a unique violation
   means this row key was already dispatched (or tombstoned by reconciliation)
   — :class:`RowStampConflict`, rolled back, reconciled from the stamp, never
   resent;
2. the row's **guard** is checked again inside the transaction (the row read
   under the write lock — SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's ``SELECT …
   FOR UPDATE``): a row whose current version is not the preview's is
   :class:`RowConditionFailed` (the seed's failed apply-time condition, code
   ``conflict``), rolled back;
3. the **mutation**: ``INSERT`` (create), ``UPDATE`` (update), ``DELETE``
   (delete), or an upsert whose ``action`` is the database's own answer
   (PostgreSQL: ``RETURNING (xmax = 0)``; SQLite: see
   :meth:`~marque.target.sqlite.SqliteTarget._upsert_row`). It must affect
   exactly one row;
4. the stamp's ``rows_affected`` and ``action``, then ``COMMIT``.

An error the server answered with before or at COMMIT is a ``NotApplied``
(the row failed; nothing of it committed); a COMMIT whose answer was lost is
:class:`~marque.errors.CommitUnknown` (the row is unknown). Identifiers come
from a validated declaration (plain SQL identifiers) and are quoted anyway.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from marque.effects import cids, fence
from marque.effects._frozen import freeze
from marque.errors import CommitUnknown, MarqueError, NotApplied, StatementError, UndoConflict
from marque.outcome import Status
from marque.target.drivers import is_driver_error
from marque.target.identity import refuses_tombstone
from marque.target.values import jsonable

#: The stamp-table version that added the row stamps (target/stamps.py).
ROW_STAMPS_SINCE = 3
ROW_STAMP_COLUMNS = (
    "effect_apply_key", "row_idempotency_key", "marque_id", "nonce", "dispatch_attempt", "kind",
    "pilot_id", "incarnation", "rows_affected", "action", "created_at", "expires_at",
)


@dataclass(frozen=True)
class RowWrite:
    """One Effect Set row to apply: where, what, under which keys and guard."""

    marque_id: str
    nonce: str
    #: The dispatch ledger's attempt of this row (1 for its first dispatch).
    dispatch_attempt: int
    pilot_id: str
    incarnation: str
    effect_apply_key: str
    row_idempotency_key: str
    kind: str
    table: str
    key: tuple[str, ...]
    #: The key values (keyed kinds, and create with a key); ``{}`` otherwise.
    identity: dict[str, Any]
    #: The columns the row writes (the whole row for create; non-key columns otherwise).
    values: dict[str, Any]
    #: The preview's ``target_version`` guard of the row.
    guard: dict[str, Any]
    statement_timeout_ms: int
    expires_at: float | None = None
    #: The identity of the database the row was sent to (see ``TargetAttempt.target_id``).
    target_id: str | None = None
    #: The row state the row must hold to be written (a fenced member's, see
    #: :mod:`marque.effects.fence`); None: no fence.
    fence: dict[str, Any] | None = None


@dataclass(frozen=True)
class RowApplied:
    """What the database answered for one committed row."""

    rows_affected: int
    action: str | None


@dataclass(frozen=True)
class RowEvidence:
    """What reconciliation observed about one row: ``applied`` (with its stamp's rows and
    action), ``aborted_not_applied`` (a tombstone proved it), or ``indeterminate``."""

    status: Status
    rows_affected: int | None = None
    action: str | None = None
    stamp: dict[str, Any] | None = None
    reason: str = ""


class RowStampConflict(Exception):
    """The row key already has a stamp: reconcile, don't send."""


class RowConditionFailed(NotApplied):
    """The row's apply-time condition failed (it changed since the preview, or the mutation
    did not affect exactly one row): rolled back, the row failed with code ``conflict``
    (seed 002). Not a registered code of its own: ``conflict`` is
    :class:`~marque.errors.Conflict`'s, and this one only travels inside a row's outcome."""

    code = "conflict"


class ColumnsMissing(StatementError):
    """The table does not exist, or lacks a column a member names (found before any
    statement was sent, :meth:`RowTarget._check_columns`). Code ``statement_error``, as the
    database's own refusal would be; its own class so that apply admission can tell it from
    a read that failed for another reason."""


def _target_said(exc: Exception) -> bool:
    """Whether ``exc`` is the target's answer (a Marque error an engine raised, or its
    driver's), not a fault of ours."""
    return isinstance(exc, MarqueError) or is_driver_error(exc)


def quote(identifier: str) -> str:
    """A quoted SQL identifier, ``schema.name`` quoted part by part."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in identifier.split("."))


class RowTarget(abc.ABC):
    """Effect Set rows over an engine's hooks (a mixin of ``SqlTarget``)."""

    name: str
    placeholder: str
    row_stamp_table: str
    #: Reads the target's identity (stamp table migration 5).
    identity_query: str
    #: Appended to the row read inside a row transaction, to lock it (PostgreSQL).
    row_lock_clause = ""
    #: The SQLSTATEs the engine gives a missing table and a missing column (None: it has
    #: none), kept on the refusal :meth:`_check_columns` answers with.
    undefined_table_sqlstate: str | None = None
    undefined_column_sqlstate: str | None = None

    # -- engine hooks ---------------------------------------------------------------

    @abc.abstractmethod
    def location(self) -> str:
        """Where the target's data lives, without credentials (for messages)."""

    @abc.abstractmethod
    def _row_open(self, statement_timeout_ms: int) -> Any:
        """A connection with a write transaction open and the stamp table ready."""

    @abc.abstractmethod
    def _row_read_open(self) -> Any:
        """A connection for reads (no write lock), stamp table not needed."""

    @abc.abstractmethod
    def _row_stamp_version(self, conn: Any) -> int:
        """The target's stamp-table version (0: none); row stamps exist from version 3."""

    @abc.abstractmethod
    def _row_exec(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        """Run one statement; a cursor (``rowcount``, ``description``, ``fetch*``)."""

    @abc.abstractmethod
    def _table_columns(self, conn: Any, table: str) -> frozenset[str] | None:
        """The columns of ``table`` (hidden and generated ones too), each as
        :meth:`_column_name` spells it, or None when the table does not exist."""

    def _column_name(self, column: str) -> str:
        """A column name as the engine compares a quoted identifier (exactly, by default)."""
        return column

    @abc.abstractmethod
    def _row_commit(self, conn: Any) -> None:
        """COMMIT: ``NotApplied`` for an answered error, ``CommitUnknown`` for a lost answer."""

    # The target's own hooks serve rows too (``SqlTarget``): ``_abandon`` rolls back what
    # is open and releases the connection, ``_translate`` turns a driver error before
    # COMMIT into the most specific ``NotApplied``, ``_is_unique_violation`` says a key
    # conflict.

    @abc.abstractmethod
    def _abandon(self, conn: Any) -> None:
        """Roll back whatever is open and release the connection; never raises."""

    @abc.abstractmethod
    def _translate(self, exc: Exception) -> MarqueError:
        """A driver error before COMMIT, as the most specific ``NotApplied``."""

    @abc.abstractmethod
    def _is_unique_violation(self, exc: Exception) -> bool:
        """Whether ``exc`` is a unique-key violation."""

    @abc.abstractmethod
    def _upsert_row(self, conn: Any, table: str, key: tuple[str, ...],
                    row: dict[str, Any], values: dict[str, Any]) -> str:
        """Insert ``row`` or update its ``values`` by ``key``; the database's own answer,
        ``created`` or ``updated``."""

    # -- SQL ------------------------------------------------------------------------

    def _p(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    def _where(self, identity: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        columns = sorted(identity)
        return (" AND ".join(f"{quote(c)} = ?" for c in columns),
                tuple(identity[c] for c in columns))

    def _read_one(self, conn: Any, table: str, identity: dict[str, Any], *,
                  lock: bool = False) -> dict[str, Any]:
        where, params = self._where(identity)
        cur = self._row_exec(conn, self._p(f"SELECT * FROM {quote(table)} WHERE {where}"
                                           + (self.row_lock_clause if lock else "")), params)
        rows = cur.fetchmany(2)
        if not rows:
            return {"state": "absent"}
        if len(rows) > 1:
            raise RowConditionFailed(f"{table}: the key {identity} names more than one row; an "
                                     "Effect Set's key must be the table's primary key")
        columns = [d[0] for d in cur.description]
        return {"state": "present",
                "value": {c: jsonable(v) for c, v in zip(columns, rows[0], strict=True)}}

    def _check_columns(self, conn: Any, table: str, columns: set[str]) -> None:
        """Refuse, before any statement names them, a table that does not exist and
        ``columns`` it does not have (:class:`ColumnsMissing`, detail
        ``table`` and ``columns``). Every engine checks, so both answer alike; on SQLite it
        is what keeps a double-quoted name that is no column from being read as a string
        literal (``WHERE "nokey" = 'nokey'`` is true for every row)."""
        have = self._table_columns(conn, table)
        if have is None:
            raise ColumnsMissing(f"no such table: {table}",
                                 sqlstate=self.undefined_table_sqlstate,
                                 detail={"table": table, "columns": []})
        missing = sorted(c for c in columns if self._column_name(c) not in have)
        if missing:
            raise ColumnsMissing(f"table {table} has no column(s) {', '.join(missing)}",
                                 sqlstate=self.undefined_column_sqlstate,
                                 detail={"table": table, "columns": missing})

    def read_rows(self, table: str, identities: list[dict[str, Any]],
                  columns: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The current state of each row (``present`` with its whole row, or ``absent``), in
        one read-only transaction: what a preview and apply admission see. Every column the
        identities and ``columns`` name must be the table's (:meth:`_check_columns`)."""
        conn = self._row_read_open()
        try:
            self._check_columns(conn, table, {c for i in identities for c in i} | set(columns))
            return [self._read_one(conn, table, identity) for identity in identities]
        except Exception as exc:
            if isinstance(exc, MarqueError) or not is_driver_error(exc):
                raise
            raise self._translate(exc) from exc
        finally:
            self._abandon(conn)

    def _refuses_tombstone(self, conn: Any, sent_to: str | None) -> str | None:
        """Why no tombstone may be written over ``conn`` (its database is not the one the
        attempt was sent to, :mod:`marque.target.identity`), or None: the identity is read
        in the tombstone's own transaction. Nonce and row tombstones alike."""
        return refuses_tombstone(self.name, self.location(),
                                 self._row_exec(conn, self.identity_query, ()).fetchone(),
                                 sent_to)

    def _row_stamp(self, write: RowWrite, kind: str) -> tuple[Any, ...]:
        return (write.effect_apply_key, write.row_idempotency_key, write.marque_id, write.nonce,
                write.dispatch_attempt, kind, write.pilot_id, write.incarnation, time.time(),
                write.expires_at)

    def _stamp_sql(self, *, upsert: bool) -> str:
        text = (f"INSERT INTO {self.row_stamp_table} (effect_apply_key, row_idempotency_key, "
                "marque_id, nonce, dispatch_attempt, kind, pilot_id, incarnation, rows_affected, "
                "action, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)")
        if upsert:
            text += " ON CONFLICT (effect_apply_key, row_idempotency_key) DO NOTHING"
        return self._p(text + " RETURNING dispatch_attempt")

    def apply_row(self, write: RowWrite) -> RowApplied:
        """Apply one row in its own commit unit with its stamp (see the module docstring)."""
        conn = self._row_open(write.statement_timeout_ms)
        committing = False
        try:
            self._check_columns(conn, write.table,
                                {*write.key, *write.identity, *write.values})
            self._insert_row_stamp(conn, write)
            if write.guard.get("kind") == "row_content":
                current = self._read_one(conn, write.table, write.identity, lock=True)
                if cids.row_content_guard(current) != dict(write.guard):
                    raise RowConditionFailed(
                        f"{write.table} row {write.identity} changed since the preview (its "
                        "version is not the approved guard); rolled back, nothing resent")
            if write.fence is not None:
                self._check_fence(conn, write)
            count, action = self._mutate(conn, write)
            if count != 1:
                raise RowConditionFailed(f"the {write.kind} of {write.table} row "
                                         f"{write.identity} affected {count} rows, not 1")
            self._row_exec(conn, self._p(
                f"UPDATE {self.row_stamp_table} SET rows_affected = ?, action = ? "
                "WHERE effect_apply_key = ? AND row_idempotency_key = ?"),
                (count, action, write.effect_apply_key, write.row_idempotency_key))
            committing = True
            self._row_commit(conn)
        except (RowStampConflict, MarqueError):
            raise
        except Exception as exc:
            if committing:  # whatever it was, COMMIT may have been sent: unknown, never failed
                raise CommitUnknown(f"COMMIT's outcome is unknown: {exc}") from exc
            if not is_driver_error(exc):
                raise  # a fault of ours, not the database's answer: the Pilot says unknown
            raise self._translate(exc) from exc
        finally:
            self._abandon(conn)
        return RowApplied(count, action)

    def _check_fence(self, conn: Any, write: RowWrite) -> None:
        """Refuse (``UndoConflict``) a row that no longer holds its fence, read under the
        write lock so nothing changes it between the check and the mutation."""
        assert write.fence is not None
        current = self._read_one(conn, write.table, write.identity, lock=True)
        if not fence.holds(current, freeze(write.fence)):
            key = ", ".join(f"{k}={v}" for k, v in sorted(write.identity.items()))
            raise UndoConflict(
                f"{write.table} row {key} no longer holds what it is fenced on (it changed "
                "since the original execution wrote it); rolled back, this row only",
                detail={"table": write.table, "key": dict(write.identity)})

    def _insert_row_stamp(self, conn: Any, write: RowWrite) -> None:
        """The row's stamp, first in its transaction: :class:`RowStampConflict` if the row
        key already has one (dispatched before, or tombstoned)."""
        try:
            self._row_exec(conn, self._stamp_sql(upsert=False),
                           self._row_stamp(write, "applied"))
        except Exception as exc:
            if self._is_unique_violation(exc):
                raise RowStampConflict(write.row_idempotency_key) from exc
            raise

    def _mutate(self, conn: Any, write: RowWrite) -> tuple[int, str | None]:
        """The row's one mutation: the rows it affected, and the upsert's action (the
        database's own answer, ``created`` or ``updated``; None for the other kinds)."""
        table = quote(write.table)
        if write.kind == "create":
            columns = sorted(write.values)
            cur = self._row_exec(conn, self._p(
                f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) VALUES "
                f"({', '.join('?' for _ in columns)})"),
                tuple(write.values[c] for c in columns))
            return cur.rowcount, None
        if write.kind == "update":
            columns = sorted(write.values)
            where, params = self._where(write.identity)
            cur = self._row_exec(conn, self._p(
                f"UPDATE {table} SET {', '.join(f'{quote(c)} = ?' for c in columns)} "
                f"WHERE {where}"), tuple(write.values[c] for c in columns) + params)
            return cur.rowcount, None
        if write.kind == "delete":
            where, params = self._where(write.identity)
            cur = self._row_exec(conn, self._p(f"DELETE FROM {table} WHERE {where}"), params)
            return cur.rowcount, None
        if write.kind == "upsert":
            return 1, self._upsert_row(conn, write.table, write.key,
                                       {**write.identity, **write.values}, write.values)
        raise RowConditionFailed(f"a SQL target cannot apply a {write.kind} row")

    def reconcile_row(self, write: RowWrite) -> RowEvidence:
        """Observe, never resend: a tombstone stamp for the row key in its own transaction.

        Inserted: this dispatch never committed and now never can. Refused: the
        stamp there says — this dispatch's applied stamp proves it applied (with
        the rows and action it recorded); any other stamp proves it did not.
        """
        try:
            conn = self._row_open(write.statement_timeout_ms)
        except Exception as exc:
            if not _target_said(exc):
                raise  # a fault of ours: said as such; the row stays as it was
            return RowEvidence(Status.INDETERMINATE, reason=f"target unavailable: {exc}")
        try:
            foreign = self._refuses_tombstone(conn, write.target_id)
            if foreign is not None:
                return RowEvidence(Status.INDETERMINATE, reason=foreign)
            inserted = self._row_exec(conn, self._stamp_sql(upsert=True),
                                      self._row_stamp(write, "tombstone")).fetchall()
            found = self._row_exec(conn, self._p(
                f"SELECT {', '.join(ROW_STAMP_COLUMNS)} FROM {self.row_stamp_table} "
                "WHERE effect_apply_key = ? AND row_idempotency_key = ?"),
                (write.effect_apply_key, write.row_idempotency_key)).fetchone()
            self._row_commit(conn)
        except Exception as exc:
            if not _target_said(exc):
                raise
            return RowEvidence(Status.INDETERMINATE, reason=f"tombstone not written: {exc}")
        finally:
            self._abandon(conn)
        stamp = dict(zip(ROW_STAMP_COLUMNS, found, strict=True)) if found else None
        if inserted:
            return RowEvidence(Status.ABORTED_NOT_APPLIED, stamp=stamp,
                               reason="row tombstone inserted: the row never committed and "
                                      "now never can")
        if stamp is None:
            return RowEvidence(Status.INDETERMINATE, reason="no row stamp after a refused "
                                                            "tombstone")
        mine = (stamp["marque_id"], stamp["nonce"], stamp["dispatch_attempt"]) == (
            write.marque_id, write.nonce, write.dispatch_attempt)
        if mine and stamp["kind"] == "applied":
            return RowEvidence(Status.APPLIED, stamp["rows_affected"], stamp["action"], stamp,
                               "applied row stamp of this dispatch found")
        return RowEvidence(Status.ABORTED_NOT_APPLIED, stamp=stamp,
                           reason=f"the row key's stamp is a {stamp['kind']} of marque "
                                  f"{stamp['marque_id']} nonce {stamp['nonce']} dispatch "
                                  f"{stamp['dispatch_attempt']}: this dispatch never committed")

    def row_stamps_of_marque(self, marque_id: str) -> list[dict[str, Any]]:
        """Every row stamp of one marque, whatever its nonce (evidence, DESIGN §10): an
        Effect Set's executions leave row stamps only, never a nonce-level stamp."""
        return self._select_row_stamps("marque_id = ? ORDER BY nonce, created_at",
                                       (marque_id,))

    def _live_row_stamps_on(self, conn: Any, incarnation: str,
                            live_after: float) -> list[dict[str, Any]]:
        """Row stamps a Pilot incarnation left, of marques live after a time, read on
        ``conn`` (the continuity check, DESIGN §5: an Effect Set leaves no nonce-level
        stamp); driver errors are the caller's to translate."""
        return self._row_stamps_on(conn, "incarnation = ? AND expires_at > ?",
                                   (incarnation, live_after))

    def _select_row_stamps(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        """Row stamps matching ``where``; none where no Effect Set ever ran (no table yet)."""
        conn = self._row_read_open()
        try:
            return self._row_stamps_on(conn, where, params)
        except Exception as exc:
            if isinstance(exc, MarqueError) or not is_driver_error(exc):
                raise
            raise self._translate(exc) from exc
        finally:
            self._abandon(conn)

    def _row_stamps_on(self, conn: Any, where: str,
                       params: tuple[Any, ...]) -> list[dict[str, Any]]:
        if self._row_stamp_version(conn) < ROW_STAMPS_SINCE:
            return []
        rows = self._row_exec(conn, self._p(
            f"SELECT {', '.join(ROW_STAMP_COLUMNS)} FROM {self.row_stamp_table} "
            f"WHERE {where}"), params).fetchall()
        return [dict(zip(ROW_STAMP_COLUMNS, r, strict=True)) for r in rows]
