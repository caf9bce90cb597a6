"""The ledger's roles: the few interfaces its callers use, and the records they pass.

:class:`marque.ledger.base.Ledger` is the composition of these roles, one per kind of
caller: claims (the execution path), outcomes (recording, reconciliation, evidence),
the report outbox, the home a ledger is bound to, target bindings, Effect Sets, and
housekeeping. A part that needs one concern can be typed against its role alone, so
what it may do to the ledger reads from its signature. The SQLite and PostgreSQL
ledgers implement all of them (``ledger/sql.py``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from marque.ledger.bindings import PinnedAttempt, TargetBinding
from marque.outcome import Status


@dataclass(frozen=True)
class ClaimTicket:
    """Everything a claim needs, taken from a verified marque and the Pilot."""

    marque_id: str
    nonce: str
    target: str
    executions: int
    max_rows: int
    attempts_per_nonce: int
    expires_at: float
    owner_process: str
    lease_seconds: float
    now: float
    #: The proof's jti, recorded in the claim transaction (a replay raises PopReplayed).
    pop_jti: str | None = None
    pop_forget_after: float = 0.0
    #: Outcomes answered earlier and not yet recorded (``settle_write_behind``), written
    #: in this claim's transaction: they share its commit. If the claim fails, so do they.
    carried: tuple[Observed, ...] = ()
    #: A nonce found ``applied`` may have this proof's ``jti`` remembered write-behind,
    #: as :meth:`ClaimsRole.replay` does (``replay_jti_write_behind``). Heeded only by a ledger
    #: whose :attr:`ClaimsRole.claim_answers_replays` is true; elsewhere the jti is recorded.
    replay_behind: bool = False


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one nonce, as the ledger holds it."""

    marque_id: str
    nonce: str
    attempt: int
    status: Status
    rows_affected: int | None
    error: dict[str, Any] | None
    result: dict[str, Any] | None
    owner_incarnation: str
    owner_process: str
    lease_expires_at: float
    started_at: float
    settled_at: float | None


@dataclass(frozen=True)
class Observed:
    """One observation of one attempt, for :meth:`OutcomesRole.observe_all`."""

    marque_id: str
    nonce: str
    attempt: int
    status: Status
    now: float
    cause: str
    rows_affected: int | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    events: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: a fresh attempt to run, or what is recorded."""

    fresh: bool
    record: AttemptRecord


@dataclass(frozen=True)
class ReapedRecord:
    """What the ledger keeps of a nonce whose entries were reaped.

    Reaping deletes a marque's entries once it expired (past the clock-skew
    allowance) and every outcome under it was settled and reported to the
    logbook; this small record is what stays, so a later question about the
    nonce is answered "reaped", not "never claimed".
    """

    marque_id: str
    nonce: str
    target: str
    #: The latest attempt and how it settled (``applied`` or ``aborted_not_applied``).
    attempt: int
    status: Status
    rows_affected: int | None
    expires_at: float
    reaped_at: float


@dataclass(frozen=True)
class OutboxEntry:
    """An outcome report waiting for the Harbourmaster's acknowledgement."""

    marque_id: str
    nonce: str
    attempt: int
    status: str
    payload: dict[str, Any]
    tries: int


@dataclass(frozen=True)
class Durability:
    """How durable a ledger's commits are, as its engine reports it (DESIGN §5).

    ``settings`` are the values read back from the engine on the ledger's own
    connections — SQLite's ``journal_mode`` and ``synchronous``, PostgreSQL's
    ``fsync`` and ``synchronous_commit`` — and ``problems`` one sentence per
    setting that falls short, naming what it must be. A claim that returned
    must survive a power cut: with any problem, it may not.
    """

    engine: str
    settings: dict[str, str]
    problems: tuple[str, ...] = ()

    @property
    def durable(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """``{engine, settings, problems, durable}``, for messages and ``detail``."""
        return {"engine": self.engine, "settings": dict(self.settings),
                "problems": list(self.problems), "durable": self.durable}


class ClaimsRole(abc.ABC):
    """Claiming a nonce and checking its proof (DESIGN §3 step 2): what
    :mod:`marque.pilot.execution` does before anything reaches a target, and the proof
    ``jti`` checks of previews and evidence queries."""

    @abc.abstractmethod
    def claim(self, ticket: ClaimTicket) -> Claim:
        """Claim ``(marque_id, nonce)`` in one transaction, or return what is recorded.

        The ticket's proof ``jti`` is recorded first; one seen before raises
        ``PopReplayed`` and records nothing. A new nonce decrements the
        marque's budget (creating the budget row on first sight) and starts
        attempt 1; no budget left raises
        ``BudgetExhausted`` and records nothing. A nonce whose latest attempt
        is ``aborted_not_applied`` starts the next attempt without touching
        the budget, or raises ``AttemptsExhausted``. Any other recorded nonce
        is returned as it stands (``fresh=False``).
        """

    @abc.abstractmethod
    def replay(
        self, marque_id: str, nonce: str, pop_jti: str, pop_forget_after: float
    ) -> AttemptRecord | None:
        """The nonce's latest attempt if it is ``applied``, without a durable write; else None.

        ``applied`` is absorbing, so a proof for that nonce can only read it
        again: its ``jti`` is checked unseen (``PopReplayed`` otherwise) and
        remembered write-behind (see ``ledger/jtis.py``). None means the call
        must go through :meth:`claim`, which records the jti before answering.
        """

    #: Whether outcomes held behind their answer should ride on the next claim's
    #: transaction (``ClaimTicket.carried``): yes where a statement is cheap and a commit
    #: dear (SQLite in process); no where each statement is a round trip that would
    #: lengthen one caller's claim by four per carried outcome (PostgreSQL).
    carries_settles: bool = False

    #: Whether :meth:`claim` answers a replay of an ``applied`` nonce as :meth:`replay`
    #: would (its jti checked unseen and remembered write-behind, nothing durable written)
    #: when the ticket allows it (``ClaimTicket.replay_behind``), within the claim's one
    #: round trip: a caller may then skip :meth:`replay`, the read a fresh nonce pays to
    #: find nothing. Yes where that read is a round trip of its own (PostgreSQL); no where
    #: a claim joins the writers' group commit (SQLite), which a replay must not wait for.
    claim_answers_replays: bool = False

    @abc.abstractmethod
    def hold_jti(self, pop_jti: str, pop_forget_after: float) -> None:
        """Check a proof's ``jti`` unseen (``PopReplayed`` otherwise) and remember it
        write-behind, as :meth:`replay` does: for a proof that can only read an
        outcome this process already answered."""

    @abc.abstractmethod
    def remember_pop_jti(self, jti: str, forget_after: float) -> bool:
        """Record a proof's ``jti``; False if it was already seen (a replay)."""


class OutcomesRole(abc.ABC):
    """The outcome lattice (DESIGN §4): observations merged into attempts, and
    what is recorded read back — by recording, settle-behind, reconciliation, continuity,
    evidence and an outcome query."""

    @abc.abstractmethod
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
        """Merge an observation into an attempt and return the attempt as it now stands.

        The observation is always logged; it changes the attempt only if its
        status ranks above the recorded one (compare-and-set, never a
        read-modify-write). ``rows_affected``/``result`` land in the same write
        that settles. ``events`` are appended to the nonce's event log in the
        same transaction, and an outcome report is queued in the outbox when
        the status changed.
        """

    @abc.abstractmethod
    def observe_all(self, observed: list[Observed]) -> list[AttemptRecord]:
        """:meth:`observe` for each item, all in one transaction (one durable commit).

        For observations recorded behind their answer (``settle_write_behind``):
        many settles share one commit. Returns the attempts in the items' order.
        """

    @abc.abstractmethod
    def outcome(self, marque_id: str, nonce: str) -> AttemptRecord | None:
        """The nonce's latest attempt, or None if the nonce was never claimed."""

    @abc.abstractmethod
    def attempts(self, marque_id: str, nonce: str) -> list[AttemptRecord]:
        """Every attempt of a nonce, oldest first."""

    @abc.abstractmethod
    def nonces(self, marque_id: str) -> list[str]:
        """Every nonce of the marque that has an attempt in the ledger, in order."""

    @abc.abstractmethod
    def observations(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        """Every observation ever merged into the nonce's attempts, oldest first."""

    @abc.abstractmethod
    def events(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        """The nonce's stored event log, in order."""

    @abc.abstractmethod
    def unsettled(self, status: Status) -> list[AttemptRecord]:
        """Attempts currently ``in_progress`` or ``indeterminate`` (as asked)."""

    @abc.abstractmethod
    def budget(self, marque_id: str) -> dict[str, Any] | None:
        """The marque's budget row (executions_left, max_rows, attempts, expiry, target)."""

    @abc.abstractmethod
    def reaped(self, marque_id: str, nonce: str) -> ReapedRecord | None:
        """What was kept of a reaped nonce, or None if no such nonce was reaped here."""


class OutboxRole(abc.ABC):
    """Outcome reports waiting for acknowledgement (DESIGN §3 step 6): what
    :mod:`marque.pilot.reporting` delivers."""

    @abc.abstractmethod
    def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        """Outcome reports not yet acknowledged."""

    def outbox_ack(self, entry: OutboxEntry, now: float) -> None:
        """Mark a report acknowledged (only if it still carries the same status)."""
        self.outbox_ack_all([entry], now)

    @abc.abstractmethod
    def outbox_ack_all(self, entries: list[OutboxEntry], now: float) -> None:
        """Mark reports acknowledged, in one transaction (each only if its status still holds)."""

    @abc.abstractmethod
    def outbox_failed(self, entry: OutboxEntry) -> None:
        """Count a failed delivery try."""


class HomeRole(abc.ABC):
    """Whose ledger this is and whether a Pilot may run on it: its Pilot id and
    incarnation, the home it is bound to, and how durable its commits are (DESIGN §5) —
    read by :mod:`marque.pilot.home_binding` and ``pilot init`` before anything runs."""

    #: The Pilot this ledger belongs to, fixed when it was created.
    pilot_id: str
    #: Which life of the ledger this is: a continuity rotation replaces it.
    incarnation: str

    @abc.abstractmethod
    def rotate_incarnation(self, now: float) -> str:
        """Replace the incarnation (the ledger is known to have gone back in time)."""

    @abc.abstractmethod
    def home_binding(self) -> dict[str, str] | None:
        """The home this ledger belongs to, ``{home_id, home_path}``; None if never bound."""

    @abc.abstractmethod
    def bind_home(self, home_id: str, home_path: str, *, now: float,
                  moved_from: str | None = None) -> dict[str, str]:
        """Bind the ledger to a home and return the binding as it now stands.

        Without ``moved_from``, only an unbound ledger is bound (the first
        binder wins). With it, the binding moves to ``home_path`` only if it
        still names ``home_id`` at ``moved_from`` (compare-and-set), and the
        move is recorded in the ledger's meta rows.
        """

    @abc.abstractmethod
    def durability(self) -> Durability:
        """What the engine says about the durability of this ledger's commits (read, never set)."""


class BindingsRole(abc.ABC):
    """Which database each target name stands for (:mod:`marque.ledger.bindings`):
    kept by the continuity check and ``pilot target``, read by everything that addresses a
    target."""

    @abc.abstractmethod
    def target_binding(self, target: str) -> TargetBinding | None:
        """The identity a target name stands for, or None if it was never bound."""

    @abc.abstractmethod
    def target_bindings(self) -> list[TargetBinding]:
        """Every target name's binding, by name."""

    @abc.abstractmethod
    def bind_target(self, target: str, target_id: str, location: str, *,
                    now: float) -> TargetBinding:
        """Bind an unbound name (the first binder wins); the binding as it stands."""

    @abc.abstractmethod
    def rebind_target(self, target: str, *, seen_id: str, target_id: str, location: str,
                      now: float, pin_unsettled: bool) -> tuple[TargetBinding,
                                                                 list[PinnedAttempt]]:
        """Compare-and-set a name's binding from ``seen_id``, pinning (or refused by) its
        unsettled attempts."""

    @abc.abstractmethod
    def pinned_attempt(self, marque_id: str, nonce: str) -> PinnedAttempt | None:
        """The identity a rebinding bound a nonce's unsettled attempt to, or None."""


class EffectsRole(abc.ABC):
    """Effect Sets (DESIGN §7; :mod:`marque.ledger.effects`): previews, the
    dispatch rows, the Run and the receipts of :mod:`marque.pilot.effects` and
    :mod:`marque.pilot.effect_run`."""

    @abc.abstractmethod
    def store_effect_preview(self, effect_preview_cid: str, target: str,
                             body: dict[str, Any], now: float) -> dict[str, Any]:
        """Keep a preview under its CID; returns the stored one (the first of that CID)."""

    @abc.abstractmethod
    def effect_preview(self, effect_preview_cid: str) -> dict[str, Any] | None:
        """The stored preview of that CID, or None."""

    @abc.abstractmethod
    def effect_begin(self, marque_id: str, nonce: str, effect_preview_cid: str,
                     authorization: dict[str, Any], rows: list[tuple[int, int, Any]],
                     now: float) -> bool:
        """Reserve an execution's rows as ``prepared``; False if reserved before."""

    @abc.abstractmethod
    def effect_run(self, marque_id: str, nonce: str) -> dict[str, Any] | None:
        """``{effect_preview_cid, authorization}`` of an Effect Set execution, or None."""

    @abc.abstractmethod
    def effect_rows(self, marque_id: str, nonce: str) -> list[Any]:
        """Every dispatch row of an execution (``DispatchRow``), in dispatch order."""

    @abc.abstractmethod
    def effect_move(self, marque_id: str, nonce: str, before: Any, after: Any, *, now: float,
                    outcome: dict[str, Any] | None = None,
                    outcome_receipt: dict[str, Any] | None = None) -> bool:
        """Compare-and-set one dispatch row from ``before`` to ``after``; False if moved."""

    @abc.abstractmethod
    def effect_run_start(self, marque_id: str, nonce: str, record: dict[str, Any],
                         bound: dict[str, str], now: float) -> dict[str, Any]:
        """Keep an execution's first Run record unless it has one; the stored ``{record,
        bound}``."""

    @abc.abstractmethod
    def effect_run_state(self, marque_id: str, nonce: str) -> dict[str, Any] | None:
        """``{record, bound}`` of an execution's Run, or None."""

    @abc.abstractmethod
    def effect_run_advance(self, marque_id: str, nonce: str, before: dict[str, Any],
                           after: dict[str, Any], now: float) -> bool:
        """Compare-and-set the Run's record from ``before`` to ``after``; False if moved."""

    @abc.abstractmethod
    def effect_attach_summary(self, marque_id: str, nonce: str, attempt: int,
                              result: dict[str, Any], now: float) -> bool:
        """Keep a still-indeterminate attempt's sealed summary once and re-queue its report."""

    @abc.abstractmethod
    def effect_put_receipt(self, marque_id: str, nonce: str, kind: str, subject: str,
                           body: dict[str, Any], now: float) -> bool:
        """Keep an immutable receipt; False for a redelivery, ``Conflict`` for another body."""

    @abc.abstractmethod
    def effect_receipts(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        """Every receipt of an execution, ``{kind, subject, body}``, oldest first."""


class HousekeepingRole(abc.ABC):
    """The operator's upkeep: reaping what expired, the figures ``ledger
    stats`` and ``/v1/health`` show, and releasing the connections."""

    @abc.abstractmethod
    def reap(self, now: float, *, skew_seconds: float = 0.0) -> dict[str, int]:
        """Delete settled, reported entries of expired marques; counts what went.

        A marque is expired once ``expires_at + skew_seconds < now``: until
        then a Pilot allowing that clock skew could still accept it. Each
        reaped nonce leaves a :class:`ReapedRecord` (see :meth:`OutcomesRole.reaped`).
        """

    @abc.abstractmethod
    def stats(self, now: float, *, skew_seconds: float = 0.0) -> dict[str, Any]:
        """Size and health: live marques, entries, unsettled and unreported outcomes.

        "Live" and "reapable" use the same rule as :meth:`reap` (expiry plus
        ``skew_seconds``), so what stats calls reapable is what reap deletes.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""
