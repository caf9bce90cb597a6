"""Recovery and reconciliation: settle an attempt by evidence, never by a resend.

An attempt whose owner cannot finish it (its process died, its lease ran out)
becomes ``indeterminate``; the target is then asked, with a tombstone in its own
transaction (DESIGN §4): inserted, the attempt never committed and now never
can; refused by this attempt's applied stamp, it committed. Nothing here ever
runs the change. Each reconciliation is written to the logbook with what it
proved and why, and an applied stamp the ledger does not hold as applied is a
finding of its own.
"""

from __future__ import annotations

import time
from typing import Any

from marque.crash import crash_point
from marque.errors import Indeterminate, LeaseExpired, LedgerUnavailable, OwnerGone
from marque.ledger import AttemptRecord
from marque.outcome import Status
from marque.pilot.context import PilotContext
from marque.pilot.recording import Recorder
from marque.pilot.reporting import Reporting
from marque.pilot.stream import Observation
from marque.target import Evidence, Target, TargetAttempt
from marque.target.base import STAMP_APPLIED
from marque.timefmt import iso_time


class Reconciliation:
    """Settles attempts by evidence for a Pilot: recovery, and one attempt at a time.

    Given the :class:`~marque.pilot.recording.Recorder` (recovery records first what
    the ledger missed) and the :class:`~marque.pilot.reporting.Reporting` it hands the
    settled outcomes to.
    """

    def __init__(self, context: PilotContext, recorder: Recorder,
                 reporting: Reporting) -> None:
        self._ctx = context
        self._recorder = recorder
        self._reporting = reporting

    def owner_gone(self, record: AttemptRecord) -> bool:
        """Whether an in-progress attempt's owner can no longer finish it."""
        return self.lost(record) is not None

    def lost(self, record: AttemptRecord) -> Indeterminate | None:
        """Why an in-progress attempt's owner can no longer finish it; None while it may.

        ``lease_expired`` when the lease really ran out; ``owner_gone`` when the
        owner is provably dead (its run lock released) while its lease still
        holds — what a crash looks like seconds later, not minutes.
        """
        if record.owner_process == self._ctx.processes.process_id:
            return None
        now = self._ctx.clock()
        if record.lease_expires_at < now:
            return LeaseExpired(
                f"the lease on attempt {record.attempt} ran out at "
                f"{iso_time(record.lease_expires_at)} before its Pilot process recorded an "
                "outcome")
        dead = self._ctx.processes.is_dead(record.owner_process)
        if dead is True:
            return OwnerGone(
                f"the Pilot process that ran attempt {record.attempt} ({record.owner_process}) "
                "died before recording an outcome")
        if dead is None and record.started_at > now + self._ctx.options.skew_seconds:
            # A lease taken "in the future" was measured by a clock ahead of this one (or
            # this one stepped back): how much of it is left cannot be told, and an owner
            # nobody here can see must not hold the nonce for as long as the clocks disagree.
            # Counting it as run out is safe: reconciliation only observes (a tombstone).
            return LeaseExpired(
                f"the lease on attempt {record.attempt} was taken at "
                f"{iso_time(record.started_at)}, later than this Pilot's clock reads now "
                f"({iso_time(now)}) by more than the clock-skew allowance "
                "(settings.skew_seconds): a clock went back, so the lease counts as run out")
        return None

    def settle_lost(self, record: AttemptRecord) -> AttemptRecord:
        """An owner died or its lease ran out: indeterminate, then evidence."""
        error = self.lost(record) or LeaseExpired(
            f"the owner of attempt {record.attempt} ({record.owner_process}) recorded no outcome")
        marked = self._ctx.ledger.observe(
            record.marque_id, record.nonce, record.attempt, Status.INDETERMINATE,
            now=self._ctx.clock(), cause="lease",
            error={**error.to_dict(),
                   "message": error.message + "; the target is asked whether it committed"},
        )
        if marked.status.settled:
            return marked  # another reconciler got there first
        return self.reconcile(marked, error.code)

    def run_for(self, record: AttemptRecord) -> tuple[TargetAttempt, Target] | None:
        """The attempt as its target sees it (observed, never run) and that target, from the
        ledger's budget; None when this Pilot no longer serves the marque's target."""
        budget = self._ctx.ledger.budget(record.marque_id)
        if budget is None or budget["target"] not in self._ctx.targets:
            return None
        target_attempt = TargetAttempt(
            marque_id=record.marque_id, nonce=record.nonce, number=record.attempt,
            pilot_id=self._ctx.pilot_id, incarnation=record.owner_incarnation,
            change=None,  # reconciliation observes; it never runs the change
            max_rows=budget["max_rows"], statement_timeout_ms=0,
            expires_at=budget["expires_at"], target=budget["target"],
            target_id=self._ctx.target_id_for(budget["target"], record.marque_id, record.nonce),
        )
        return target_attempt, self._ctx.targets[budget["target"]]

    def reconcile(self, record: AttemptRecord, cause: str,
                  known: tuple[TargetAttempt, Target] | None = None) -> AttemptRecord:
        """Ask the target for evidence about one attempt and settle by it.

        ``known`` is the target_attempt and target when the caller has them (a lost COMMIT
        response, straight from execution); otherwise they come from the ledger.
        """
        now = self.current(record)
        if now.status.settled:
            # Someone settled it since our snapshot: nothing for us to add.
            return now
        if self._ctx.ledger.effect_run(record.marque_id, record.nonce) is not None:
            # An Effect Set's evidence is its row stamps, never a stamp of the nonce.
            from marque.pilot.effects import reconcile_effects

            return reconcile_effects(self._ctx, now, cause)
        found = known or self.run_for(record)
        if found is None:
            evidence = Evidence(Status.INDETERMINATE,
                                reason="target of this marque is not configured")
        else:
            # Every target Marque supports holds stamps; one that cannot would need a
            # human to record evidence (DESIGN §4) and must not reach this line.
            evidence = found[1].reconcile(found[0])
        crash_point("after_reconcile_evidence")
        self.log_reconciliation(record, evidence, cause)
        self.check_stamp_against_ledger(record, evidence)
        target_attempt = found[0] if found else TargetAttempt(
            record.marque_id, record.nonce, record.attempt, self._ctx.pilot_id,
            record.owner_incarnation, None, 0, 0)
        observation = evidence_observation(
            target_attempt, evidence, (now.error or {}).get("code", cause))
        if observation.status is Status.INDETERMINATE:
            return now
        # The compare-and-set re-checks what our snapshot saw: a settled attempt stays.
        return self._ctx.ledger.observe(
            record.marque_id, record.nonce, record.attempt, observation.status,
            now=self._ctx.clock(), cause="reconciliation", rows_affected=observation.rows_affected,
            error=observation.error,
        )

    def current(self, record: AttemptRecord) -> AttemptRecord:
        """The attempt as the ledger holds it now (a snapshot may be stale)."""
        for candidate in self._ctx.ledger.attempts(record.marque_id, record.nonce):
            if candidate.attempt == record.attempt:
                return candidate
        return record

    def check_stamp_against_ledger(self, record: AttemptRecord, evidence: Evidence) -> None:
        """An applied stamp of an attempt the ledger holds as not applied is a finding.

        It cannot happen while the ledger is the one that ran the attempts; it
        means the ledger was restored or edited. The target is right (it never
        applies a nonce twice); the ledger's history for that nonce is not.
        Best effort: an unavailable ledger skips it, and the same evidence is
        looked at again when the attempt is reconciled.
        """
        stamp = evidence.stamp
        if (stamp is None or stamp.get("kind") != STAMP_APPLIED
                or stamp["attempt"] == record.attempt):
            return
        try:
            attempts = self._ctx.ledger.attempts(record.marque_id, record.nonce)
        except LedgerUnavailable:
            return
        held = {a.attempt: a.status for a in attempts}
        if held.get(stamp["attempt"]) is Status.APPLIED:
            return
        if self._ctx.logbook is not None:
            self._ctx.logbook.append(
                "finding.stamp_contradicts_ledger",
                f"finding/stamp/{record.marque_id}/{record.nonce}/{stamp['attempt']}",
                {"marque_id": record.marque_id, "nonce": record.nonce,
                 "stamp": stamp,
                 "ledger_status": (held[stamp["attempt"]].value
                                   if stamp["attempt"] in held else None),
                 "pilot": {"id": self._ctx.pilot_id, "incarnation": self._ctx.incarnation}},
            )

    def log_reconciliation(self, record: AttemptRecord, evidence: Evidence,
                           cause: str) -> None:
        """Write what the target's evidence proved about an attempt, and why, to the logbook."""
        if self._ctx.logbook is None:
            return
        self._ctx.logbook.append(
            "execution.reconciliation",
            f"reconcile/{record.marque_id}/{record.nonce}/{record.attempt}/{time.time_ns()}",
            {
                "marque_id": record.marque_id,
                "nonce": record.nonce,
                "attempt": record.attempt,
                "cause": cause,
                "status": evidence.status.value,
                "reason": evidence.reason,
                "stamp": evidence.stamp,
                "corroboration": evidence.corroboration,
                "pilot": {"id": self._ctx.pilot_id, "incarnation": self._ctx.incarnation},
            },
        )

    def recover(self) -> list[dict[str, Any]]:
        """Settle what evidence can settle; returns what changed.

        In-progress attempts whose owner is dead or whose lease expired become
        ``indeterminate``; every indeterminate attempt is then reconciled.
        """
        changes = self._recorder.record_unrecorded()
        gone: set[str] = set()
        tried: set[tuple[str, str, int]] = set()
        for record in self._ctx.ledger.unsettled(Status.IN_PROGRESS):
            if self.owner_gone(record):
                gone.add(record.owner_process)
                tried.add((record.marque_id, record.nonce, record.attempt))
                after = self.settle_lost(record)
                changes.append(change_of(record, after))
        for process_id in gone:  # nothing of theirs is in progress any more
            self._ctx.processes.forget(process_id)
        for record in self._ctx.ledger.unsettled(Status.INDETERMINATE):
            if (record.marque_id, record.nonce, record.attempt) in tried:
                continue  # asked its target once this round already
            after = self.reconcile(record, "recovery")
            if after.status is not record.status:
                changes.append(change_of(record, after))
        self._reporting.report()
        return changes


def evidence_observation(
    target_attempt: TargetAttempt, evidence: Evidence, cause: str
) -> Observation:
    if evidence.status is Status.APPLIED:
        return Observation(target_attempt, Status.APPLIED, rows_affected=evidence.rows_affected)
    if evidence.status is Status.ABORTED_NOT_APPLIED:
        # Keep the code of what made it uncertain; the message says what settled it.
        code = (cause if cause in ("lease_expired", "owner_gone", "commit_unknown")
                else "commit_unknown")
        return Observation(target_attempt, Status.ABORTED_NOT_APPLIED,
                           error={"code": code, "message": f"reconciled: {evidence.reason}",
                                  "sqlstate": None})
    return Observation(target_attempt, Status.INDETERMINATE)


def change_of(before: AttemptRecord, after: AttemptRecord) -> dict[str, Any]:
    """What a recovery changed about one attempt, as ``recover`` reports it."""
    return {
        "marque_id": before.marque_id,
        "nonce": before.nonce,
        "attempt": before.attempt,
        "from": before.status.value,
        "to": after.status.value,
    }
