"""Settling an applied write *behind* its answer (``settle_write_behind``).

DESIGN §3 step 5 records an outcome durably after the target's COMMIT. For an
applied write the target's stamp is already a durable record that it applied:
it committed in the same transaction as the change. So a long-running Pilot
may answer ``applied`` as soon as the target has committed and let this
settler record the outcome moments later, many outcomes to one ledger commit,
instead of making each caller wait for a second fsync.

What keeps every guarantee while an outcome is held here:

* **A replay in this process** is answered from the held outcome
  (``applied``, ``replayed: true``); its proof's ``jti`` is checked unseen and
  written behind, as for any replay of an applied nonce. Nothing runs twice:
  the nonce is claimed in the ledger (``in_progress``, owned by this live
  process), so another process answers ``in_progress`` and never re-runs it.
* **A crash before the settle is durable** (crash point ``settle_behind``)
  leaves the attempt ``in_progress`` with a dead owner. Recovery — at the
  next start, or by any other process of the same ledger — reconciles it from
  the target's stamp: ``applied``, with its ``rows_affected``.
* **A ledger that refuses the write** keeps the outcome held and tries again,
  backing off; closing the Pilot hands what is still held to the Pilot's
  unrecorded observations (:class:`~marque.pilot.recording.Recorder`), so the
  process leaves a trace and another one reconciles them from their stamps at once.

Only applied writes whose result is nothing but a row count go behind. Reads
(and anything returning rows) settle before the answer, since their result
exists nowhere else; so do Effect Sets, failures and uncertain outcomes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from marque.crash import crash_point
from marque.errors import MarqueError
from marque.ledger import AttemptRecord, Observed
from marque.ledger.roles import OutcomesRole
from marque.outcome import Status
from marque.pilot.context import PilotContext
from marque.pilot.recording import Recorder
from marque.pilot.reporting import Reporting
from marque.pilot.stream import Observation, recorded_event
from marque.write_behind import WriteBehind

log = logging.getLogger(__name__)

#: How long a held outcome waits for a claim to carry it before the thread records it.
GATHER_SECONDS = 0.01
#: At most this many held outcomes ride on one claim.
CARRY_LIMIT = 64


class _Held:
    """An applied write answered and not yet recorded."""

    __slots__ = ("observation", "events", "claimed", "settled_at")

    def __init__(self, observation: Observation, events: list[dict[str, Any]],
                 claimed: AttemptRecord, settled_at: float) -> None:
        self.observation = observation
        self.events = events
        self.claimed = claimed
        self.settled_at = settled_at

    @property
    def record(self) -> AttemptRecord:
        """What the caller was told, and what a replay is told until the settle lands
        (made when asked: most outcomes are recorded before anyone asks)."""
        return replace(self.claimed, status=Status.APPLIED,
                       rows_affected=self.observation.rows_affected, error=None,
                       settled_at=self.settled_at)


class SettleBehind:
    """Applied writes answered but not yet recorded, and the thread that records them.

    A held outcome is recorded by whichever comes first: the next claim's transaction
    (:meth:`carry`, so it shares that commit and costs no fsync of its own), or this
    thread, :data:`GATHER_SECONDS` after it was held, many to one transaction.
    """

    def __init__(self, context: PilotContext, reporting: Reporting,
                 recorder: Recorder) -> None:
        self._ctx = context
        self._reporting = reporting
        self._recorder = recorder
        self._held: dict[tuple[str, str], _Held] = {}
        #: Taken by a claim whose transaction is writing them now.
        self._carrying: dict[tuple[str, str], _Held] = {}
        self._lock = threading.Lock()
        # One flush at a time: a replay's flush and the thread's must not record twice.
        self._flushing = threading.Lock()
        # Held outcomes are retried, never dropped: an answered outcome stays answered.
        self._writer = WriteBehind(self.flush, name="marque-settler",
                                   what="recording applied outcomes behind their answer",
                                   gather_seconds=GATHER_SECONDS,
                                   retry_on=(MarqueError, OSError))

    @staticmethod
    def takes(observation: Observation) -> bool:
        """Whether this observation may be answered before it is recorded."""
        change = observation.target_attempt.change
        return (observation.status is Status.APPLIED and observation.result is None
                and change is not None and not change.read_only)

    def hold(self, observation: Observation, events: list[dict[str, Any]],
             claimed: AttemptRecord) -> None:
        """Keep ``observation`` for the settler: from now on the attempt is ``applied`` to
        whoever asks (:meth:`held`), until its settle lands in the ledger."""
        held = _Held(observation, events, claimed, self._ctx.clock())
        with self._lock:
            self._held[(claimed.marque_id, claimed.nonce)] = held
        self._writer.wake()

    def _find(self, marque_id: str, nonce: str) -> _Held | None:
        key = (marque_id, nonce)
        with self._lock:
            return self._held.get(key) or self._carrying.get(key)

    def held(self, marque_id: str, nonce: str) -> AttemptRecord | None:
        """The answered outcome of a nonce whose settle has not landed yet, if any."""
        held = self._find(marque_id, nonce)
        return None if held is None else held.record

    def holds(self, marque_id: str, nonce: str, attempt: int) -> bool:
        """Whether that very attempt is answered here and not yet recorded."""
        held = self._find(marque_id, nonce)
        return held is not None and held.claimed.attempt == attempt

    def carry(self) -> tuple[dict[tuple[str, str], _Held], tuple[Observed, ...]]:
        """Take what is held for a claim's transaction to record; hand the first value
        back to :meth:`carried` once that transaction has ended."""
        with self._lock:
            taken = dict(list(self._held.items())[:CARRY_LIMIT])
            for key in taken:
                del self._held[key]
            self._carrying.update(taken)
        return taken, tuple(self._observed(held) for held in taken.values())

    def carried(self, taken: dict[tuple[str, str], _Held], *, committed: bool) -> None:
        """The claim's transaction ended: recorded, or (``committed`` false) held again."""
        if not taken:
            return
        with self._lock:
            for key, held in taken.items():
                if self._carrying.get(key) is held:
                    del self._carrying[key]
                if not committed:
                    self._held.setdefault(key, held)
        if committed:
            crash_point("after_outcome_recorded")  # as on the path that records first
            wanted = self._reporting.wanted
            if not wanted.is_set():  # set already: the reporter has yet to look (and will)
                wanted.set()
        else:
            self._writer.wake()

    def _observed(self, held: _Held) -> Observed:
        target_attempt = held.observation.target_attempt
        now = self._ctx.clock()
        recorded = recorded_event(target_attempt, Status.APPLIED, now)
        return Observed(target_attempt.marque_id, target_attempt.nonce, target_attempt.number,
                        Status.APPLIED, now=now, cause="execution",
                        rows_affected=held.observation.rows_affected,
                        events=[*held.events, recorded])

    def flush(self) -> None:
        """Record everything held now, in one ledger transaction; raises what the ledger
        raised (the outcomes stay held)."""
        ledger: OutcomesRole = self._ctx.ledger
        with self._flushing:
            taken, observed = self.carry()
            if not taken:
                return
            try:
                crash_point("settle_behind")
                ledger.observe_all(list(observed))
            except BaseException:
                self.carried(taken, committed=False)
                raise
            self.carried(taken, committed=True)

    def stop(self) -> None:
        """Stop the thread and record what is still held; what the ledger still refuses
        goes to the Pilot's unrecorded observations (:meth:`Recorder.keep`)."""
        self._writer.stop()
        try:
            self.flush()
        except (MarqueError, OSError):
            with self._lock:
                left = [*self._held.values(), *self._carrying.values()]
                self._held.clear()
            log.warning("%d applied outcomes were not recorded at close; their stamps will "
                        "settle them", len(left), exc_info=True)
            self._recorder.keep([(held.observation, held.events) for held in left])
