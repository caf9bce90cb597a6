"""The execution path (DESIGN §3 end to end): verify, claim, fenced run, record, report.

Nonce first, statement second (seed 000): the claim is durable in the ledger
before the target is touched, so a crash anywhere after it leaves the nonce
claimed and the budget spent, never a second target_attempt. Whatever cannot be known is
recorded as ``indeterminate`` and settled later by evidence (reconciliation),
never by a guess.

:class:`Execution` owns what one process knows of its executions: those in
flight (callers of the same nonce follow the one execution), the marques it has
verified, and the applied writes it settles behind their answer. It answers
about a nonce too — its outcome, following it, whether it stalled — since those
answers read that same state.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from typing import Any

from marque.change import Change, EffectSetChange
from marque.crash import crash_point
from marque.errors import (
    Indeterminate,
    InvalidInput,
    MarqueError,
    NonceReaped,
    NotApplied,
    NotFound,
)
from marque.ledger import AttemptRecord, Claim, ClaimTicket, Observed
from marque.ledger.roles import OutcomesRole
from marque.outcome import Outcome, Status
from marque.pilot.context import PilotContext
from marque.pilot.continuity import Continuity
from marque.pilot.reconciliation import Reconciliation, evidence_observation
from marque.pilot.recording import Recorder
from marque.pilot.reporting import Reporting
from marque.pilot.settle_behind import SettleBehind
from marque.pilot.stream import AttemptStream, EventSink, Inflight, Observation, send_event
from marque.target import StampConflict, TargetAttempt
from marque.timefmt import iso_time
from marque.token import Marque, check_marque, jti_forget_after, read_marque, verify_proof

MAX_NONCE_BYTES = 256
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: Marques whose signature this process has verified, by token (oldest evicted first).
READ_CACHE_SIZE = 4096


def check_nonce(nonce: str) -> str:
    """A nonce is 1..256 UTF-8 bytes of printable text."""
    if not isinstance(nonce, str) or not nonce:
        raise InvalidInput("nonce must be a non-empty string")
    if len(nonce.encode("utf-8", "surrogatepass")) > MAX_NONCE_BYTES:
        raise InvalidInput(f"nonce is longer than {MAX_NONCE_BYTES} UTF-8 bytes")
    if _CONTROL.search(nonce):
        raise InvalidInput("nonce contains control characters")
    return nonce


class Execution:
    """Runs marques for ``(marque_id, nonce)`` once, and answers about them."""

    def __init__(self, context: PilotContext, *, continuity: Continuity,
                 reconciliation: Reconciliation, recorder: Recorder,
                 reporting: Reporting) -> None:
        self._ctx = context
        self._continuity = continuity
        self._reconciliation = reconciliation
        self._recorder = recorder
        self._reporting = reporting
        self._inflight: dict[tuple[str, str], Inflight] = {}
        self._read_cache: dict[str, Marque] = {}
        self._inflight_lock = threading.Lock()
        #: Applied writes answered before their outcome is recorded (long-running Pilots
        #: with ``settle_write_behind``; see :mod:`marque.pilot.settle_behind`).
        self.settler: SettleBehind | None = None

    # -- verify ---------------------------------------------------------------------------

    def verify(self, token: str, proof: str | None, nonce: str) -> tuple[Marque, str]:
        """Step 1: the marque and its proof of possession; returns the marque and proof jti.

        The signature check of a marque depends only on the token, so it is
        done once per process and cached by token; the window, Pilot,
        incarnation and target are checked on every call, and so is the proof.
        The proof's ``jti`` is recorded by the claim, in the same transaction
        (or, for a replay of an applied nonce, just behind the answer:
        ``ledger/jtis.py``). Refusals claim nothing.
        """
        ctx = self._ctx
        now = ctx.clock()
        check_nonce(nonce)
        marque = self._read_cache.get(token)
        if marque is None:
            marque = read_marque(token, ctx.trusted)
            with self._inflight_lock:
                if len(self._read_cache) >= READ_CACHE_SIZE:
                    self._read_cache.pop(next(iter(self._read_cache)))
                self._read_cache[token] = marque
        self._check(marque, now)
        continuity = self._continuity
        if marque.target in continuity.unchecked:
            continuity.ensure(marque.target)
            self._check(marque, now)  # a rotation just now refuses it
        if continuity.replaced_targets and marque.target in continuity.replaced_targets:
            continuity.refuse_if_replaced(marque.target)
            self._check(marque, now)  # a rotation just now refuses it
        jti = verify_proof(
            proof,
            marque,
            nonce=nonce,
            pilot_id=ctx.pilot_id,
            remember_jti=None,
            now=now,
            window_seconds=ctx.options.pop_window_seconds,
        )
        return marque, jti

    def _check(self, marque: Marque, now: float) -> None:
        ctx = self._ctx
        check_marque(marque, pilot_id=ctx.pilot_id, incarnation=ctx.incarnation,
                     targets=ctx.targets.keys(), now=now,
                     skew_seconds=ctx.options.skew_seconds)

    # -- execute --------------------------------------------------------------------------

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
        """Steps 2 to 6 for one verified marque and nonce, this process's one execution."""
        now = self._ctx.clock()
        forget_after = jti_forget_after(now, self._ctx.options.pop_window_seconds)
        answered = self._answer_replay(marque, nonce, jti, forget_after)
        if answered is not None:
            return answered
        if isinstance(marque.change, EffectSetChange):
            from marque.pilot.effects import admit

            admit(self._ctx, marque)  # before the claim: a refusal here claims nothing
        claim = self._claim(marque, nonce, jti, now, forget_after)
        if not claim.fresh:
            return self.outcome_of(self.settle_known(claim.record), replayed=True)
        attempt = AttemptStream(self._ctx.clock, marque.marque_id, nonce,
                                claim.record.attempt, mine, on_event)
        attempt.emit("claimed", owner_process=self._ctx.processes.process_id,
                     lease_expires_at=claim.record.lease_expires_at,
                     **self._skew_used(marque, now))
        crash_point("after_claim")
        observation = self._run_claimed(marque, nonce, claim.record, attempt)
        if self.settler is not None and self.settler.takes(observation):
            return self._settle_behind(observation, attempt, claim.record)
        return self._finish(marque, observation, attempt)

    def _answer_replay(self, marque: Marque, nonce: str, jti: str,
                       forget_after: float) -> Outcome | None:
        """A replay of an applied nonce answered without a claim, or None to claim."""
        ctx = self._ctx
        if self.settler is not None and (
                held := self.settler.held(marque.marque_id, nonce)) is not None:
            if ctx.options.replay_jti_write_behind:
                # Answered applied already, its settle just behind: a proof for it can
                # only read that outcome again, as for any replay of an applied nonce.
                ctx.ledger.hold_jti(jti, forget_after)
                return self.outcome_of(held, replayed=True, recorded=False)
            self.settler.flush()  # every replay records its jti: let the claim see it
        # A ledger whose claim answers an applied replay itself (PostgreSQL: in the claim's
        # one round trip) needs no read first; an Effect Set's admit comes before its claim.
        if ctx.options.replay_jti_write_behind and not (
                ctx.ledger.claim_answers_replays and isinstance(marque.change, Change)):
            # An applied nonce is absorbing: answer its replay from a read, no durable write.
            settled = ctx.ledger.replay(marque.marque_id, nonce, jti, forget_after)
            if settled is not None:
                return self.outcome_of(settled, replayed=True)
        return None

    def _run_claimed(self, marque: Marque, nonce: str, record: AttemptRecord,
                     attempt: AttemptStream) -> Observation:
        """Steps 3 to 5 on the target, for a fresh claim: what this attempt did."""
        unchecked = self._continuity.unreadable(marque.target)
        if unchecked is not None:  # nothing is sent to a target whose stamps are unread
            attempt.emit("rolled_back", error=unchecked.to_dict())
            return Observation(self._target_attempt(marque, nonce, record.attempt),
                               Status.ABORTED_NOT_APPLIED, error=unchecked.to_dict())
        if isinstance(marque.change, EffectSetChange):
            from marque.pilot.effects import apply_claimed

            return apply_claimed(self._ctx, marque, nonce, record, attempt)
        target_attempt = self._target_attempt(marque, nonce, record.attempt)
        return self._observe_target(target_attempt, record, attempt)

    def _settle_behind(self, observation: Observation, attempt: AttemptStream,
                       claimed: AttemptRecord) -> Outcome:
        """Answer an applied write now; the settler records it just behind the answer."""
        assert self.settler is not None
        # The stamp committed with the write is its durable record until the settle lands.
        attempt.emit("settle_behind", status=Status.APPLIED.value)
        self.settler.hold(observation, attempt.events, claimed)
        target_attempt = observation.target_attempt
        return Outcome(marque_id=target_attempt.marque_id, nonce=target_attempt.nonce,
                       status=Status.APPLIED.value, attempt=target_attempt.number,
                       rows_affected=observation.rows_affected, pilot_id=self._ctx.pilot_id,
                       incarnation=self._ctx.incarnation, replayed=False, error=None,
                       result=None, recorded=False)

    def _finish(self, marque: Marque, observation: Observation,
                attempt: AttemptStream) -> Outcome:
        """Step 5's record and step 6's report; a lost COMMIT response is reconciled first."""
        recorded = self._recorder.record(observation, attempt)
        if recorded is None:  # the ledger is away: say what is known, recorded: false
            return self._unrecorded_outcome(observation)
        crash_point("after_outcome_recorded")
        record = recorded
        if record.status is Status.INDETERMINATE:
            # A lost COMMIT response goes to reconciliation at once.
            record = self._reconciliation.reconcile(
                record, "commit_unknown",
                (observation.target_attempt, self._ctx.targets[marque.target]))
        if self._ctx.options.report_inline:
            if self._reporting.report():
                attempt.emit("reported")
        else:
            self._reporting.wanted.set()
        return self.outcome_of(record, replayed=False)

    def _skew_used(self, marque: Marque, now: float) -> dict[str, Any]:
        """Fields for the ``claimed`` event when the marque was accepted only thanks to the
        clock-skew allowance (after its ``exp`` or before its ``nbf``): the window is visible."""
        if now > marque.expires_at:
            return {"marque_expired_at": marque.expires_at,
                    "skew_seconds": self._ctx.options.skew_seconds}
        if now < marque.not_before:
            return {"marque_not_before": marque.not_before,
                    "skew_seconds": self._ctx.options.skew_seconds}
        return {}

    def _claim(
        self, marque: Marque, nonce: str, jti: str, now: float, forget_after: float
    ) -> Claim:
        """Step 2: claim the nonce (or learn what is recorded) in one ledger transaction."""
        ctx = self._ctx
        # The lease must outlive the longest the target may legitimately take.
        lease = self._statement_timeout_ms(marque) / 1000 + ctx.options.lease_grace_seconds
        taken: dict[Any, Any] = {}
        carried: tuple[Observed, ...] = ()
        if self.settler is not None and ctx.ledger.carries_settles:
            taken, carried = self.settler.carry()
        committed = False
        try:
            claim = ctx.ledger.claim(ClaimTicket(
                marque_id=marque.marque_id,
                nonce=nonce,
                target=marque.target,
                executions=marque.budget.executions,
                max_rows=marque.budget.max_rows,
                attempts_per_nonce=marque.budget.attempts_per_nonce,
                expires_at=float(marque.expires_at),
                owner_process=ctx.processes.process_id,
                lease_seconds=lease,
                now=now,
                pop_jti=jti,
                pop_forget_after=forget_after,
                replay_behind=ctx.options.replay_jti_write_behind,
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
        return marque.change.statement_timeout_ms or self._ctx.options.statement_timeout_ms

    def _target_attempt(self, marque: Marque, nonce: str, attempt: int) -> TargetAttempt:
        ctx = self._ctx
        return TargetAttempt(
            marque_id=marque.marque_id,
            nonce=nonce,
            number=attempt,
            pilot_id=ctx.pilot_id,
            incarnation=ctx.incarnation,
            change=marque.change if isinstance(marque.change, Change) else None,
            max_rows=marque.budget.max_rows,
            statement_timeout_ms=self._statement_timeout_ms(marque),
            expires_at=float(marque.expires_at),
            target=marque.target,
            target_id=ctx.target_ids.get(marque.target),
        )

    def _observe_target(
        self, target_attempt: TargetAttempt, record: AttemptRecord, attempt: AttemptStream
    ) -> Observation:
        """Steps 3–5 on the target: what this attempt did, as one observation."""
        target = self._ctx.targets[target_attempt.target]
        try:
            applied = target.execute(target_attempt, attempt.emit)
        except StampConflict:
            attempt.emit("fence_checked", stamp="conflict")
            evidence = target.reconcile(target_attempt)
            self._reconciliation.log_reconciliation(record, evidence, "fence_conflict")
            self._reconciliation.check_stamp_against_ledger(record, evidence)
            return evidence_observation(target_attempt, evidence, "fence_conflict")
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

    def _unrecorded_outcome(self, observation: Observation) -> Outcome:
        """What the target said about an attempt the ledger could not record."""
        target_attempt = observation.target_attempt
        return Outcome(
            marque_id=target_attempt.marque_id, nonce=target_attempt.nonce,
            status=observation.status.value,
            attempt=target_attempt.number, rows_affected=observation.rows_affected,
            pilot_id=self._ctx.pilot_id, incarnation=self._ctx.incarnation, replayed=False,
            error=observation.error, result=observation.result, recorded=False,
        )

    # -- a nonce asked about again ------------------------------------------------------

    def settle_known(self, record: AttemptRecord, *, reconcile: bool = True) -> AttemptRecord:
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
        reconciliation = self._reconciliation
        if record.status is Status.IN_PROGRESS and self.settler is not None and (
                self.settler.holds(*key)):
            self.settler.flush()  # answered applied already: record it, then read it
            return reconciliation.current(record)
        if record.status is Status.IN_PROGRESS and self._recorder.holds(key):
            self._recorder.record_unrecorded()
            return reconciliation.current(record)
        if record.status is Status.IN_PROGRESS and reconciliation.owner_gone(record):
            return reconciliation.settle_lost(record)
        if reconcile and record.status is Status.INDETERMINATE:
            return reconciliation.reconcile(record, "retry")
        return record

    def settle(self, marque_id: str, nonce: str) -> Outcome:
        """Settle one nonce by evidence now (observe, never resend), as a retry of it would:
        a dead owner's attempt, or an indeterminate one, is reconciled; returns the outcome.
        ``NotFound`` / ``NonceReaped`` for a nonce never claimed here."""
        record = self._ctx.ledger.outcome(marque_id, nonce)
        if record is None:
            return self.outcome(marque_id, nonce)  # raises NotFound / NonceReaped
        return self.outcome_of(self.settle_known(record), replayed=True)

    def outcome(self, marque_id: str, nonce: str) -> Outcome:
        """The recorded outcome of a nonce (read-only).

        Raises :class:`NonceReaped` for a nonce whose entries were reaped (with
        what was kept of it in ``detail``) and :class:`NotFound` for a nonce
        this ledger never claimed.
        """
        held = None if self.settler is None else self.settler.held(marque_id, nonce)
        if held is not None:  # answered applied, recorded just behind
            return self.outcome_of(held, replayed=True, recorded=False)
        ledger: OutcomesRole = self._ctx.ledger
        record = ledger.outcome(marque_id, nonce)
        if record is not None:
            return self.outcome_of(record, replayed=True)
        reaped = ledger.reaped(marque_id, nonce)
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
        """Follow the execution of a nonce to its outcome, never starting one (see
        :meth:`marque.pilot.core.Pilot.follow`)."""
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
            record = self._ctx.ledger.outcome(marque_id, nonce)
            if record is None:
                self.outcome(marque_id, nonce)  # raises NotFound / NonceReaped
                continue  # claimed between the two reads
            record = self.settle_known(record, reconcile=False)
            outcome = self.outcome_of(record, replayed=True)
            events = self._ctx.ledger.events(marque_id, nonce)
            for event in events[sent:]:
                send_event(on_event, event)
            sent = len(events)
            if outcome.status != Status.IN_PROGRESS.value:
                return outcome
            if deadline is not None and time.monotonic() > deadline:
                return outcome
            time.sleep(poll_seconds)

    def stalled(self, marque_id: str, nonce: str) -> Indeterminate | None:
        """For a nonce recorded ``in_progress``: why its owner can no longer finish it, or
        None while it may (read-only)."""
        record = self._ctx.ledger.outcome(marque_id, nonce)
        if record is None or record.status is not Status.IN_PROGRESS:
            return None
        return self._reconciliation.lost(record)

    def outcome_of(self, record: AttemptRecord, *, replayed: bool,
                   recorded: bool = True) -> Outcome:
        """The outcome object of a ledger record, as this Pilot answers it."""
        return Outcome(marque_id=record.marque_id, nonce=record.nonce,
                       status=record.status.value, attempt=record.attempt,
                       rows_affected=record.rows_affected, pilot_id=self._ctx.pilot_id,
                       incarnation=self._ctx.incarnation, replayed=replayed,
                       error=record.error, result=record.result, recorded=recorded)


def _replayed(outcome: Outcome) -> Outcome:
    return replace(outcome, replayed=True)
