"""The Notifications page (admins): each webhook endpoint, its deliveries, and what failed.

Read from the store, so every ``harbour serve`` process sharing it shows the same.
A delivery still being retried is shown as *retrying*, with its attempts, its last
error and when it is tried next — never as failed — and one that ended ``failed``
(still refused past the give-up age) says what to do. An endpoint's URL is shown by its
origin only: a Slack URL's path is itself the credential that posts to its channel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marque.errors import Forbidden
from marque.harbour.principals import Principal, Role
from marque.harbour.store.outbox import Delivery, DeliveryState
from marque.harbour.store.webhook_sql import origin

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["notifications_view"]

#: Deliveries listed in each of the page's tables.
SHOWN = 50


def _delivery(delivery: Delivery) -> dict[str, Any]:
    return {"event_id": delivery.event.id, "type": delivery.event.type,
            "request": delivery.event.request, "endpoint": delivery.endpoint.id,
            "attempts": delivery.attempts, "next_at": delivery.next_at,
            "last_status": delivery.last_status, "last_error": delivery.last_error,
            "updated_at": delivery.updated_at, "created_at": delivery.event.created_at,
            "state": delivery.state.value}


def notifications_view(hm: Harbourmaster, principal: Principal) -> dict[str, Any]:
    """The page's content: endpoints with their figures, deliveries being retried, and
    deliveries that ended failed, newest first. Admins only."""
    if not principal.has(Role.ADMIN):
        raise Forbidden("the notifications page is for an admin")
    store = hm.store
    figures = {f.endpoint_id: f for f in store.delivery_figures()}
    endpoints = []
    for endpoint in store.list_webhooks():
        figure = figures.get(endpoint.id)
        counts = {} if figure is None else figure.counts
        endpoints.append({**endpoint.public(), "origin": origin(endpoint.url),
                          "counts": {state.value: counts.get(state.value, 0)
                                     for state in DeliveryState},
                          "last_delivered_at": None if figure is None
                          else figure.last_delivered_at,
                          "oldest_pending_at": None if figure is None
                          else figure.oldest_pending_at})
    retrying = [_delivery(d) for d in store.deliveries(state=DeliveryState.PENDING,
                                                       limit=SHOWN * 4) if d.attempts > 0]
    failed = [_delivery(d) for d in store.deliveries(state=DeliveryState.FAILED, limit=SHOWN)]
    return {"endpoints": endpoints, "retrying": retrying[:SHOWN], "failed": failed,
            "now": hm.clock()}
