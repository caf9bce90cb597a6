"""Reporting: outcomes delivered from the ledger's outbox to the logbook and report sinks.

Every settled outcome is queued in the ledger's outbox in the transaction that
records it. :meth:`Reporting.report` delivers the queue in batches — one logbook
transaction and one ledger transaction per batch — to the local logbook and to
every report sink (a Harbourmaster, :mod:`marque.pilot.harbour_link`). An entry is
acknowledged only once all of them took it; a batch one of them refused stays in
the outbox and is delivered again on the next round, so an outcome reaches every
destination eventually and is never dropped. Each refused round is logged and
counted (:attr:`Reporting.failed_rounds`).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from marque.crash import crash_point
from marque.errors import LedgerUnavailable, MarqueError
from marque.ledger import OutboxEntry
from marque.ledger.roles import OutboxRole
from marque.pilot.context import PilotContext

log = logging.getLogger(__name__)

#: Outcome reports delivered to the logbook per transaction.
REPORT_BATCH = 500


class ReportSink(Protocol):
    """Somewhere outcome reports go besides the local logbook (a Harbourmaster)."""

    def deliver(self, entries: list[OutboxEntry]) -> None:
        """Take the reports (outbox payloads); return only once they are acknowledged."""


class Reporting:
    """Delivers a Pilot's outbox; says when there is news for a background reporter."""

    def __init__(self, context: PilotContext) -> None:
        self._ctx = context
        #: Where reports go besides the logbook; an outbox entry is acknowledged only once
        #: every sink took it (see :mod:`marque.pilot.harbour_link`).
        self.sinks: list[ReportSink] = []
        #: Set when the outbox has something new (for a background reporter).
        self.wanted = threading.Event()
        #: Rounds a destination refused since this Pilot started (each one logged).
        self.failed_rounds = 0

    def report(self) -> bool:
        """Deliver queued outcome reports to the logbook and sinks; True if all were acked."""
        if self._ctx.logbook is None and not self.sinks:
            return False
        try:
            return self._report_batches()
        except LedgerUnavailable:
            return False  # the outbox keeps every report for the next try

    def _report_batches(self) -> bool:
        logbook = self._ctx.logbook
        ledger: OutboxRole = self._ctx.ledger
        while True:
            pending = ledger.outbox_pending(limit=REPORT_BATCH)
            if not pending:
                return True
            try:
                # One logbook transaction and one ledger transaction per batch; a batch a
                # sink refused is appended again next time, and the logbook's key dedups it.
                if logbook is not None:
                    logbook.append_all([(f"execution.{entry.status}", report_key(entry),
                                         entry.payload) for entry in pending])
                for sink in self.sinks:
                    sink.deliver(pending)
            except Exception as exc:  # a destination is unavailable: retried on the next report
                self._refused(exc, len(pending))
                for entry in pending:
                    ledger.outbox_failed(entry)
                return False
            crash_point("before_report_ack")
            ledger.outbox_ack_all(pending, self._ctx.clock())
            if len(pending) < REPORT_BATCH:
                return True

    def _refused(self, exc: Exception, count: int) -> None:
        """A round a destination refused: counted and logged, never dropped."""
        self.failed_rounds += 1
        if isinstance(exc, MarqueError):
            log.warning("%d outcome reports not delivered (%s: %s); they stay in the outbox "
                        "for the next round (%d refused rounds so far)", count, exc.code,
                        exc.message, self.failed_rounds, extra={"code": exc.code})
        else:  # not a refusal any destination documents: the traceback says where it came from
            log.warning("%d outcome reports not delivered (%r); they stay in the outbox for "
                        "the next round (%d refused rounds so far)", count, exc,
                        self.failed_rounds, exc_info=True)


def report_key(entry: OutboxEntry) -> str:
    """The logbook key of an outcome report: one entry per attempt and status."""
    return f"outcome/{entry.marque_id}/{entry.nonce}/{entry.attempt}/{entry.status}"
