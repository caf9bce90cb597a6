"""Requests and findings in ``/metrics``, read from the store at scrape time.

Requests by state come from one count-by-state query
(:meth:`~marque.harbour.store.base.HarbourStore.count_requests`), so a scrape
costs the same whatever the number of requests held. Findings are counted from
the logbook, so every process of a scaled-out Harbourmaster reports the same
monotonic totals; the logbook only grows, so each scrape reads just the
findings after the last one seen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from marque.errors import MarqueError
from marque.harbour.lifecycle import RequestState
from marque.harbour.store.base import HarbourStore

__all__ = ["StoreFigures"]

_FINDING_PREFIX = "finding."
#: Findings read per logbook page while catching up.
_FINDINGS_PAGE = 1000


class StoreFigures:
    """A Prometheus collector: ``marque_harbour_requests{state}`` (every state, zeros
    included), ``marque_harbour_approvals_waiting`` and
    ``marque_harbour_findings_total{kind}``."""

    def __init__(self, store: HarbourStore) -> None:
        self._store = store
        self._lock = threading.Lock()  # one scrape at a time advances the cursor
        self._findings_after = 0
        self._findings: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        """The figures now; none at all when the store cannot be read (never wrong ones)."""
        try:
            counts = {state.value: 0 for state in RequestState}
            counts.update(self._store.count_requests())
            findings = self._count_findings()
        except MarqueError:
            return  # the store is away: no figures rather than wrong ones
        requests = GaugeMetricFamily("marque_harbour_requests", "Requests held, by state",
                                     labels=["state"])
        for state, count in sorted(counts.items()):
            requests.add_metric([state], count)
        yield requests
        waiting = GaugeMetricFamily("marque_harbour_approvals_waiting",
                                    "Requests whose Checkpoint awaits approval")
        waiting.add_metric([], counts.get(RequestState.AWAITING_APPROVAL.value, 0))
        yield waiting
        total = CounterMetricFamily("marque_harbour_findings", "Findings logged, by kind",
                                    labels=["kind"])
        for kind, count in sorted(findings.items()):
            total.add_metric([kind], count)
        yield total

    def _count_findings(self) -> dict[str, int]:
        with self._lock:
            while True:
                page = self._store.logbook_entries(after=self._findings_after,
                                                   limit=_FINDINGS_PAGE,
                                                   kind_prefix=_FINDING_PREFIX)
                for entry in page:
                    kind = entry.kind[len(_FINDING_PREFIX):]
                    self._findings[kind] = self._findings.get(kind, 0) + 1
                    self._findings_after = entry.seq
                if len(page) < _FINDINGS_PAGE:
                    return dict(self._findings)
