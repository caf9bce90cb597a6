"""The Pilot's background work: reporting outcomes, and reconciling what is unsettled.

The reporter delivers the outbox to the logbook off the execution path, so a
caller waits for its own durable outcome but not for the logbook's fsync.

The reconciler exists because a long-running Pilot cannot wait for an operator
to type ``marque reconcile`` after a target outage. It runs
:meth:`Pilot.recover` periodically; while
attempts stay unsettled (the target is unreachable, a lock is held) it waits
longer each round, up to a ceiling, and returns to the base interval as soon as
nothing is left.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from marque.pilot.core import Pilot


def start_background(pilot: Pilot) -> None:
    """Make ``pilot`` a long-running one: outcomes reported by a reporter thread,
    unsettled attempts reconciled by a reconciler thread, and applied writes settled
    behind their answer when its settings allow (``settle_write_behind``)."""
    pilot.options.report_inline = False
    pilot.attach(Reporter(pilot).start())
    pilot.attach(Reconciler(pilot).start())
    if pilot.options.settle_write_behind:
        # Attached last, so stopped first: what it still holds is recorded before the
        # reporter's last round.
        pilot.settle_writes_behind()


class Reconciler:
    """A daemon thread that reconciles a Pilot's unsettled attempts."""

    def __init__(
        self, pilot: Pilot, *, interval: float = 5.0, max_backoff: float = 300.0
    ) -> None:
        self.pilot = pilot
        self.interval = interval
        self.max_backoff = max_backoff
        self.rounds = 0
        self.changes: list[dict[str, Any]] = []
        self.delay = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="marque-reconciler", daemon=True)

    def start(self) -> Reconciler:
        """Start the loop."""
        self._thread.start()
        return self

    def run_once(self) -> float:
        """One round; returns how long to wait before the next."""
        self.changes.extend(self.pilot.recover())
        self.rounds += 1
        unsettled = bool(self.pilot.unsettled())
        self.delay = min(self.delay * 2, self.max_backoff) if unsettled else self.interval
        return self.delay

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.run_once()
            except Exception:  # a ledger hiccup must not kill the loop; try again later
                delay = self.delay = min(self.delay * 2, self.max_backoff)
            self._stop.wait(delay)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and wait for the current round to finish."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


class Reporter:
    """A daemon thread that delivers a Pilot's outbox whenever there is news.

    A round that leaves reports undelivered (the logbook or the Harbourmaster
    away) is retried after a pause that doubles from ``first_backoff`` up to
    ``max_backoff``, until every report is acknowledged; news cuts a pause short.

    Under load (news arrived while the last round ran), the wait before a round
    doubles from ``gather_seconds`` up to ``max_gather_seconds``, so each round's
    logbook and outbox transactions carry more outcomes; the first news after a
    quiet spell is reported ``gather_seconds`` after it. Reports are only later,
    never lost or acknowledged early: an outcome stays unreported in the outbox
    until the logbook (and every sink) took it.
    """

    def __init__(
        self, pilot: Pilot, *, idle_interval: float = 5.0, gather_seconds: float = 0.05,
        max_gather_seconds: float = 0.25, first_backoff: float = 0.25, max_backoff: float = 5.0,
    ) -> None:
        self.pilot = pilot
        self.idle_interval = idle_interval
        # Wait this long after the first news so one logbook transaction (one
        # fsync) carries many outcomes rather than one each.
        self.gather_seconds = gather_seconds
        self.max_gather_seconds = max_gather_seconds
        self.gather = gather_seconds
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.delay = first_backoff
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="marque-reporter", daemon=True)

    def start(self) -> Reporter:
        """Start the loop."""
        self._thread.start()
        return self

    def _loop(self) -> None:
        wanted = self.pilot.report_wanted
        while not self._stop.is_set():
            began = time.monotonic()
            if wanted.wait(self.idle_interval):
                if time.monotonic() - began > self.gather:
                    self.gather = self.gather_seconds  # news after a quiet spell
                wanted.clear()
                self._stop.wait(self.gather)
                # More news while gathering: outcomes keep coming, so the next round
                # waits longer and carries more of them; a lone outcome starts over.
                self.gather = (min(self.gather * 2, self.max_gather_seconds)
                               if wanted.is_set() else self.gather_seconds)
            wanted.clear()
            try:
                delivered = self.pilot.report()
            except Exception:  # the outbox keeps every report for the next round
                delivered = False
            if delivered:
                self.delay = self.first_backoff
                continue
            if self.pilot.report_wanted.wait(self.delay):
                continue  # news: try at once (the pause does not grow)
            self.delay = min(self.delay * 2, self.max_backoff)
            self.pilot.report_wanted.set()  # undelivered reports are news of their own

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after a last delivery round."""
        self._stop.set()
        self.pilot.report_wanted.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.pilot.report()
