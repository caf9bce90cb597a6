"""Notifications in ``/metrics``: deliveries by endpoint and state, and attempts made.

The deliveries' states are read from the store at scrape time, so every process
of a scaled-out Harbourmaster reports the same figures; the attempts counter is
this process's own (each process counts the attempts it made).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from marque.errors import MarqueError
from marque.harbour.store.base import HarbourStore
from marque.harbour.store.outbox import DeliveryState


class _DeliveryFigures:
    def __init__(self, store: HarbourStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        try:
            figures = self._store.delivery_figures()
        except MarqueError:
            return  # the store is away: no figures rather than wrong ones
        deliveries = GaugeMetricFamily(
            "marque_harbour_webhook_deliveries",
            "Webhook deliveries held, by endpoint and state (pending ones are being retried)",
            labels=["endpoint", "state"])
        oldest = GaugeMetricFamily(
            "marque_harbour_webhook_oldest_pending_seconds",
            "Age of the oldest delivery an endpoint has not yet accepted (0: none pending)",
            labels=["endpoint"])
        now = self._clock()
        for figure in figures:
            for state in DeliveryState:
                deliveries.add_metric([figure.endpoint_id, state.value],
                                      figure.counts.get(state.value, 0))
            since = figure.oldest_pending_at
            oldest.add_metric([figure.endpoint_id], 0.0 if since is None
                              else max(0.0, now - since))
        yield deliveries
        yield oldest


class NotificationMetrics:
    """The notification figures of one process's registry."""

    def __init__(self, registry: CollectorRegistry, store: HarbourStore, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.attempts = Counter(
            "marque_harbour_webhook_attempts",
            "Webhook delivery attempts this process made, by what came of them "
            "(delivered, retrying, gave_up, lease_lost)", labelnames=["outcome"],
            registry=registry)
        registry.register(_DeliveryFigures(store, clock))

    def attempted(self, outcome: str) -> None:
        """Count one attempt's outcome."""
        self.attempts.labels(outcome).inc()
