"""The Pilot: one facade over the parts that run and settle marques (DESIGN §3).

:func:`marque.pilot.open_pilot` builds a :class:`~marque.pilot.context.PilotContext`
(ledger, targets, trusted keys, settings, process registry, logbook, clock) and a
:class:`Pilot` wires its parts over it, each given only the context and the parts
it calls:

* :class:`~marque.pilot.reporting.Reporting` — the outbox to the logbook and sinks;
* :class:`~marque.pilot.recording.Recorder` — what an execution observed, durably;
* :class:`~marque.pilot.continuity.Continuity` — the targets' stamps against the ledger;
* :class:`~marque.pilot.reconciliation.Reconciliation` — settling by evidence;
* :class:`~marque.pilot.execution.Execution` — verify, claim, run, record, report;
* :mod:`marque.pilot.effects` — Effect Sets, functions of the context.

The public methods here only delegate; nothing below this module imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from marque.errors import Indeterminate, MarqueError
from marque.ledger import AttemptRecord, Ledger
from marque.logbook.embedded import Logbook
from marque.outcome import Outcome, Status
from marque.pilot.context import PilotContext, PilotOptions
from marque.pilot.continuity import Continuity
from marque.pilot.execution import Execution
from marque.pilot.processes import ProcessRegistry
from marque.pilot.reconciliation import Reconciliation
from marque.pilot.recording import Recorder
from marque.pilot.reporting import Reporting, ReportSink
from marque.pilot.settle_behind import SettleBehind
from marque.pilot.stream import EventSink
from marque.target import Target
from marque.token import Marque, TrustedKeys


class Pilot:
    """Executes marques against its targets, through its ledger."""

    def __init__(self, context: PilotContext) -> None:
        self.context = context
        self.reporting = Reporting(context)
        self.recorder = Recorder(context)
        self.continuity = Continuity(context)
        self.reconciliation = Reconciliation(context, self.recorder, self.reporting)
        self.execution = Execution(context, continuity=self.continuity,
                                   reconciliation=self.reconciliation,
                                   recorder=self.recorder, reporting=self.reporting)
        self._workers: list[Any] = []

    # -- what it works with (the context) -----------------------------------------------

    @property
    def ledger(self) -> Ledger:
        return self.context.ledger

    @property
    def targets(self) -> dict[str, Target]:
        return self.context.targets

    @property
    def trusted(self) -> TrustedKeys:
        return self.context.trusted

    @property
    def options(self) -> PilotOptions:
        return self.context.options

    @property
    def processes(self) -> ProcessRegistry:
        return self.context.processes

    @property
    def logbook(self) -> Logbook | None:
        # open_pilot gives the context a Logbook; the parts need only its writing side.
        return cast("Logbook | None", self.context.logbook)

    @logbook.setter
    def logbook(self, logbook: Logbook | None) -> None:
        self.context.logbook = logbook

    @property
    def clock(self) -> Callable[[], float]:
        return self.context.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.context.clock = clock

    @property
    def pilot_id(self) -> str:
        return self.context.pilot_id

    @property
    def incarnation(self) -> str:
        return self.context.incarnation

    @property
    def target_ids(self) -> dict[str, str]:
        """The identity each target name stands for in the ledger."""
        return self.context.target_ids

    # -- what its parts found -------------------------------------------------------------

    @property
    def continuity_unchecked(self) -> set[str]:
        """Targets whose stamps the continuity check could not read yet (DESIGN §5)."""
        return self.continuity.unchecked

    @property
    def continuity_errors(self) -> dict[str, MarqueError]:
        """Why each unchecked target could not be read."""
        return self.continuity.errors

    @property
    def targets_replaced(self) -> dict[str, dict[str, Any]]:
        """The target names found pointing at another database, with the finding."""
        return self.continuity.replaced_targets

    @property
    def report_sinks(self) -> list[ReportSink]:
        """Where reports go besides the logbook (see :mod:`marque.pilot.harbour_link`)."""
        return self.reporting.sinks

    @property
    def report_wanted(self) -> threading.Event:
        """Set when the outbox has something new (for a background reporter)."""
        return self.reporting.wanted

    @property
    def settler(self) -> SettleBehind | None:
        """Applied writes answered before their outcome is recorded (long-running Pilots
        with ``settle_write_behind``; see :mod:`marque.pilot.settle_behind`)."""
        return self.execution.settler

    @settler.setter
    def settler(self, settler: SettleBehind | None) -> None:
        self.execution.settler = settler

    # -- the execution path ---------------------------------------------------------------

    def verify(self, token: str, proof: str | None, nonce: str) -> tuple[Marque, str]:
        """Step 1: the marque and its proof of possession; returns the marque and proof jti
        (see :meth:`marque.pilot.execution.Execution.verify`). Refusals claim nothing."""
        return self.execution.verify(token, proof, nonce)

    def execute(
        self, token: str, proof: str | None, nonce: str, on_event: EventSink | None = None
    ) -> Outcome:
        """Run a marque once for ``nonce``; a repeat returns the recorded outcome.

        Refusals raise their typed error. Every other result — applied, not
        applied, indeterminate, in progress — is an :class:`Outcome`.
        """
        return self.execution.execute(token, proof, nonce, on_event)

    def record_unrecorded(self) -> list[dict[str, Any]]:
        """Record the observations the ledger missed while it was away; what changed."""
        return self.recorder.record_unrecorded()

    def target_id_for(self, target: str, marque_id: str, nonce: str) -> str | None:
        """The identity of the database a nonce's attempts on ``target`` were sent to."""
        return self.context.target_id_for(target, marque_id, nonce)

    # -- recovery, continuity and reporting -----------------------------------------------

    def check_continuity(self) -> dict[str, Any] | None:
        """DESIGN §5: check the targets' stamps against the ledger; see
        :meth:`marque.pilot.continuity.Continuity.check`. Returns the finding, or None."""
        return self.continuity.check()

    def recover(self) -> list[dict[str, Any]]:
        """Settle what evidence can settle; returns what changed (see
        :meth:`marque.pilot.reconciliation.Reconciliation.recover`)."""
        return self.reconciliation.recover()

    def report(self) -> bool:
        """Deliver queued outcome reports to the logbook and sinks; True if all were acked."""
        return self.reporting.report()

    def settle(self, marque_id: str, nonce: str) -> Outcome:
        """Settle one nonce by evidence now (observe, never resend), as a retry of it would:
        a dead owner's attempt, or an indeterminate one, is reconciled; returns the outcome.
        ``NotFound`` / ``NonceReaped`` for a nonce never claimed here."""
        return self.execution.settle(marque_id, nonce)

    # -- Effect Sets (pilot/effects.py) ---------------------------------------------------

    def preview_effects(self, request: Any, target: str) -> Any:
        """Preview an :class:`~marque.effects.request.EffectPreviewRequest` on ``target``:
        the rows read from it, the preview built and stored in the ledger by its
        ``effect_preview_cid`` (an :class:`~marque.effects.preview.EffectPreview`).
        Nothing is claimed, stamped or spent."""
        from marque.pilot.effects import preview_effects

        return preview_effects(self.context, request, target)

    def effect_receipts(self, marque_id: str, nonce: str) -> dict[str, Any]:
        """Every receipt and dispatch row of one Effect Set execution (read-only)."""
        from marque.pilot.effects import execution_receipts

        return execution_receipts(self.context, marque_id, nonce)

    # -- reading --------------------------------------------------------------------------

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
        return self.execution.outcome(marque_id, nonce)

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
        return self.execution.follow(marque_id, nonce, on_event,
                                     poll_seconds=poll_seconds, timeout=timeout)

    def stalled(self, marque_id: str, nonce: str) -> Indeterminate | None:
        """For a nonce recorded ``in_progress``: why its owner can no longer finish it
        (``owner_gone`` or ``lease_expired``), or None while it may. Read-only: settling
        it is ``recover`` (``marque reconcile``) or a retry of the same nonce."""
        return self.execution.stalled(marque_id, nonce)

    # -- lifetime -------------------------------------------------------------------------

    def settle_writes_behind(self) -> SettleBehind:
        """Answer applied writes before they are recorded, from now on: the settler that
        records them just behind (owned by this Pilot, stopped on close)."""
        self.settler = SettleBehind(self.context, self.reporting, self.recorder)
        self.attach(self.settler)
        return self.settler

    def attach(self, worker: Any) -> None:
        """Own a background worker (anything with ``stop()``): stopped first on close."""
        self._workers.append(worker)

    def close(self) -> None:
        """Stop background work; release the ledger, targets, logbook and this run's lock."""
        for worker in reversed(self._workers):
            worker.stop()
        self._workers.clear()
        self.settler = None
        if self.recorder:
            self.recorder.record_unrecorded()  # a last try: the ledger may be back
        for target in self.targets.values():
            target.close()
        self.ledger.close()
        if self.logbook is not None:
            self.logbook.close()
        # Attempts this run leaves claimed but unrecorded: leave it findable as dead, so
        # another process reconciles them from their stamps now, not after their lease.
        self.processes.close(leave_trace=bool(self.recorder))
