"""The ledger's SQL, written once for both SQLite and PostgreSQL.

Dialect differences are hooks on the subclasses (how to connect, how to open a
write transaction, how placeholders look, how big the store is); the
statements themselves use only what both engines share: ``INSERT … ON
CONFLICT``, ``RETURNING``, partial indexes and conditional ``UPDATE``.

Below this module, and never importing it: the schema and its migrations
(``schema.py``), one observation's rows (``observe.py``) and many at once
(``settles.py``), the statement pieces and row codecs they share
(``statements.py``), and the mixins for reaping, Effect Sets and target bindings.
Engines run the statements through :class:`marque.storage.tx.Tx`.
"""

from __future__ import annotations

import abc
import contextlib
import json
import threading
import time
import uuid
from typing import Any, Self

from marque.errors import (
    AttemptsExhausted,
    BudgetExhausted,
    LedgerCorrupt,
    LedgerExists,
    LedgerMissing,
    PopReplayed,
)
from marque.ledger.base import (
    AttemptRecord,
    Claim,
    ClaimTicket,
    Ledger,
    Observed,
    OutboxEntry,
)
from marque.ledger.bindings import BindingLedger
from marque.ledger.effects import EffectLedger
from marque.ledger.housekeeping import Housekeeping
from marque.ledger.jtis import PendingJtis
from marque.ledger.observe import Reporter, observe_txn
from marque.ledger.schema import MIGRATIONS, LedgerSchema
from marque.ledger.settles import observe_many_txn
from marque.ledger.statements import ATTEMPT_COLUMNS, STARTED_COLUMNS, loads, row_record
from marque.outcome import Status
from marque.storage.migrations import migrate
from marque.storage.tx import Tx

#: Outbox entries acknowledged per statement (four parameters each).
ACK_CHUNK = 128


class SqlLedger(Housekeeping, EffectLedger, BindingLedger, Ledger):
    """The ledger's behaviour over any engine that provides :meth:`transaction`.

    Reaping and stats come from :class:`~marque.ledger.housekeeping.Housekeeping`;
    the Effect Set tables from :class:`~marque.ledger.effects.EffectLedger`.
    """

    def __init__(self) -> None:
        self._jtis = PendingJtis(self._write_jtis)
        # Serialises a replay's "jti unseen?" read with its hold on the jti.
        self._replay_lock = threading.Lock()

    # -- dialect hooks --------------------------------------------------------

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction that commits on success and rolls back on error."""

    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that only reads; engines may serve it without joining writers."""
        return self.transaction()

    def _point_read(self) -> contextlib.AbstractContextManager[Tx]:
        """:meth:`reading`, for a few index lookups on the execution path (a replay check):
        engines may serve it wherever the latest commit is cheapest to read."""
        return self.reading()

    @abc.abstractmethod
    def _has_schema(self) -> bool:
        """Whether the ledger's tables exist."""

    @abc.abstractmethod
    def _size_bytes(self) -> int:
        """The store's size on disk."""

    def _json_array_length(self, column: str) -> str:
        """SQL for the length of a JSON array held in a TEXT column."""
        return f"json_array_length({column})"

    # -- lifecycle ------------------------------------------------------------

    def _initialise(self, pilot_id: str, now: float) -> None:
        """Create the schema and write the incarnation, once."""
        if self._has_schema():
            raise LedgerExists("this ledger already holds an incarnation; refusing to overwrite")
        incarnation = "inc_" + uuid.uuid4().hex
        try:
            with self.transaction() as tx:
                for statement in MIGRATIONS[0]:
                    tx.execute(statement)
                for key, value in (
                    ("schema_version", "1"),
                    ("pilot_id", pilot_id),
                    ("incarnation", incarnation),
                    ("created_at", repr(now)),
                ):
                    tx.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
        except Exception as exc:
            if self._has_schema():  # another init won the race between check and create
                raise LedgerExists("this ledger was initialised concurrently; refusing to "
                                   "overwrite it") from exc
            raise
        self._migrate()
        self._load_identity()

    def _created(self, pilot_id: str) -> Self:
        """This new handle, initialised; closed again if that fails."""
        try:
            self._initialise(pilot_id, time.time())
        except BaseException:
            self.close()
            raise
        return self

    def _opened(self) -> Self:
        """This new handle on an existing ledger; closed again if that fails."""
        try:
            self._open_existing()
        except BaseException:
            self.close()
            raise
        return self

    def _open_existing(self) -> None:
        if not self._has_schema():
            raise LedgerMissing("no ledger here; create one with `marque pilot init`")
        self._migrate()
        self._load_identity()

    def _migrate(self) -> None:
        """Bring an older ledger's schema up to date (forward only), once
        (:func:`marque.storage.migrations.migrate`: an up-to-date ledger costs no write)."""
        migrate(LedgerSchema(self._migration), self.reading, self.transaction)

    def _migration(self, index: int) -> list[str]:
        """The statements of migration ``index`` (see :data:`MIGRATIONS`) on this engine:
        an engine may store the same rows its own way (a hook; the default is the shared
        list)."""
        return MIGRATIONS[index]

    def _load_identity(self) -> None:
        with self.transaction() as tx:
            meta = dict(tx.execute("SELECT key, value FROM meta"))
        missing = [k for k in ("pilot_id", "incarnation", "schema_version") if k not in meta]
        if missing:
            raise LedgerCorrupt(
                f"this ledger has lost its identity ({', '.join(missing)} missing from its meta "
                "table): it cannot vouch for any marque; restore it from a backup or start a "
                "new incarnation with `marque pilot init` in a new home")
        self.pilot_id = meta["pilot_id"]
        self.incarnation = meta["incarnation"]
        self.schema_version = int(meta["schema_version"])

    def rotate_incarnation(self, now: float) -> str:
        incarnation = "inc_" + uuid.uuid4().hex
        with self.transaction() as tx:
            tx.execute("UPDATE meta SET value = ? WHERE key = 'incarnation'", (incarnation,))
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value",
                (f"rotated_from:{self.incarnation}", repr(now)),
            )
        self.incarnation = incarnation
        return incarnation

    def home_binding(self) -> dict[str, str] | None:
        with self.reading() as tx:
            meta = dict(tx.execute(
                "SELECT key, value FROM meta WHERE key IN ('home_id', 'home_path')"))
        if "home_id" not in meta or "home_path" not in meta:
            return None
        return {"home_id": meta["home_id"], "home_path": meta["home_path"]}

    def bind_home(self, home_id: str, home_path: str, *, now: float,
                  moved_from: str | None = None) -> dict[str, str]:
        with self.transaction() as tx:
            if moved_from is None:
                # First binding: whoever binds first wins; the others read the winner.
                for key, value in (("home_id", home_id), ("home_path", home_path)):
                    tx.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                               "ON CONFLICT (key) DO NOTHING", (key, value))
            else:
                # A move is a compare-and-set on the path the mover saw.
                moved = tx.execute(
                    "UPDATE meta SET value = ? WHERE key = 'home_path' AND value = ? AND EXISTS "
                    "(SELECT 1 FROM meta WHERE key = 'home_id' AND value = ?) RETURNING value",
                    (home_path, moved_from, home_id))
                if moved:
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                        "SET value = excluded.value",
                        (f"home_moved_from:{moved_from}", repr(now)),
                    )
        return self.home_binding() or {}

    # -- claims ---------------------------------------------------------------

    def claim(self, ticket: ClaimTicket) -> Claim:
        if ticket.pop_jti is not None and ticket.pop_jti in self._jtis:
            raise PopReplayed("this proof has been used before")
        if not ticket.carried and ticket.executions >= 1:
            alone = self._claim_alone(ticket)
            if alone is not None:
                return alone
        with self.transaction() as tx:
            observe_many_txn(tx, list(ticket.carried), self._reporter())
            fresh = self._claim_steps_txn(tx, ticket)
            if fresh is not None:
                return fresh
            return self._claim_known_txn(tx, ticket)

    def _claim_known_txn(self, tx: Tx, ticket: ClaimTicket) -> Claim:
        """A nonce claimed before: its latest attempt as it stands, or (that attempt was
        ``aborted_not_applied``) the next attempt started, within ``attempts_per_nonce``."""
        key = (ticket.marque_id, ticket.nonce)
        latest = self._latest_txn(tx, *key)
        assert latest is not None, "a claim row always has its latest attempt"
        if latest.status is not Status.ABORTED_NOT_APPLIED:
            return Claim(False, latest)
        advanced = tx.one(
            "UPDATE claims SET attempt = attempt + 1 "
            "WHERE marque_id = ? AND nonce = ? AND attempt = ? AND attempt < ? "
            "RETURNING attempt",
            (*key, latest.attempt, ticket.attempts_per_nonce),
        )
        if advanced is None:
            raise AttemptsExhausted(
                f"nonce {ticket.nonce} used all {ticket.attempts_per_nonce} attempts the "
                "marque allows it, and its last one was aborted_not_applied (nothing "
                "applied); a new nonce is a new execution and spends budget"
            )
        return Claim(True, self._start_attempt_txn(tx, ticket, advanced[0]))

    def _claim_steps_txn(self, tx: Tx, ticket: ClaimTicket) -> Claim | None:
        """The proof's ``jti``, the claim row and the budget, one statement each; the fresh
        claim, or None when the nonce was claimed before (the caller reads it)."""
        if ticket.pop_jti is not None and not self._remember_pop_jti_txn(
            tx, ticket.pop_jti, ticket.pop_forget_after
        ):
            raise PopReplayed("this proof has been used before")
        inserted = tx.one(
            "INSERT INTO claims (marque_id, nonce, attempt, claimed_at) VALUES (?, ?, 1, ?) "
            "ON CONFLICT (marque_id, nonce) DO NOTHING RETURNING attempt",
            (ticket.marque_id, ticket.nonce, ticket.now),
        )
        if inserted is not None:
            if ticket.executions < 1:
                raise BudgetExhausted(f"marque {ticket.marque_id} allows no executions")
            # One statement: the budget row is born from the token already spent
            # once, or an existing row is decremented only while above zero. A
            # reaped marque's budget is never born again (its record stays).
            spent = tx.one(
                "INSERT INTO budgets (marque_id, target, executions_left, max_rows, "
                "attempts_per_nonce, expires_at) SELECT ?, ?, ?, ?, ?, ? "
                "WHERE NOT EXISTS (SELECT 1 FROM reaped_marques WHERE marque_id = ?) "
                "ON CONFLICT (marque_id) DO UPDATE "
                "SET executions_left = budgets.executions_left - 1 "
                "WHERE budgets.executions_left > 0 RETURNING executions_left",
                (
                    ticket.marque_id,
                    ticket.target,
                    ticket.executions - 1,
                    ticket.max_rows,
                    ticket.attempts_per_nonce,
                    ticket.expires_at,
                    ticket.marque_id,
                ),
            )
            if spent is None:
                # Raising rolls the claim back with it: no nonce is claimed.
                self._refuse_reaped_txn(tx, ticket.marque_id)
                raise BudgetExhausted(
                    f"marque {ticket.marque_id} has no executions left in its budget"
                )
            return Claim(True, self._start_attempt_txn(tx, ticket, 1))
        return None

    def _claim_alone(self, ticket: ClaimTicket) -> Claim | None:
        """The whole claim as one statement that commits by itself, where the engine can;
        None: take the transaction (the statement wrote nothing, or it cannot say)."""
        return None

    def _start_attempt_txn(self, tx: Tx, ticket: ClaimTicket, attempt: int) -> AttemptRecord:
        tx.execute(
            f"INSERT INTO attempts ({STARTED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            self._started_values(ticket, attempt),
        )
        return self._attempt_record(ticket, attempt)

    def _started_values(self, ticket: ClaimTicket, attempt: int) -> tuple[Any, ...]:
        """The values of :data:`STARTED_COLUMNS` for a new attempt of ``ticket``."""
        return (ticket.marque_id, ticket.nonce, attempt, Status.IN_PROGRESS.value,
                Status.IN_PROGRESS.rank, self.incarnation, ticket.owner_process,
                ticket.now + ticket.lease_seconds, ticket.now)

    def _attempt_record(self, ticket: ClaimTicket, attempt: int) -> AttemptRecord:
        """The attempt :meth:`_start_attempt_txn` (or a one-statement claim) just started."""
        return AttemptRecord(
            marque_id=ticket.marque_id,
            nonce=ticket.nonce,
            attempt=attempt,
            status=Status.IN_PROGRESS,
            rows_affected=None,
            error=None,
            result=None,
            owner_incarnation=self.incarnation,
            owner_process=ticket.owner_process,
            lease_expires_at=ticket.now + ticket.lease_seconds,
            started_at=ticket.now,
            settled_at=None,
        )

    def _latest_txn(self, tx: Tx, marque_id: str, nonce: str) -> AttemptRecord | None:
        row = tx.one(
            f"SELECT {ATTEMPT_COLUMNS} FROM claims c JOIN attempts a "
            "ON a.marque_id = c.marque_id AND a.nonce = c.nonce AND a.attempt = c.attempt "
            "WHERE c.marque_id = ? AND c.nonce = ?",
            (marque_id, nonce),
        )
        return row_record(row) if row else None

    def replay(
        self, marque_id: str, nonce: str, pop_jti: str, pop_forget_after: float
    ) -> AttemptRecord | None:
        with self._replay_lock:
            if pop_jti in self._jtis:
                raise PopReplayed("this proof has been used before")
            with self._point_read() as tx:
                latest = self._latest_txn(tx, marque_id, nonce)
                if latest is None or latest.status is not Status.APPLIED:
                    return None
                seen = tx.one("SELECT 1 FROM pop_jtis WHERE jti = ?", (pop_jti,))
            if seen is not None:
                raise PopReplayed("this proof has been used before")
            self._jtis.add(pop_jti, pop_forget_after)
        return latest

    def hold_jti(self, pop_jti: str, pop_forget_after: float) -> None:
        with self._replay_lock:
            if pop_jti in self._jtis:
                raise PopReplayed("this proof has been used before")
            with self._point_read() as tx:
                seen = tx.one("SELECT 1 FROM pop_jtis WHERE jti = ?", (pop_jti,))
            if seen is not None:
                raise PopReplayed("this proof has been used before")
            self._jtis.add(pop_jti, pop_forget_after)

    def _write_jtis(self, batch: list[tuple[str, float]]) -> None:
        with self.transaction() as tx:
            for jti, forget_after in batch:
                self._remember_pop_jti_txn(tx, jti, forget_after)

    # -- settlement -------------------------------------------------------------

    def observe(
        self,
        marque_id: str,
        nonce: str,
        attempt: int,
        status: Status,
        *,
        now: float,
        cause: str,
        rows_affected: int | None = None,
        error: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
        events: list[dict[str, Any]] | None = None,
    ) -> AttemptRecord:
        with self.transaction() as tx:
            return observe_txn(tx, Observed(
                marque_id, nonce, attempt, status, now=now, cause=cause,
                rows_affected=rows_affected, error=error, result=result, events=events),
                self._reporter())

    def observe_all(self, observed: list[Observed]) -> list[AttemptRecord]:
        with self.transaction() as tx:
            return observe_many_txn(tx, observed, self._reporter())

    def _reporter(self) -> Reporter:
        """Who this ledger's outcome reports name."""
        return Reporter(self.pilot_id, self.incarnation)

    def outcome(self, marque_id: str, nonce: str) -> AttemptRecord | None:
        with self.reading() as tx:
            return self._latest_txn(tx, marque_id, nonce)

    def attempts(self, marque_id: str, nonce: str) -> list[AttemptRecord]:
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.marque_id = ? AND a.nonce = ? "
                "ORDER BY a.attempt",
                (marque_id, nonce),
            )
        return [row_record(r) for r in rows]

    def nonces(self, marque_id: str) -> list[str]:
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT DISTINCT nonce FROM attempts WHERE marque_id = ? ORDER BY nonce",
                (marque_id,),
            )
        return [r[0] for r in rows]

    def observations(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT attempt, status, cause, detail, observed_at FROM observations "
                "WHERE marque_id = ? AND nonce = ? ORDER BY observed_at, id",
                (marque_id, nonce),
            )
        return [
            {"attempt": r[0], "status": r[1], "cause": r[2], "detail": loads(r[3]), "at": r[4]}
            for r in rows
        ]

    def events(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT body FROM events WHERE marque_id = ? AND nonce = ? ORDER BY seq",
                (marque_id, nonce),
            )
        return [event for r in rows for event in json.loads(r[0])]

    def unsettled(self, status: Status) -> list[AttemptRecord]:
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.status_rank = ? "
                "ORDER BY a.started_at",
                (status.rank,),
            )
        return [row_record(r) for r in rows]

    def budget(self, marque_id: str) -> dict[str, Any] | None:
        with self.reading() as tx:
            row = tx.one(
                "SELECT executions_left, max_rows, attempts_per_nonce, expires_at, target "
                "FROM budgets WHERE marque_id = ?",
                (marque_id,),
            )
        if row is None:
            return None
        return {
            "executions_left": row[0],
            "max_rows": row[1],
            "attempts_per_nonce": row[2],
            "expires_at": row[3],
            "target": row[4],
        }

    # -- proofs -----------------------------------------------------------------

    def remember_pop_jti(self, jti: str, forget_after: float) -> bool:
        with self.transaction() as tx:
            return self._remember_pop_jti_txn(tx, jti, forget_after)

    def _remember_pop_jti_txn(self, tx: Tx, jti: str, forget_after: float) -> bool:
        row = tx.one(
            "INSERT INTO pop_jtis (jti, forget_after) VALUES (?, ?) "
            "ON CONFLICT (jti) DO NOTHING RETURNING jti",
            (jti, forget_after),
        )
        return row is not None

    # -- outbox -----------------------------------------------------------------

    def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT marque_id, nonce, attempt, status, payload, tries FROM outbox "
                "WHERE acked_at IS NULL ORDER BY queued_at LIMIT ?",
                (limit,),
            )
        return [OutboxEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

    def outbox_ack_all(self, entries: list[OutboxEntry], now: float) -> None:
        if not entries:
            return
        with self.transaction() as tx:
            # One statement per chunk, not one per entry: on PostgreSQL each statement is
            # a round trip. Each row is still acknowledged only while it carries the
            # status that was delivered (a report re-queued since stays pending).
            for start in range(0, len(entries), ACK_CHUNK):
                chunk = entries[start:start + ACK_CHUNK]
                # Padded to a power of two (the last entry repeated, which acknowledges
                # nothing twice): a few statement texts, each prepared once, not one per size.
                chunk += chunk[-1:] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
                # Joined on the primary key (a row-value IN would scan the unacked rows).
                tx.execute(
                    "WITH acked (marque_id, nonce, attempt, status) AS (VALUES "
                    + ", ".join(["(?, ?, ?, ?)"] * len(chunk)) + ") "
                    "UPDATE outbox SET acked_at = ? FROM acked "
                    "WHERE outbox.marque_id = acked.marque_id AND outbox.nonce = acked.nonce "
                    "AND outbox.attempt = acked.attempt AND outbox.status = acked.status "
                    "AND outbox.acked_at IS NULL",
                    (*(value for entry in chunk for value in
                       (entry.marque_id, entry.nonce, entry.attempt, entry.status)), now),
                )

    def outbox_failed(self, entry: OutboxEntry) -> None:
        with self.transaction() as tx:
            tx.execute(
                "UPDATE outbox SET tries = tries + 1 WHERE marque_id = ? AND nonce = ? "
                "AND attempt = ?",
                (entry.marque_id, entry.nonce, entry.attempt),
            )
