"""A target database as the Pilot sees it: fenced execution and reconciliation.

The flow of DESIGN §3 steps 3–5 is the same on every engine, so it is written
once here (:meth:`SqlTarget.execute`); engines supply the hooks: how to
connect and begin, how to run one statement, how to read a driver error.

A change approved as a read (``access: "read_only"``, DESIGN §11.3) runs
read-only from right after its stamp: the engines enter that mode together
with the stamp insert and leave it, on the way to COMMIT, only to record the
stamp's ``rows_affected``. A classifier cannot see inside a function; the
database can, so a write under a read approval can only fail
(``statement_error``, rolled back, stamp and all).

The *stamp* row ``(marque_id, nonce)`` is the fence. It is inserted first in
the target transaction, so it commits or vanishes with the change itself, and
it is the target's own record of what Marque did. Its primary key admits one
row per nonce; a later attempt may replace only a *tombstone* of an earlier
attempt, never an applied stamp — so a stale attempt can never apply after
reconciliation proved it had not.
"""

from __future__ import annotations

import abc
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from marque.change import Change, Guard
from marque.crash import crash_point
from marque.errors import (
    CommitUnknown,
    GuardFailed,
    MarqueError,
    MaxRowsExceeded,
    PreviewFailed,
    TargetUnavailable,
    UndoConflict,
)
from marque.outcome import Status
from marque.target.drivers import is_driver_error
from marque.target.rows import RowTarget
from marque.target.values import jsonable

Emit = Callable[..., None]

STAMP_APPLIED = "applied"
STAMP_TOMBSTONE = "tombstone"
STAMP_COLUMNS = (
    "marque_id", "nonce", "attempt", "kind", "pilot_id", "incarnation", "rows_affected",
    "created_at", "expires_at",
)


@dataclass(frozen=True)
class LiveStamps:
    """A target's identity and the stamps it holds of one Pilot incarnation's live marques
    (:meth:`Target.live_stamps`)."""

    target_id: str
    stamps: list[dict[str, Any]]
    row_stamps: list[dict[str, Any]]


@dataclass(frozen=True)
class TargetAttempt:
    """One attempt to apply a change on a target."""

    marque_id: str
    nonce: str
    number: int
    pilot_id: str
    incarnation: str
    change: Change | None  # None when the attempt is only reconciled, never executed
    max_rows: int
    statement_timeout_ms: int
    #: The target's transaction id, where the engine has one and it is known.
    txid: int | None = None
    #: The marque's expiry, written on the stamp so start-up checks look at live ones only.
    expires_at: float | None = None
    #: The name of the target the attempt runs on, as the Pilot knows it.
    target: str = ""
    #: The identity of the database the attempt was sent to (the ledger's binding of the
    #: name, or the pin a rebinding left): reconciliation writes a tombstone only in a
    #: database of that identity, and none while it is not known.
    target_id: str | None = None


@dataclass(frozen=True)
class Committed:
    """What a committed attempt did."""

    rows_affected: int
    result: dict[str, Any] | None
    txid: int | None = None


@dataclass(frozen=True)
class Evidence:
    """What reconciliation observed about one attempt.

    ``status`` is what the evidence proves: ``applied``, ``aborted_not_applied``,
    or ``indeterminate`` when nothing could be proved.
    """

    status: Status
    rows_affected: int | None = None
    stamp: dict[str, Any] | None = None
    reason: str = ""
    corroboration: dict[str, Any] | None = None


class Target(abc.ABC):
    """A database the Pilot executes approved changes on."""

    name: str
    #: Row keys its operator declared (pilot.json ``row_keys``): ``[schema.]table`` →
    #: columns, naming the rows of tables without a key of their own in previews.
    row_keys: Mapping[str, Sequence[str]] = MappingProxyType({})

    @abc.abstractmethod
    def execute(self, attempt: TargetAttempt, emit: Emit) -> Committed:
        """Apply ``run`` in one fenced transaction.

        Raises a ``NotApplied`` error when an error was received before or at
        COMMIT (rolled back), ``CommitUnknown`` when COMMIT's fate is unknown,
        and ``StampConflict`` when the fence says this nonce already has a stamp.
        """

    @abc.abstractmethod
    def reconcile(self, attempt: TargetAttempt) -> Evidence:
        """Observe, never resend: settle the attempt by a tombstone stamp."""

    @abc.abstractmethod
    def live_stamps(self, incarnation: str, live_after: float) -> LiveStamps:
        """What the continuity check reads (DESIGN §5), on one connection: the target's
        identity (as :meth:`identity`), and the stamps and Effect Set row stamps it holds
        for a Pilot incarnation, of marques live after a time; ``TargetUnavailable`` if
        they cannot be read."""

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing
        """Release connections."""

    def preview(
        self, change: Change, *, mode: str, sample_rows: int, statement_timeout_ms: int
    ) -> list[dict[str, Any]]:
        """Preview ``change`` (DESIGN §10): one ``{sql, rows, sample, plan, preview_caveats}``
        per statement (``marque.preview_caveats``; a statement that cannot run in a
        transaction is not run, and its caveat says so).

        ``rollback`` runs the statements in a transaction that is always rolled
        back; ``explain`` only asks the planner. Never stamps. A statement
        error is :class:`~marque.errors.PreviewFailed`.
        """
        raise PreviewFailed(f"target {self.name} ({type(self).__name__}) cannot run previews "
                            "yet; nothing was executed")

    def stamps_of(self, marque_id: str) -> list[dict[str, Any]]:
        """Every stamp this target holds for one marque (evidence, DESIGN §10)."""
        raise TargetUnavailable(f"target {self.name} ({type(self).__name__}) cannot list the "
                                "stamps of one marque yet")

    def identity(self) -> str:
        """The target's identity (``target_id``, made once with its stamp table, which this
        creates or upgrades if needed); ``TargetUnavailable`` if it cannot be read."""
        raise TargetUnavailable(f"target {self.name} ({type(self).__name__}) has no identity")

    def location(self) -> str:
        """Where this target's data lives, without credentials (a file, or
        ``host:port/dbname``): an Effect Set Run binds it (resume revalidation)."""
        return self.name

    def row_stamps_of_marque(self, marque_id: str) -> list[dict[str, Any]]:
        """Every Effect Set row stamp of one marque; none on a target without row stamps."""
        return []



class StampConflict(Exception):
    """The fence pre-check found a stamp for this nonce: reconcile, don't run."""


class SqlTarget(RowTarget, Target):
    """The fenced-transaction flow, over an engine's hooks; Effect Set rows (one commit unit
    per row with its row stamp) come from :class:`~marque.target.rows.RowTarget`."""

    #: The placeholder the driver wants, for the stamp statements.
    placeholder = "?"
    #: The engine's stamp table (:data:`marque.target.stamps.SQLITE_TABLES` and its sibling).
    stamp_table: str
    #: What the stamp insert returns: at least the attempt; engines add their txid.
    stamp_returning = "attempt"

    # -- engine hooks -----------------------------------------------------------

    @abc.abstractmethod
    def _begin(self, attempt: TargetAttempt) -> Any:
        """Connect, begin the transaction with the run's isolation and timeouts."""

    @abc.abstractmethod
    def _execute_statement(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        """Execute one statement; return a cursor."""

    def _stamp(self, conn: Any, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Send the stamp insert (engines may send it together with BEGIN); its rows."""
        return list(self._execute_statement(conn, sql, params).fetchall())

    def _stamp_then(self, conn: Any, attempt: TargetAttempt, emit: Emit) -> tuple[list[Any], Any]:
        """The stamp's rows, and a cursor on the first statement if it travelled with it.

        Engines with a network between the Pilot and the database may send the
        first statement in the same message as the stamp, *after* it: a stamp
        that conflicts then fails the message before the statement runs. Such
        an engine emits ``statement_started`` for it as it sends the message,
        so that event comes before ``fence_checked``. An empty list means the
        fence found a stamp for this nonce.
        """
        try:
            row = self._stamp_row(attempt, STAMP_APPLIED)
            return self._stamp(conn, self._stamp_upsert, row), None
        except Exception as exc:
            if self._is_unique_violation(exc):
                return [], None
            raise

    @abc.abstractmethod
    def _finish(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        """Record rows_affected on the stamp (``sql``) and COMMIT.

        Raises NotApplied for an error the server *answered* with; any other
        exception means the outcome is not known.
        """

    @abc.abstractmethod
    def _abandon(self, conn: Any) -> None:
        """Roll back if possible and close; never raises."""

    @abc.abstractmethod
    def _translate(self, exc: Exception) -> MarqueError:
        """A driver error received before COMMIT, as the most specific NotApplied."""

    def _translate_begin(self, exc: Exception) -> MarqueError:
        """A driver error while connecting or beginning, before anything of the attempt was
        sent: engines say ``TargetUnavailable`` where the target could not be used at all."""
        return self._translate(exc)

    @abc.abstractmethod
    def _in_transaction(self, conn: Any) -> bool:
        """Whether the transaction the Pilot opened is still open."""

    @abc.abstractmethod
    def _is_unique_violation(self, exc: Exception) -> bool:
        """Whether ``exc`` is a primary-key conflict."""

    @abc.abstractmethod
    def _reconcile_txn(self, attempt: TargetAttempt, tombstone: tuple[Any, ...]) -> Evidence:
        """Insert the tombstone in its own transaction and read the stamp."""

    # -- shared SQL -------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("?", self.placeholder).replace("{stamps}", self.stamp_table)

    @functools.cached_property
    def _stamp_upsert(self) -> str:
        # One row per nonce: a new row, or a newer attempt replacing an older
        # attempt's tombstone. An applied stamp is never replaced.
        return self._sql(
            "INSERT INTO {stamps} (marque_id, nonce, attempt, kind, pilot_id, incarnation, "
            "rows_affected, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?) "
            "ON CONFLICT (marque_id, nonce) DO UPDATE SET attempt = excluded.attempt, "
            "kind = excluded.kind, pilot_id = excluded.pilot_id, "
            "incarnation = excluded.incarnation, rows_affected = NULL, "
            "created_at = excluded.created_at, expires_at = excluded.expires_at "
            "WHERE {stamps}.kind = 'tombstone' AND {stamps}.attempt < excluded.attempt "
            "RETURNING " + self.stamp_returning
        )

    @functools.cached_property
    def _stamp_insert(self) -> str:
        # The fence for a first attempt: no earlier tombstone can exist to replace.
        return self._sql(
            "INSERT INTO {stamps} (marque_id, nonce, attempt, kind, pilot_id, incarnation, "
            "rows_affected, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?) "
            "RETURNING " + self.stamp_returning
        )

    @functools.cached_property
    def _stamp_rows_affected(self) -> str:
        # Sent with COMMIT: the stamp records what the change did.
        return self._sql("UPDATE {stamps} SET rows_affected = ? WHERE marque_id = ? AND nonce = ?")

    def _stamp_row(self, attempt: TargetAttempt, kind: str) -> tuple[Any, ...]:
        return (attempt.marque_id, attempt.nonce, attempt.number, kind, attempt.pilot_id,
                attempt.incarnation, time.time(), attempt.expires_at)

    @staticmethod
    def _stamp_evidence(
        attempt: TargetAttempt, stamp: dict[str, Any] | None, inserted: bool
    ) -> Evidence:
        """Read the stamp left after a tombstone try.

        Only a stamp of *this* attempt is evidence that this attempt applied. A
        stamp of another attempt of the same nonce proves only that this one
        never committed and now never can: its applied stamp would never have
        been replaced, and while its transaction was open nobody else could
        have written the row.
        """
        if inserted:
            return Evidence(Status.ABORTED_NOT_APPLIED, stamp=stamp,
                            reason="tombstone inserted: the attempt never committed and now "
                                   "never can")
        if stamp is None:
            return Evidence(Status.INDETERMINATE, reason="no stamp after a refused tombstone")
        if stamp["attempt"] != attempt.number:
            return Evidence(
                Status.ABORTED_NOT_APPLIED, stamp=stamp,
                reason=f"the nonce's stamp belongs to attempt {stamp['attempt']} "
                       f"({stamp['kind']}): attempt {attempt.number} never committed and now "
                       "never can")
        if stamp["kind"] == STAMP_APPLIED:
            return Evidence(Status.APPLIED, rows_affected=stamp["rows_affected"], stamp=stamp,
                            reason="applied stamp of this attempt found")
        return Evidence(Status.ABORTED_NOT_APPLIED, stamp=stamp,
                        reason="tombstone of this attempt found: it never committed")

    # -- the fenced transaction -------------------------------------------------

    def execute(self, attempt: TargetAttempt, emit: Emit) -> Committed:
        assert attempt.change is not None, "execute needs the approved change"
        change = attempt.change
        conn = self._open(attempt)
        committing = False
        txid: int | None = None
        try:
            crash_point("after_begin")
            txid, first = self._fence(conn, attempt, emit)
            crash_point("after_stamp")
            self._check_guards(conn, change, "before", emit)
            total, result = self._run_statements(conn, attempt, first, txid, emit)
            self._check_guards(conn, change, "after", emit)
            emit("asserted", rows_affected=total, max_rows=attempt.max_rows)
            crash_point("before_commit")
            committing = True
            self._finish(conn, self._stamp_rows_affected,
                         (total, attempt.marque_id, attempt.nonce))
        except (StampConflict, MarqueError) as exc:
            self._abandon(conn)
            if isinstance(exc, CommitUnknown) and txid is not None:
                exc.detail.setdefault("txid", txid)
            raise
        except Exception as exc:
            self._abandon(conn)
            if committing:  # whatever it was, COMMIT may have been sent: unknown, never failed
                raise CommitUnknown(f"COMMIT's outcome is unknown: {exc}",
                                    detail={"txid": txid}) from exc
            if not is_driver_error(exc):
                raise  # a fault of ours, not the database's answer: the Pilot says unknown
            raise self._translate(exc) from exc
        else:
            self._abandon(conn)
        emit("committed", rows_affected=total)
        crash_point("after_commit")
        return Committed(total, result, txid)

    def _open(self, attempt: TargetAttempt) -> Any:
        """The attempt's connection with its transaction begun (``_begin``); a driver error
        there is the engine's to name (``_translate_begin``): nothing was sent yet."""
        try:
            return self._begin(attempt)
        except MarqueError:
            raise
        except Exception as exc:
            if not is_driver_error(exc):
                raise
            raise self._translate_begin(exc) from exc

    def _fence(self, conn: Any, attempt: TargetAttempt, emit: Emit) -> tuple[int | None, Any]:
        """Step 3's fence pre-check: the stamp inserted (``StampConflict`` if the nonce has
        one), ``fence_checked`` said; the target's txid, and the first statement's cursor
        if it travelled with the stamp."""
        change = attempt.change
        assert change is not None
        inserted, first = self._stamp_then(conn, attempt, emit)
        if not inserted:
            raise StampConflict(f"{attempt.marque_id}/{attempt.nonce} already has a stamp")
        txid = inserted[0][1] if len(inserted[0]) > 1 else None
        # A read-only change entered read-only mode together with its stamp: say so.
        emit("fence_checked", stamp="inserted",
             **({"txid": txid} if txid is not None else {}),
             **({"access": change.access} if change.access is not None else {}))
        return txid, first

    def _run_statements(self, conn: Any, attempt: TargetAttempt, first: Any,
                        txid: int | None, emit: Emit) -> tuple[int, dict[str, Any] | None]:
        """Step 4: the statements exactly as approved, each asserted as it finishes; the
        rows they affected in all, and the last read's result."""
        assert attempt.change is not None
        total = 0
        result: dict[str, Any] | None = None
        for index, statement in enumerate(attempt.change.statements):
            if index == 0 and first is not None:
                cur = first  # it ran right behind the stamp, in the same message
            else:
                emit("statement_started", index=index, sql=statement.sql)
                cur = self._execute_statement(conn, statement.sql, tuple(statement.params))
            if cur.description is not None:
                rows = self._fetch_bounded(cur, attempt.max_rows - total, attempt.max_rows)
                count = len(rows)
                result = {"columns": [d[0] for d in cur.description],
                          "rows": [[jsonable(v) for v in r] for r in rows]}
            else:
                count = max(cur.rowcount, 0)
            total += count
            if not self._in_transaction(conn):
                # Validation refuses transaction control, so this is a hole in it: what
                # committed is for reconciliation to find out, not us to guess.
                raise CommitUnknown(f"COMMIT's outcome is unknown: statement {index} ended "
                                    "the Pilot's transaction", detail={"txid": txid})
            emit("statement_finished", index=index, rows=count)
            _check_expected_rows(index, statement.expect_rows, count)
            crash_point("after_statement")
            if total > attempt.max_rows:
                raise MaxRowsExceeded(
                    f"statements affected {total} rows; the marque allows at most "
                    f"{attempt.max_rows}"
                )
        return total, result

    def _fetch_bounded(self, cur: Any, remaining: int, max_rows: int) -> list[Any]:
        # Fetch one row past the allowance to *detect* an excess; never truncate.
        rows = cur.fetchmany(max(remaining, 0) + 1)
        if len(rows) > remaining:
            raise MaxRowsExceeded(
                f"the statements return more than the {max_rows} rows the marque allows"
            )
        return list(rows)

    def _check_guards(self, conn: Any, change: Change, phase: str, emit: Emit) -> None:
        for index, guard in enumerate(change.guards):
            if guard.when not in (phase, "both"):
                continue
            value = self._guard_value(conn, guard)
            if value != guard.expect:
                raise GuardFailed(
                    f"guard {index} ({phase}) expected {guard.expect!r}, found {value!r}"
                )
            emit("guard_checked", index=index, phase=phase)

    def _guard_value(self, conn: Any, guard: Guard) -> Any:
        row = self._execute_statement(conn, guard.sql, tuple(guard.params)).fetchone()
        if row is None:
            return None
        value = row[0]
        # SQLite has no booleans: 1/0 stand for true/false.
        if isinstance(guard.expect, bool) and isinstance(value, int):
            return bool(value)
        return value

    def reconcile(self, attempt: TargetAttempt) -> Evidence:
        try:
            return self._reconcile_txn(attempt, self._stamp_row(attempt, STAMP_TOMBSTONE))
        except Exception as exc:
            if not (isinstance(exc, MarqueError) or is_driver_error(exc)):
                raise  # a fault of ours: said as such; the attempt stays as it was
            # The target could not be asked: nothing is known.
            return Evidence(Status.INDETERMINATE, reason=f"target unavailable: {exc}")


def _check_expected_rows(index: int, expect: int | None, count: int) -> None:
    """A fenced statement (``expect_rows``, as an undo's are) must touch exactly that many
    rows: else :class:`UndoConflict`, and the whole transaction rolls back."""
    if expect is not None and count != expect:
        raise UndoConflict(
            f"statement {index} touched {count} row(s) where its approval expects exactly "
            f"{expect}: a row it is fenced on no longer holds what it was fenced on; "
            "everything was rolled back, nothing applied", detail={"statement": index})


def not_previewed(sql: str, caveats: list[dict[str, Any]]) -> dict[str, Any]:
    """The preview entry of a statement that was not run (its caveats say why): no rows,
    no sample, no plan — never a guess."""
    return {"sql": sql, "rows": None, "sample": None, "plan": None, "preview_caveats": caveats,
            # As row_images.unavailable says it: nothing ran, so no row was imaged.
            "row_images": {"status": "unavailable",
                           "reason": "the statement was not run in the preview (its caveats "
                                     "say why), so none of its rows were imaged"}}
