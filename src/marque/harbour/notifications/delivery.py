"""Posting the outbox: every delivery at least once, signed, retried with backoff.

A :class:`Deliverer` runs in each ``harbour serve`` process. Each round claims
the deliveries that are due (a compare-and-set on each one's lease, so two
processes on one PostgreSQL store never post the same one at once) and hands
them to its own small pool of threads, so a round never waits on an endpoint:
a slow or dead endpoint holds at most :attr:`DeliveryPolicy.per_endpoint`
threads and never blocks a request, nor another endpoint, nor the next round.

An attempt succeeds on a 2xx answer. Anything else — another status, a
redirect (never followed), a timeout, a refused connection — is retried after
``first_delay`` doubled per attempt, up to ``max_delay``; a delivery still
failing ``give_up_after`` seconds after its event was written ends ``failed``
and is shown as such (console, ``/metrics``), never silently dropped. A process
that dies mid-attempt leaves its lease to run out; the delivery is then claimed
again, by any process, with the same ``webhook-id``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from marque.harbour.notifications.formats import render
from marque.harbour.notifications.signing import signed_headers
from marque.harbour.store.base import HarbourStore
from marque.harbour.store.outbox import Delivery, OutboxEvent, WebhookEndpoint

log = logging.getLogger(__name__)

#: What an attempt came to, as the per-process counter names it.
DELIVERED, RETRYING, GAVE_UP, LEASE_LOST = "delivered", "retrying", "gave_up", "lease_lost"


@dataclass(frozen=True)
class DeliveryPolicy:
    """How deliveries are attempted (``harbour serve --webhook-retry/--webhook-give-up``)."""

    #: Seconds before the second attempt; doubled for each one after, up to ``max_delay``.
    first_delay: float = 2.0
    max_delay: float = 600.0
    #: Seconds after its event was written that a delivery still failing ends ``failed``.
    give_up_after: float = 3 * 86_400.0
    #: One attempt's time limit (connect, send, answer).
    timeout: float = 10.0
    #: Attempts in flight at once, per endpoint and in all.
    per_endpoint: int = 4
    workers: int = 8

    @property
    def lease_seconds(self) -> float:
        """How long a claim keeps others off: well past an attempt's time limit."""
        return self.timeout * 3 + 5.0

    def retry_delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        return float(min(self.max_delay, self.first_delay * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class AttemptResult:
    """One post's answer: a 2xx ``status`` is delivered; else ``error`` says what failed."""

    delivered: bool
    status: int | None
    error: str | None


def post(client: httpx.Client, endpoint: WebhookEndpoint, event: OutboxEvent,
         console_url: str | None, at: float) -> AttemptResult:
    """Post one signed attempt of ``event`` to ``endpoint`` (never following a redirect)."""
    body = render(event, endpoint.format, console_url)
    headers = signed_headers(endpoint.secret, event.id, body, at)
    headers["user-agent"] = "marque-harbour-webhooks"
    try:
        answer = client.post(endpoint.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return AttemptResult(False, None, f"{type(exc).__name__}: {exc}" if str(exc)
                             else type(exc).__name__)
    if 200 <= answer.status_code < 300:
        return AttemptResult(True, answer.status_code, None)
    note = " (redirects are not followed)" if answer.is_redirect else ""
    return AttemptResult(False, answer.status_code,
                         f"HTTP {answer.status_code} {answer.reason_phrase}{note}".strip())


def new_client(policy: DeliveryPolicy) -> httpx.Client:
    """The HTTP client deliveries use: the policy's time limit, no redirects."""
    return httpx.Client(timeout=policy.timeout, follow_redirects=False)


class Deliverer:
    """One process's delivery of the outbox (see the module docstring)."""

    def __init__(self, store: HarbourStore, *, console_url: str | None,
                 policy: DeliveryPolicy | None = None,
                 clock: Callable[[], float] = time.time,
                 on_attempt: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.console_url = console_url
        self.policy = policy or DeliveryPolicy()
        self.clock = clock
        self._on_attempt = on_attempt or (lambda outcome: None)
        self._client = new_client(self.policy)
        self._pool = ThreadPoolExecutor(self.policy.workers,
                                        thread_name_prefix="marque-webhooks")
        self._lock = threading.Lock()  # guards only the in-flight counts below
        self._in_flight: dict[str, int] = {}
        self._owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def round(self) -> int:
        """Claim what is due and start its attempts; how many were started. An endpoint
        with attempts still in flight sits the round out: it never holds more than
        ``per_endpoint`` threads."""
        with self._lock:
            busy = frozenset(self._in_flight)
            room = self.policy.workers - sum(self._in_flight.values())
        if room <= 0:
            return 0
        owner = f"{self._owner}-{uuid.uuid4().hex[:8]}"
        claimed = self.store.claim_deliveries(owner, now=self.clock(),
                                              lease_seconds=self.policy.lease_seconds,
                                              limit=room, per_endpoint=self.policy.per_endpoint,
                                              skip_endpoints=busy)
        for delivery in claimed:
            with self._lock:
                held = self._in_flight.get(delivery.endpoint.id, 0)
                self._in_flight[delivery.endpoint.id] = held + 1
            self._pool.submit(self._attempt, delivery, owner)
        return len(claimed)

    def _attempt(self, delivery: Delivery, owner: str) -> None:
        try:
            result = post(self._client, delivery.endpoint, delivery.event, self.console_url,
                          self.clock())
            self._finish(delivery, owner, result)
        except Exception:  # a store fault: the lease runs out and the delivery is retried
            log.exception("webhook delivery %s to %s", delivery.event.id, delivery.endpoint.id)
        finally:
            with self._lock:
                left = self._in_flight.get(delivery.endpoint.id, 1) - 1
                if left > 0:
                    self._in_flight[delivery.endpoint.id] = left
                else:
                    self._in_flight.pop(delivery.endpoint.id, None)

    def _finish(self, delivery: Delivery, owner: str, result: AttemptResult) -> None:
        now = self.clock()
        retry_at: float | None = None
        if not result.delivered:
            retry_at = now + self.policy.retry_delay(delivery.attempts)
            if retry_at - delivery.event.created_at > self.policy.give_up_after:
                retry_at = None
        kept = self.store.finish_delivery(delivery.event.id, delivery.endpoint.id, owner,
                                          delivered=result.delivered, status=result.status,
                                          error=result.error, retry_at=retry_at, now=now)
        outcome = (DELIVERED if result.delivered else RETRYING if retry_at is not None
                   else GAVE_UP) if kept else LEASE_LOST
        if not result.delivered:
            log.info("webhook %s to %s: attempt %d failed (%s)", delivery.event.id,
                     delivery.endpoint.id, delivery.attempts, result.error)
        self._on_attempt(outcome)

    def close(self) -> None:
        """Let attempts in progress finish (each within the policy's time limit), then stop."""
        self._pool.shutdown(wait=True)
        self._client.close()
