"""``marque harbour webhooks …``: configuring endpoints on the Harbourmaster's own machine.

Like ``harbour principal``, these run offline against the home's store, with the
home's files as the credential, and every change lands in the logbook with the
acting operator as its actor. A secret Marque makes is returned by :func:`add`
this once; one read from a file is never returned; no listing ever holds one.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from marque.errors import InvalidInput, WebhookDeliveryFailed
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.notifications.delivery import DeliveryPolicy, post
from marque.harbour.notifications.endpoints import (
    check_events,
    check_format,
    check_secret,
    check_url,
    new_secret,
)
from marque.harbour.notifications.events import EVENT_VERSION, TEST
from marque.harbour.setup import operator
from marque.harbour.store.outbox import OutboxEvent, WebhookEndpoint


def read_secret(path: Path) -> str:
    """A Standard Webhooks secret from a file (its one line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InvalidInput(f"secret file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read secret file {path}: {exc}") from exc
    return check_secret(text)


def add(home: str | os.PathLike[str], url: str, *, format: str = "json",
        events: list[str] | tuple[str, ...] = (), principal: str | None = None,
        secret_file: Path | None = None, allow_http: bool = False) -> dict[str, Any]:
    """Configure an endpoint; returns it, with ``secret`` when Marque made it (shown once)."""
    check_url(url, allow_http=allow_http)
    check_format(format)
    wanted = check_events(list(events))
    secret = new_secret() if secret_file is None else read_secret(secret_file)
    store = open_home_store(HarbourHome(home))
    try:
        if principal is not None:
            held = store.get_principal(principal)  # NotFound for a name never added
            if held.revoked:
                raise InvalidInput(f"principal {principal!r} is revoked: notifications "
                                   "addressed to it would go to nobody")
        endpoint = store.add_webhook(url, format=format, events=wanted, secret=secret,
                                     principal=principal, actor=operator())
    finally:
        store.close()
    shown = endpoint.public()
    if secret_file is None:
        shown["secret"] = secret
    return shown


def list_all(home: str | os.PathLike[str], *, include_removed: bool = False
             ) -> list[dict[str, Any]]:
    """The endpoints, each with its deliveries by state (never a secret)."""
    store = open_home_store(HarbourHome(home))
    try:
        endpoints = store.list_webhooks(include_removed=include_removed)
        figures = {f.endpoint_id: f for f in store.delivery_figures()}
    finally:
        store.close()
    shown = []
    for endpoint in endpoints:
        figure = figures.get(endpoint.id)
        shown.append({**endpoint.public(),
                      "deliveries": {} if figure is None else figure.counts,
                      "last_delivered_at": None if figure is None
                      else figure.last_delivered_at})
    return shown


def remove(home: str | os.PathLike[str], endpoint_id: str) -> dict[str, Any]:
    """Stop an endpoint; its pending deliveries are cancelled."""
    store = open_home_store(HarbourHome(home))
    try:
        return store.remove_webhook(endpoint_id, actor=operator()).public()
    finally:
        store.close()


def probe_event(endpoint: WebhookEndpoint, harbour_id: str, at: float) -> OutboxEvent:
    """A ``webhook.test`` event for ``endpoint`` (a fresh id: never written to the outbox)."""
    return OutboxEvent(id="evt_test_" + uuid.uuid4().hex[:24], type=TEST, request=None,
                       data={"version": EVENT_VERSION, "harbour_id": harbour_id,
                             "endpoint": endpoint.id,
                             "message": "a test notification from `marque harbour webhooks "
                                        "test`: the endpoint receives and verifies Marque's "
                                        "signed events"},
                       created_at=at)


def send_test(home: str | os.PathLike[str], endpoint_id: str, *,
              console_url: str | None = None) -> dict[str, Any]:
    """Post one signed ``webhook.test`` event to an endpoint now, and say how it answered;
    ``webhook_delivery_failed`` when it did not accept it (nothing is stored either way)."""
    store = open_home_store(HarbourHome(home))
    try:
        endpoint = store.get_webhook(endpoint_id)
        harbour_id = store.harbour_id
    finally:
        store.close()
    if endpoint.removed_at is not None:
        raise InvalidInput(f"webhook endpoint {endpoint_id} was removed")
    event = probe_event(endpoint, harbour_id, time.time())
    policy = DeliveryPolicy()
    with httpx.Client(timeout=policy.timeout, follow_redirects=False) as client:
        result = post(client, endpoint, event, console_url, time.time())
    shown = {"id": endpoint.id, "url": endpoint.url, "webhook_id": event.id,
             "status": result.status, "delivered": result.delivered}
    if not result.delivered:
        raise WebhookDeliveryFailed(
            f"webhook endpoint {endpoint.id} did not accept the test event: {result.error}",
            detail={**shown, "error": result.error})
    return shown
