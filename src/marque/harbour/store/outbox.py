"""The store's side of notifications: webhook endpoints, the outbox and its deliveries.

An *event* is written in the same transaction as the request move it reports
(``webhook_sql.record_events``), together with one *delivery* per endpoint that
wants it, so an event is never lost to a crash between the move and its
announcement. A delivery is claimed for an attempt by a compare-and-set on its
lease (``claim_deliveries``), so several ``harbour serve`` processes sharing one
PostgreSQL store never post the same delivery at the same time; its outcome is
recorded only by the lease's holder (``finish_delivery``). A process that dies
mid-attempt leaves the lease to run out, and the delivery is claimed again:
delivered at least once, every attempt with the event's one id.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any

from marque.harbour.lifecycle import IllegalTransition


class DeliveryState(enum.StrEnum):
    """Where a delivery stands. ``pending`` is retried until it is ``delivered``, until it
    has failed for longer than its endpoint's give-up age (``failed``), or until its
    endpoint is removed (``cancelled``); the last three never change again."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The one transition table of a delivery: a pending delivery is retried (it stays
#: pending, with a later ``next_at``) or ends one of three ways.
DELIVERY_TRANSITIONS = frozenset({
    (DeliveryState.PENDING, DeliveryState.PENDING),
    (DeliveryState.PENDING, DeliveryState.DELIVERED),
    (DeliveryState.PENDING, DeliveryState.FAILED),
    (DeliveryState.PENDING, DeliveryState.CANCELLED),
})


def delivery_transition(current: DeliveryState, to: DeliveryState) -> DeliveryState:
    """``to``, if a delivery may move there from ``current``; ``IllegalTransition`` if not.
    (The store makes the move by a compare-and-set on ``state = 'pending'``.)"""
    if (current, to) not in DELIVERY_TRANSITIONS:
        raise IllegalTransition(f"a webhook delivery cannot move from {current} to {to}",
                                detail={"from": current.value, "to": to.value})
    return to


@dataclass(frozen=True)
class WebhookEndpoint:
    """A configured endpoint. ``events`` empty means every event type; ``principal`` set
    means only the events addressed to that principal."""

    id: str
    url: str
    format: str
    events: list[str]
    principal: str | None
    secret: str = field(repr=False)
    created_at: float
    created_by: str
    removed_at: float | None = None

    def public(self) -> dict[str, Any]:
        """The endpoint as lists and the console show it: everything but its secret."""
        return {"id": self.id, "url": self.url, "format": self.format,
                "events": list(self.events), "principal": self.principal,
                "created_at": self.created_at, "created_by": self.created_by,
                "removed_at": self.removed_at}


@dataclass(frozen=True)
class OutboxEvent:
    """One event as the outbox holds it: its stable id, type, request and content."""

    id: str
    type: str
    request: str | None
    data: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class Delivery:
    """One event's delivery to one endpoint, and how its attempts went."""

    event: OutboxEvent
    endpoint: WebhookEndpoint
    state: DeliveryState
    attempts: int
    next_at: float
    lease_owner: str | None
    lease_until: float | None
    last_status: int | None
    last_error: str | None
    delivered_at: float | None
    updated_at: float


@dataclass(frozen=True)
class EndpointFigures:
    """An endpoint's deliveries by state, and its last success and failure."""

    endpoint_id: str
    counts: dict[str, int]
    last_delivered_at: float | None
    oldest_pending_at: float | None


class NotificationStore(abc.ABC):
    """Webhook endpoints and the outbox: part of every Harbourmaster store."""

    @abc.abstractmethod
    def add_webhook(self, url: str, *, format: str, events: list[str], secret: str,
                    principal: str | None, actor: str,
                    now: float | None = None) -> WebhookEndpoint:
        """Configure an endpoint (its inputs checked by the caller); writes ``webhook.added``
        (never the secret). Events written from now on are delivered to it."""

    @abc.abstractmethod
    def remove_webhook(self, endpoint_id: str, *, actor: str,
                       now: float | None = None) -> WebhookEndpoint:
        """Stop an endpoint: its pending deliveries are ``cancelled`` in the same
        transaction; writes ``webhook.removed``. ``NotFound`` for an unknown or removed id."""

    @abc.abstractmethod
    def get_webhook(self, endpoint_id: str) -> WebhookEndpoint:
        """An endpoint, removed or not; ``NotFound`` if there never was one."""

    @abc.abstractmethod
    def list_webhooks(self, *, include_removed: bool = False) -> list[WebhookEndpoint]:
        """The endpoints, oldest first."""

    @abc.abstractmethod
    def outbox_events(self, request: str | None = None) -> list[OutboxEvent]:
        """The events written, oldest first (optionally those of one request)."""

    @abc.abstractmethod
    def deliveries(self, *, state: DeliveryState | str | None = None,
                   endpoint_id: str | None = None, limit: int = 100) -> list[Delivery]:
        """Deliveries, most recently changed first, optionally of one state and endpoint."""

    @abc.abstractmethod
    def claim_deliveries(self, owner: str, *, now: float, lease_seconds: float, limit: int,
                         per_endpoint: int | None = None,
                         skip_endpoints: frozenset[str] = frozenset()) -> list[Delivery]:
        """Claim up to ``limit`` due pending deliveries for one attempt each (oldest due
        first, at most ``per_endpoint`` of any one endpoint, none of ``skip_endpoints``):
        each by a compare-and-set that counts the attempt and leases it to ``owner`` until
        ``now + lease_seconds``. A delivery another owner holds an unexpired lease on is
        never claimed. Nothing due is answered by one read, without a write."""

    @abc.abstractmethod
    def finish_delivery(self, event_id: str, endpoint_id: str, owner: str, *,
                        delivered: bool, status: int | None, error: str | None,
                        retry_at: float | None, now: float | None = None) -> bool:
        """Record the attempt ``owner`` holds the lease of: ``delivered``, else pending
        again from ``retry_at`` (None: it ends ``failed``). False, and nothing written,
        when the lease is no longer ``owner``'s (it ran out and was claimed again, or the
        endpoint was removed)."""

    @abc.abstractmethod
    def delivery_figures(self) -> list[EndpointFigures]:
        """Every configured (not removed) endpoint's deliveries by state, in one query
        whatever their number."""
