"""The Pilot: DESIGN §3 end to end — verify, claim, fenced run, record, report.

Nonce first, statement second (seed 000): the claim is durable in the ledger
before the target is touched, so a crash anywhere after it leaves the nonce
claimed and the budget spent, never a second target_attempt. Whatever cannot be known is
recorded as ``indeterminate`` and settled later by evidence (reconciliation),
never by a guess.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from marque.change import Change, EffectSetChange
from marque.crash import crash_point
from marque.errors import (
    Indeterminate,
    InvalidInput,
    LedgerUnavailable,
    MarqueError,
    NonceReaped,
    NotApplied,
    NotFound,
)
from marque.ledger import AttemptRecord, Claim, ClaimTicket, Ledger, Observed, OutboxEntry
from marque.logbook.embedded import Logbook
from marque.outcome import Outcome, Status
from marque.pilot import reconciliation
from marque.pilot.config import Settings
from marque.pilot.continuity import ensure_continuity, refuse_if_replaced, unreadable
from marque.pilot.processes import ProcessRegistry
from marque.pilot.settle_behind import SettleBehind
from marque.pilot.stream import (
    AttemptStream,
    EventSink,
    Inflight,
    Observation,
    recorded_event,
    send_event,
)
from marque.target import StampConflict, Target, TargetAttempt
from marque.timefmt import iso_time
from marque.token import (
    Marque,
    TrustedKeys,
    check_marque,
    jti_forget_after,
    read_marque,
    verify_proof,
)

MAX_NONCE_BYTES = 256
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: Marques whose signature this process has verified, by token (oldest evicted first).
READ_CACHE_SIZE = 4096
#: Outcome reports delivered to the logbook per transaction.
REPORT_BATCH = 500
#: Pauses between the tries of recording what the target said, when the ledger is
#: unavailable right after it (DESIGN §9): three tries in about half a second, then the
#: caller is told the truth with ``recorded: false``.
SETTLE_BACKOFF_SECONDS = (0.1, 0.4)


def check_nonce(nonce: str) -> str:
    """A nonce is 1..256 UTF-8 bytes of printable text."""
    if not isinstance(nonce, str) or not nonce:
        raise InvalidInput("nonce must be a non-empty string")
    if len(nonce.encode("utf-8", "surrogatepass")) > MAX_NONCE_BYTES:
        raise InvalidInput(f"nonce is longer than {MAX_NONCE_BYTES} UTF-8 bytes")
    if _CONTROL.search(nonce):
        raise InvalidInput("nonce contains control characters")
    return nonce


class ReportSink(Protocol):
    """Somewhere outcome reports go besides the local logbook (a Harbourmaster)."""

    def deliver(self, entries: list[OutboxEntry]) -> None:
        """Take the reports (outbox payloads); return only once they are acknowledged."""


@dataclass
class PilotOptions(Settings):
    """How strict and how patient a Pilot is: its :class:`Settings` (the one definition,
    read from ``pilot.json``), plus how this process runs it."""

    #: Report each outcome before ``execute`` returns (CLI); else a background
    #: reporter delivers the outbox off the execution path (long-running Pilots).
    report_inline: bool = True


class Pilot:
    """Executes marques against its targets, through its ledger."""

    def __init__(
        self,
        ledger: Ledger,
        targets: dict[str, Target],
        trusted: TrustedKeys,
        *,
        options: PilotOptions | None = None,
        processes: ProcessRegistry | None = None,
        logbook: Logbook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.targets = targets
        self.trusted = trusted
        self.options = options or PilotOptions()
        self.processes = processes or ProcessRegistry(None)
        self.logbook = logbook
        #: Where reports go besides the logbook; an outbox entry is acknowledged only once
        #: every sink took it (see :mod:`marque.pilot.harbour_link`).
        self.report_sinks: list[ReportSink] = []
        self.clock = clock
        self._inflight: dict[tuple[str, str], Inflight] = {}
        self._read_cache: dict[str, Marque] = {}
        #: Set when the outbox has something new (for a background reporter).
        self.report_wanted = threading.Event()
        self._workers: list[Any] = []
        self._inflight_lock = threading.Lock()
        #: Observations the ledger could not record, by attempt, with their events.
        self._unrecorded: dict[tuple[str, str, int], tuple[Observation, list[dict[str, Any]]]] = {}
        #: Targets whose stamps the continuity check could not read yet (DESIGN §5), and why.
        self.continuity_unchecked: set[str] = set()
        self.continuity_errors: dict[str, MarqueError] = {}
        self.continuity_lock = threading.Lock()
        #: The identity each target name stands for in the ledger (ledger/bindings.py), and
        #: the names found pointing at another database (continuity.replaced refuses them).
        self.target_ids: dict[str, str] = {
            binding.target: binding.target_id for binding in ledger.target_bindings()}
        self.targets_replaced: dict[str, dict[str, Any]] = {}
        self.replaced_checked_at: dict[str, float] = {}
        #: Applied writes answered before their outcome is recorded (long-running Pilots
        #: with ``settle_write_behind``; see :mod:`marque.pilot.settle_behind`).
        self.settler: SettleBehind | None = None

    @property
    def pilot_id(self) -> str:
        return self.ledger.pilot_id

    @property
    def incarnation(self) -> str:
        return self.ledger.incarnation

    # -- the execution path -----------------------------------------------------

    def verify(self, token: str, proof: str | None, nonce: str) -> tuple[Marque, str]:
        """Step 1: the marque and its proof of possession; returns the marque and proof jti.

        The signature check of a marque depends only on the token, so it is
        done once per process and cached by token; the window, Pilot,
        incarnation and target are checked on every call, and so is the proof.
        The proof's ``jti`` is recorded by the claim, in the same transaction
        (or, for a replay of an applied nonce, just behind the answer:
        ``ledger/jtis.py``). Refusals claim nothing.
        """
        now = self.clock()
        check_nonce(nonce)
        marque = self._read_cache.get(token)
        if marque is None:
            marque = read_marque(token, self.trusted)
            with self._inflight_lock:
                if len(self._read_cache) >= READ_CACHE_SIZE:
                    self._read_cache.pop(next(iter(self._read_cache)))
                self._read_cache[token] = marque
        self._check(marque, now)
        if marque.target in self.continuity_unchecked:
            ensure_continuity(self, marque.target)
            self._check(marque, now)  # a rotation just now refuses it
        if self.targets_replaced and marque.target in self.targets_replaced:
            refuse_if_replaced(self, marque.target)
            self._check(marque, now)  # a rotation just now refuses it
        jti = verify_proof(
            proof,
            marque,
            nonce=nonce,
            pilot_id=self.pilot_id,
            remember_jti=None,
            now=now,
            window_seconds=self.options.pop_window_seconds,
        )
        return marque, jti

    def _check(self, marque: Marque, now: float) -> None:
        check_marque(marque, pilot_id=self.pilot_id, incarnation=self.incarnation,
                     targets=self.targets.keys(), now=now,
                     skew_seconds=self.options.skew_seconds)

    def execute(
        self, token: str, proof: str | None, nonce: str, on_event: EventSink | None = None
    ) -> Outcome:
        """Run a marque once for ``nonce``; a repeat returns the recorded outcome.

        Refusals raise their typed error. Every other result — applied, not
        applied, indeterminate, in progress — is an :class:`Outcome`.
        """
        marque, jti = self.verify(token, proof, nonce)
        crash_point("after_verify")
        key = (marque.marque_id, nonce)
        with self._inflight_lock:
            running = self._inflight.get(key)
            if running is None:
                mine = self._inflight[key] = Inflight()
        if running is not None:
            # Same nonce, same process: follow the one execution, never start another.
            running.follow(on_event)
            running.done.wait()
            if running.outcome is None:
                # The first caller was refused (budget, attempts) or failed: so are we.
                raise running.refusal or Indeterminate(
                    "the execution this call followed ended without an outcome")
            return _replayed(running.outcome)
        try:
            outcome = self._execute_claimed(marque, nonce, jti, mine, on_event)
            mine.outcome = outcome
            return outcome
        except MarqueError as exc:
            mine.refusal = exc
            raise
        finally:
            mine.done.set()
            with self._inflight_lock:
                del self._inflight[key]

    def _execute_claimed(
        self, marque: Marque, nonce: str, jti: str, mine: Inflight, on_event: EventSink | None
    ) -> Outcome:
        now = self.clock()
        forget_after = jti_forget_after(now, self.options.pop_window_seconds)
        if self.settler is not None and (
                held := self.settler.held(marque.marque_id, nonce)) is not None:
            if self.options.replay_jti_write_behind:
                # Answered applied already, its settle just behind: a proof for it can
                # only read that outcome again, as for any replay of an applied nonce.
                self.ledger.hold_jti(jti, forget_after)
                return self._outcome(held, replayed=True, recorded=False)
            self.settler.flush()  # every replay records its jti: let the claim see it
        # A ledger whose claim answers an applied replay itself (PostgreSQL: in the claim's
        # one round trip) needs no read first; an Effect Set's admit comes before its claim.
        if self.options.replay_jti_write_behind and not (
                self.ledger.claim_answers_replays and isinstance(marque.change, Change)):
            # An applied nonce is absorbing: answer its replay from a read, no durable write.
            settled = self.ledger.replay(marque.marque_id, nonce, jti, forget_after)
            if settled is not None:
                return self._outcome(settled, replayed=True)
        if isinstance(marque.change, EffectSetChange):
            from marque.pilot.effects import admit

            admit(self, marque)  # before the claim: a refusal here claims nothing
        claim = self._claim(marque, nonce, jti, now, forget_after)
        if not claim.fresh:
            return self._outcome(self._settle_known(claim.record), replayed=True)

        attempt = AttemptStream(self, marque.marque_id, nonce, claim.record.attempt, mine,
                                 on_event)
        attempt.emit("claimed", owner_process=self.processes.process_id,
                     lease_expires_at=claim.record.lease_expires_at,
                     **self._skew_used(marque, now))
        crash_point("after_claim")
        unchecked = unreadable(self, marque.target)
        if unchecked is not None:  # nothing is sent to a target whose stamps are unread
            attempt.emit("rolled_back", error=unchecked.to_dict())
            observation = Observation(self._target_attempt(marque, nonce, claim.record.attempt),
                                      Status.ABORTED_NOT_APPLIED, error=unchecked.to_dict())
        elif isinstance(marque.change, EffectSetChange):
            from marque.pilot.effects import apply_claimed

            observation = apply_claimed(self, marque, nonce, claim.record, attempt)
        else:
            target_attempt = self._target_attempt(marque, nonce, claim.record.attempt)
            observation = self._observe_target(target_attempt, claim.record, attempt)
        if self.settler is not None and self.settler.takes(observation):
            # The stamp committed with the write is its durable record until the settle lands.
            attempt.emit("settle_behind", status=Status.APPLIED.value)
            self.settler.hold(observation, attempt.events, claim.record)
            target_attempt = observation.target_attempt
            return Outcome(marque_id=target_attempt.marque_id, nonce=target_attempt.nonce,
                           status=Status.APPLIED.value, attempt=target_attempt.number,
                           rows_affected=observation.rows_affected, pilot_id=self.pilot_id,
                           incarnation=self.incarnation, replayed=False, error=None,
                           result=None, recorded=False)
        recorded = self._record_observation(observation, attempt)
        if recorded is None:  # the ledger is away: say what is known, recorded: false
            return self._unrecorded_outcome(observation)
        crash_point("after_outcome_recorded")
        record = recorded
        if record.status is Status.INDETERMINATE:
            # A lost COMMIT response goes to reconciliation at once.
            record = reconciliation.reconcile(self, record, "commit_unknown",
                                     (observation.target_attempt, self.targets[marque.target]))
        if self.options.report_inline:
            if self.report():
                attempt.emit("reported")
        else:
            self.report_wanted.set()
        return self._outcome(record, replayed=False)

    def _skew_used(self, marque: Marque, now: float) -> dict[str, Any]:
        """Fields for the ``claimed`` event when the marque was accepted only thanks to the
        clock-skew allowance (after its ``exp`` or before its ``nbf``): the window is visible."""
        if now > marque.expires_at:
            return {"marque_expired_at": marque.expires_at,
                    "skew_seconds": self.options.skew_seconds}
        if now < marque.not_before:
            return {"marque_not_before": marque.not_before,
                    "skew_seconds": self.options.skew_seconds}
        return {}

    def _claim(
        self, marque: Marque, nonce: str, jti: str, now: float, forget_after: float
    ) -> Claim:
        """Step 2: claim the nonce (or learn what is recorded) in one ledger transaction."""
        # The lease must outlive the longest the target may legitimately take.
        lease = self._statement_timeout_ms(marque) / 1000 + self.options.lease_grace_seconds
        taken: dict[Any, Any] = {}
        carried: tuple[Observed, ...] = ()
        if self.settler is not None and self.ledger.carries_settles:
            taken, carried = self.settler.carry()
        committed = False
        try:
            claim = self.ledger.claim(ClaimTicket(
                marque_id=marque.marque_id,
                nonce=nonce,
                target=marque.target,
                executions=marque.budget.executions,
                max_rows=marque.budget.max_rows,
                attempts_per_nonce=marque.budget.attempts_per_nonce,
                expires_at=float(marque.expires_at),
                owner_process=self.processes.process_id,
                lease_seconds=lease,
                now=now,
                pop_jti=jti,
                pop_forget_after=forget_after,
                replay_behind=self.options.replay_jti_write_behind,
                carried=carried,
            ))
            committed = True
            return claim
        finally:
            if self.settler is not None:
                # Recorded with the claim, or (it failed) held again for the settler.
                self.settler.carried(taken, committed=committed)

    def _statement_timeout_ms(self, marque: Marque) -> int:
        """The marque's own statement timeout, else this Pilot's."""
        return marque.change.statement_timeout_ms or self.options.statement_timeout_ms

    def _target_attempt(self, marque: Marque, nonce: str, attempt: int) -> TargetAttempt:
        return TargetAttempt(
            marque_id=marque.marque_id,
            nonce=nonce,
            number=attempt,
            pilot_id=self.pilot_id,
            incarnation=self.incarnation,
            change=marque.change if isinstance(marque.change, Change) else None,
            max_rows=marque.budget.max_rows,
            statement_timeout_ms=self._statement_timeout_ms(marque),
            expires_at=float(marque.expires_at),
            target=marque.target,
            target_id=self.target_ids.get(marque.target),
        )

    def target_id_for(self, target: str, marque_id: str, nonce: str) -> str | None:
        """The identity of the database a nonce's attempts on ``target`` were sent to: the
        pin a rebinding left on it, else the ledger's binding of the name (None: unknown)."""
        pinned = self.ledger.pinned_attempt(marque_id, nonce)
        return pinned.target_id if pinned is not None else self.target_ids.get(target)

    def _observe_target(
        self, target_attempt: TargetAttempt, record: AttemptRecord, attempt: AttemptStream
    ) -> Observation:
        """Steps 3–5 on the target: what this attempt did, as one observation."""
        target = self.targets[target_attempt.target]
        try:
            applied = target.execute(target_attempt, attempt.emit)
        except StampConflict:
            attempt.emit("fence_checked", stamp="conflict")
            evidence = target.reconcile(target_attempt)
            reconciliation.log_reconciliation(self, record, evidence, "fence_conflict")
            reconciliation.check_stamp_against_ledger(self, record, evidence)
            return reconciliation.evidence_observation(target_attempt, evidence, "fence_conflict")
        except NotApplied as exc:
            attempt.emit("rolled_back", error=exc.to_dict())
            return Observation(target_attempt, Status.ABORTED_NOT_APPLIED, error=exc.to_dict())
        except Indeterminate as exc:
            attempt.emit("outcome_unknown", error=exc.to_dict())
            return Observation(replace(target_attempt, txid=exc.detail.get("txid")),
                               Status.INDETERMINATE, error=exc.to_dict())
        except Exception as exc:  # a fault of ours mid-transaction: we cannot say
            error = {"code": "commit_unknown",
                     "message": f"the Pilot failed while the target transaction was open "
                                f"({' '.join(str(exc).split()) or 'no detail'}); whether it "
                                "committed is for reconciliation to find out",
                     "sqlstate": None}
            attempt.emit("outcome_unknown", error=error)
            return Observation(target_attempt, Status.INDETERMINATE, error=error)
        return Observation(target_attempt, Status.APPLIED, rows_affected=applied.rows_affected,
                           result=applied.result)

    def _record_observation(
        self, observation: Observation, attempt: AttemptStream
    ) -> AttemptRecord | None:
        """Step 5's second half: the observation, durably, with the attempt's events.

        The target has already spoken, so an unavailable ledger is tried again a
        bounded number of times (:data:`SETTLE_BACKOFF_SECONDS`). If it still cannot
        record the observation, returns None and publishes ``outcome_not_recorded``:
        the attempt stays claimed (``in_progress``) in the ledger, this process keeps
        the observation for its next :meth:`recover`, and any other process settles
        the attempt from the target's stamp once its owner is gone.
        """
        recorded = attempt.event("outcome_recorded", status=observation.status.value)
        try:
            record = self._settle_observation(observation, [*attempt.events, recorded])
        except LedgerUnavailable as exc:
            target_attempt = observation.target_attempt
            missed = attempt.event("outcome_not_recorded", status=observation.status.value,
                                   tries=len(SETTLE_BACKOFF_SECONDS) + 1, error=exc.to_dict())
            attempt.publish(missed)
            key = (target_attempt.marque_id, target_attempt.nonce, target_attempt.number)
            self._unrecorded[key] = (observation, [*attempt.events, missed])
            return None
        attempt.publish(recorded)
        if self._unrecorded:
            self.record_unrecorded()  # the ledger is back: record what it missed
        return record

    def _settle_observation(
        self, observation: Observation, events: list[dict[str, Any]]
    ) -> AttemptRecord:
        """:meth:`_observe_execution`, tried again while the ledger is unavailable; raises
        the last ``LedgerUnavailable``."""
        target_attempt = observation.target_attempt
        for index in range(len(SETTLE_BACKOFF_SECONDS) + 1):
            try:
                if index:
                    time.sleep(SETTLE_BACKOFF_SECONDS[index - 1])
                    # A write whose answer was lost may have landed: never write it twice.
                    for held in self.ledger.attempts(target_attempt.marque_id,
                                                     target_attempt.nonce):
                        if held.attempt == target_attempt.number and (
                                held.status.rank >= observation.status.rank):
                            return held
                return self._observe_execution(observation, events)
            except LedgerUnavailable:
                if index == len(SETTLE_BACKOFF_SECONDS):
                    raise
        raise AssertionError("unreachable")

    def _observe_execution(
        self, observation: Observation, events: list[dict[str, Any]]
    ) -> AttemptRecord:
        """One ledger write of what this Pilot's own execution observed, with its events."""
        target_attempt = observation.target_attempt
        return self.ledger.observe(
            target_attempt.marque_id, target_attempt.nonce, target_attempt.number,
            observation.status, now=self.clock(), cause="execution", events=events,
            rows_affected=observation.rows_affected, error=observation.error,
            result=observation.result,
        )

    def record_unrecorded(self) -> list[dict[str, Any]]:
        """Record the observations the ledger missed while it was away; what changed."""
        changes: list[dict[str, Any]] = []
        for key in list(self._unrecorded):
            pending = self._unrecorded.pop(key, None)
            if pending is None:
                continue  # another thread is recording it
            observation, events = pending
            target_attempt = observation.target_attempt
            recorded = recorded_event(target_attempt, observation.status, self.clock())
            try:
                record = self._observe_execution(observation, [*events, recorded])
            except LedgerUnavailable:
                self._unrecorded[key] = pending
                break  # still away: the next recovery tries again
            changes.append({"marque_id": target_attempt.marque_id, "nonce": target_attempt.nonce,
                            "attempt": target_attempt.number,
                            "from": Status.IN_PROGRESS.value,
                            "to": record.status.value})
        return changes

    def _unrecorded_outcome(self, observation: Observation) -> Outcome:
        """What the target said about an attempt the ledger could not record."""
        target_attempt = observation.target_attempt
        return Outcome(
            marque_id=target_attempt.marque_id, nonce=target_attempt.nonce,
            status=observation.status.value,
            attempt=target_attempt.number, rows_affected=observation.rows_affected,
            pilot_id=self.pilot_id, incarnation=self.incarnation, replayed=False,
            error=observation.error, result=observation.result, recorded=False,
        )

    # -- recovery and reconciliation (pilot/reconciliation.py) ------------------------

    def _settle_known(self, record: AttemptRecord, *, reconcile: bool = True) -> AttemptRecord:
        """A nonce asked about again: settle what can be settled before answering.

        * In progress, and this very process holds its target's answer unrecorded
          (the ledger was away right after COMMIT): record it now, so the caller
          hears what this process told the first caller, not ``in_progress``.
        * In progress, and its owner is gone or its lease ran out: reconcile it.
        * Indeterminate (``reconcile``): ask the target again, once — observe,
          never resend — so a retry after an outage is answered by evidence at
          once rather than at the background reconciler's next round.
        """
        key = (record.marque_id, record.nonce, record.attempt)
        if record.status is Status.IN_PROGRESS and self.settler is not None and (
                self.settler.holds(*key)):
            self.settler.flush()  # answered applied already: record it, then read it
            return reconciliation.current(self, record)
        if record.status is Status.IN_PROGRESS and key in self._unrecorded:
            self.record_unrecorded()
            return reconciliation.current(self, record)
        if record.status is Status.IN_PROGRESS and reconciliation.owner_gone(self, record):
            return reconciliation.settle_lost(self, record)
        if reconcile and record.status is Status.INDETERMINATE:
            return reconciliation.reconcile(self, record, "retry")
        return record

    def check_continuity(self) -> dict[str, Any] | None:
        """DESIGN §5: check the targets' stamps against the ledger; see
        :func:`marque.pilot.continuity.check_continuity`. Returns the finding, or None."""
        from marque.pilot.continuity import check_continuity

        return check_continuity(self)

    def recover(self) -> list[dict[str, Any]]:
        """Settle what evidence can settle; returns what changed (see
        :func:`marque.pilot.reconciliation.recover`)."""
        return reconciliation.recover(self)

    def report(self) -> bool:
        """Deliver queued outcome reports to the logbook and sinks; True if all were acked."""
        if self.logbook is None and not self.report_sinks:
            return False
        try:
            return self._report_batches(self.logbook)
        except LedgerUnavailable:
            return False  # the outbox keeps every report for the next try

    def _report_batches(self, logbook: Logbook | None) -> bool:
        while True:
            pending = self.ledger.outbox_pending(limit=REPORT_BATCH)
            if not pending:
                return True
            try:
                # One logbook transaction and one ledger transaction per batch; a batch a
                # sink refused is appended again next time, and the logbook's key dedups it.
                if logbook is not None:
                    logbook.append_all([(f"execution.{entry.status}", _report_key(entry),
                                         entry.payload) for entry in pending])
                for sink in self.report_sinks:
                    sink.deliver(pending)
            except Exception:  # a destination is unavailable: retried on the next report
                for entry in pending:
                    self.ledger.outbox_failed(entry)
                return False
            crash_point("before_report_ack")
            self.ledger.outbox_ack_all(pending, self.clock())
            if len(pending) < REPORT_BATCH:
                return True

    # -- Effect Sets (pilot/effects.py) --------------------------------------------

    def preview_effects(self, request: Any, target: str) -> Any:
        """Preview an :class:`~marque.effects.request.EffectPreviewRequest` on ``target``:
        the rows read from it, the preview built and stored in the ledger by its
        ``effect_preview_cid`` (an :class:`~marque.effects.preview.EffectPreview`).
        Nothing is claimed, stamped or spent."""
        from marque.pilot.effects import preview_effects

        return preview_effects(self, request, target)

    def settle(self, marque_id: str, nonce: str) -> Outcome:
        """Settle one nonce by evidence now (observe, never resend), as a retry of it would:
        a dead owner's attempt, or an indeterminate one, is reconciled; returns the outcome.
        ``NotFound`` / ``NonceReaped`` for a nonce never claimed here."""
        record = self.ledger.outcome(marque_id, nonce)
        if record is None:
            return self.outcome(marque_id, nonce)  # raises NotFound / NonceReaped
        return self._outcome(self._settle_known(record), replayed=True)

    def effect_receipts(self, marque_id: str, nonce: str) -> dict[str, Any]:
        """Every receipt and dispatch row of one Effect Set execution (read-only)."""
        from marque.pilot.effects import execution_receipts

        return execution_receipts(self, marque_id, nonce)

    # -- reading ------------------------------------------------------------------

    def unsettled(self) -> list[AttemptRecord]:
        """Attempts still ``in_progress`` or ``indeterminate``, oldest first."""
        return [record for status in (Status.IN_PROGRESS, Status.INDETERMINATE)
                for record in self.ledger.unsettled(status)]

    def stats(self) -> dict[str, Any]:
        """The ledger's size and health (what ``marque ledger stats`` prints).

        Live and reapable marques are counted with the clock-skew allowance,
        exactly as :meth:`reap` decides, so "reapable now" is what reap deletes.
        """
        return self.ledger.stats(self.clock(), skew_seconds=self.options.skew_seconds)

    def reap(self) -> dict[str, int]:
        """Report what is unreported, then reap settled entries of expired marques.

        A marque counts as expired only once its expiry plus the clock-skew
        allowance has passed: until then this Pilot could still accept it.
        Each reaped nonce leaves a small record, so :meth:`outcome` can say so.
        """
        self.report()
        return self.ledger.reap(self.clock(), skew_seconds=self.options.skew_seconds)

    def outcome(self, marque_id: str, nonce: str) -> Outcome:
        """The recorded outcome of a nonce (read-only).

        Raises :class:`NonceReaped` for a nonce whose entries were reaped (with
        what was kept of it in ``detail``) and :class:`NotFound` for a nonce
        this ledger never claimed.
        """
        held = None if self.settler is None else self.settler.held(marque_id, nonce)
        if held is not None:  # answered applied, recorded just behind
            return self._outcome(held, replayed=True, recorded=False)
        record = self.ledger.outcome(marque_id, nonce)
        if record is not None:
            return self._outcome(record, replayed=True)
        reaped = self.ledger.reaped(marque_id, nonce)
        if reaped is not None:
            rows = ("" if reaped.rows_affected is None
                    else f", {reaped.rows_affected} row{'s' * (reaped.rows_affected != 1)}")
            raise NonceReaped(
                f"nonce {nonce} of marque {marque_id} ended {reaped.status.value} (attempt "
                f"{reaped.attempt}{rows}); its entries were reaped from this ledger at "
                f"{iso_time(reaped.reaped_at)}, after the marque expired at "
                f"{iso_time(reaped.expires_at)}. Its outcome was settled and reported to the "
                "logbook before reaping: the logbook holds the full record",
                detail={"marque_id": marque_id, "nonce": nonce, "status": reaped.status.value,
                        "attempt": reaped.attempt, "rows_affected": reaped.rows_affected,
                        "target": reaped.target, "expires_at": reaped.expires_at,
                        "reaped_at": reaped.reaped_at},
            )
        raise NotFound(
            f"this Pilot's ledger never claimed nonce {nonce} of marque {marque_id}; check both "
            "(`marque exec` prints them). A nonce is claimed only once a marque passes its "
            "checks, so a refused exec leaves nothing to find")

    def follow(
        self, marque_id: str, nonce: str, on_event: EventSink | None = None, *,
        poll_seconds: float = 0.05, timeout: float | None = None,
    ) -> Outcome:
        """Follow the execution of a nonce to its outcome, never starting one.

        An execution running in this process is followed live (its events so far,
        then the rest as they happen). Otherwise the nonce's stored events are
        sent and the ledger is watched until the attempt is no longer in
        progress; an owner that is gone is settled by reconciliation first, as a
        retry would. ``NotFound`` / ``NonceReaped`` for a nonce never claimed
        here. With ``timeout``, returns the ``in_progress`` outcome when it
        passes.
        """
        with self._inflight_lock:
            running = self._inflight.get((marque_id, nonce))
        if running is not None:
            running.follow(on_event)
            running.done.wait(timeout)
            if running.outcome is not None:
                return _replayed(running.outcome)
        deadline = None if timeout is None else time.monotonic() + timeout
        sent = 0
        while True:
            record = self.ledger.outcome(marque_id, nonce)
            if record is None:
                self.outcome(marque_id, nonce)  # raises NotFound / NonceReaped
                continue  # claimed between the two reads
            record = self._settle_known(record, reconcile=False)
            outcome = self._outcome(record, replayed=True)
            events = self.ledger.events(marque_id, nonce)
            for event in events[sent:]:
                send_event(on_event, event)
            sent = len(events)
            if outcome.status != Status.IN_PROGRESS.value:
                return outcome
            if deadline is not None and time.monotonic() > deadline:
                return outcome
            time.sleep(poll_seconds)

    def stalled(self, marque_id: str, nonce: str) -> Indeterminate | None:
        """For a nonce recorded ``in_progress``: why its owner can no longer finish it
        (``owner_gone`` or ``lease_expired``), or None while it may. Read-only: settling
        it is ``recover`` (``marque reconcile``) or a retry of the same nonce."""
        record = self.ledger.outcome(marque_id, nonce)
        if record is None or record.status is not Status.IN_PROGRESS:
            return None
        return reconciliation.lost(self, record)

    def _outcome(self, record: AttemptRecord, *, replayed: bool,
                 recorded: bool = True) -> Outcome:
        return Outcome(marque_id=record.marque_id, nonce=record.nonce,
                       status=record.status.value, attempt=record.attempt,
                       rows_affected=record.rows_affected, pilot_id=self.pilot_id,
                       incarnation=self.incarnation, replayed=replayed, error=record.error,
                       result=record.result, recorded=recorded)

    def attach(self, worker: Any) -> None:
        """Own a background worker (anything with ``stop()``): stopped first on close."""
        self._workers.append(worker)

    def keep_unrecorded(self, held: list[tuple[Observation, list[dict[str, Any]]]]) -> None:
        """Observations answered but not recorded (the ledger refused them): kept for
        :meth:`recover` and :meth:`close`, like those the ledger missed after a COMMIT."""
        for observation, events in held:
            target_attempt = observation.target_attempt
            key = (target_attempt.marque_id, target_attempt.nonce, target_attempt.number)
            self._unrecorded[key] = (observation, events)

    def close(self) -> None:
        """Stop background work; release the ledger, targets, logbook and this run's lock."""
        for worker in reversed(self._workers):
            worker.stop()
        self._workers.clear()
        self.settler = None
        if self._unrecorded:
            self.record_unrecorded()  # a last try: the ledger may be back
        for target in self.targets.values():
            target.close()
        self.ledger.close()
        if self.logbook is not None:
            self.logbook.close()
        # Attempts this run leaves claimed but unrecorded: leave it findable as dead, so
        # another process reconciles them from their stamps now, not after their lease.
        self.processes.close(leave_trace=bool(self._unrecorded))


def _report_key(entry: OutboxEntry) -> str:
    return f"outcome/{entry.marque_id}/{entry.nonce}/{entry.attempt}/{entry.status}"


def _replayed(outcome: Outcome) -> Outcome:
    return replace(outcome, replayed=True)

