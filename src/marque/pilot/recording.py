"""Recording what an execution observed (DESIGN §3 step 5), and what the ledger missed.

The target has already spoken when an observation is recorded, so an
unavailable ledger is tried again a bounded number of times
(:data:`SETTLE_BACKOFF_SECONDS`), never by writing twice what may have landed.
An observation it still cannot record is kept here, by attempt: the attempt
stays claimed (``in_progress``) in the ledger, and the next recovery, the next
recorded outcome or the Pilot's close records it (:meth:`Recorder.record_unrecorded`).
"""

from __future__ import annotations

import time
from typing import Any

from marque.errors import LedgerUnavailable
from marque.ledger import AttemptRecord
from marque.ledger.roles import OutcomesRole
from marque.outcome import Status
from marque.pilot.context import PilotContext
from marque.pilot.stream import AttemptStream, Observation, recorded_event

#: Pauses between the tries of recording what the target said, when the ledger is
#: unavailable right after it (DESIGN §9): three tries in about half a second, then the
#: caller is told the truth with ``recorded: false``.
SETTLE_BACKOFF_SECONDS = (0.1, 0.4)

#: An attempt, as the ledger keys it: marque id, nonce, attempt number.
AttemptKey = tuple[str, str, int]


class Recorder:
    """Records this process's observations; keeps those the ledger could not take."""

    def __init__(self, context: PilotContext) -> None:
        self._ctx = context
        #: Observations the ledger could not record, by attempt, with their events.
        self._unrecorded: dict[AttemptKey, tuple[Observation, list[dict[str, Any]]]] = {}

    def __bool__(self) -> bool:
        """Whether anything is kept unrecorded."""
        return bool(self._unrecorded)

    @property
    def _ledger(self) -> OutcomesRole:
        # Read from the context on each use, like every part; recording needs only this role.
        return self._ctx.ledger

    def holds(self, key: AttemptKey) -> bool:
        """Whether this process holds that attempt's observation unrecorded."""
        return key in self._unrecorded

    def record(self, observation: Observation, attempt: AttemptStream) -> AttemptRecord | None:
        """Step 5's second half: the observation, durably, with the attempt's events.

        If the ledger still cannot record it after the bounded tries, returns None and
        publishes ``outcome_not_recorded``: the observation is kept for the next
        :meth:`record_unrecorded`, and any other process settles the attempt from the
        target's stamp once its owner is gone.
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
                    for held in self._ledger.attempts(target_attempt.marque_id,
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
        return self._ledger.observe(
            target_attempt.marque_id, target_attempt.nonce, target_attempt.number,
            observation.status, now=self._ctx.clock(), cause="execution", events=events,
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
            recorded = recorded_event(target_attempt, observation.status, self._ctx.clock())
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

    def keep(self, held: list[tuple[Observation, list[dict[str, Any]]]]) -> None:
        """Observations answered but not recorded (the ledger refused them): kept for the
        next :meth:`record_unrecorded`, like those the ledger missed after a COMMIT."""
        for observation, events in held:
            target_attempt = observation.target_attempt
            key = (target_attempt.marque_id, target_attempt.nonce, target_attempt.number)
            self._unrecorded[key] = (observation, events)
