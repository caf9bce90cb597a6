"""Webhook endpoints, the outbox and its deliveries: the store's SQL for notifications.

Two rules hold every write here (see ``outbox.py`` for the why):

* **The event moves with the state.** :func:`record_events` runs inside the
  transaction of the request moves it reports, before their logbook entries,
  so the outbox and the requests can never disagree.
* **Compare-and-set on the lease.** An attempt is claimed by ``UPDATE … WHERE
  state = 'pending' AND (lease_until IS NULL OR lease_until <= now)`` and
  finished only ``WHERE lease_owner = ?``; of two processes claiming one
  delivery exactly one gets it.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from marque.errors import NotFound
from marque.harbour.notifications.events import (
    AWAITING_APPROVAL,
    EVENT_VERSION,
    EXECUTED,
    RECONCILIATION,
    event_id,
    event_type,
    may_approve,
    request_summary,
)
from marque.harbour.store.columns import canonical_json, loads
from marque.harbour.store.hooks import StoreHooks
from marque.harbour.store.outbox import (
    Delivery,
    DeliveryState,
    EndpointFigures,
    OutboxEvent,
    WebhookEndpoint,
    delivery_transition,
)
from marque.storage.tx import Tx

#: Logbook entries a transaction appends: ``(kind, actor, subject, body)``.
JournalEntries = list[tuple[str, str, str, dict[str, Any]]]

_ENDPOINT_COLUMNS = "id, url, format, events, principal, secret, created_at, created_by, " \
                    "removed_at"
_REQUEST_FIELDS = ("id", "request_id", "state", "version", "principal", "reason", "pilot_id",
                   "target", "change", "change_cid", "routing", "preview", "checkpoint_cid",
                   "marque_id", "marque_expires_at", "failure", "rolls_back")
_REQUEST_JSON = frozenset({"change", "routing", "preview", "failure"})
_DELIVERY_COLUMNS = ("d.state, d.attempts, d.next_at, d.lease_owner, d.lease_until, "
                     "d.last_status, d.last_error, d.delivered_at, d.updated_at, "
                     "v.id, v.type, v.request, v.data, v.created_at, "
                     + ", ".join(f"e.{c.strip()}" for c in _ENDPOINT_COLUMNS.split(",")))
_DELIVERY_FROM = ("webhook_deliveries d JOIN outbox_events v ON v.id = d.event_id "
                  "JOIN webhook_endpoints e ON e.id = d.endpoint_id")


def _endpoint(row: tuple[Any, ...]) -> WebhookEndpoint:
    return WebhookEndpoint(id=row[0], url=row[1], format=row[2], events=loads(row[3]),
                           principal=row[4], secret=row[5], created_at=row[6],
                           created_by=row[7], removed_at=row[8])


def _delivery(row: tuple[Any, ...]) -> Delivery:
    event = OutboxEvent(id=row[9], type=row[10], request=row[11], data=loads(row[12]),
                        created_at=row[13])
    return Delivery(event=event, endpoint=_endpoint(row[14:]), state=DeliveryState(row[0]),
                    attempts=int(row[1]), next_at=row[2], lease_owner=row[3],
                    lease_until=row[4], last_status=row[5], last_error=row[6],
                    delivered_at=row[7], updated_at=row[8])


def origin(url: str) -> str:
    """``scheme://host[:port]`` of an endpoint URL: what the logbook and the console show
    (a Slack URL's path is itself its credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


# -- writing events with the moves that cause them ---------------------------------------


def record_events(tx: Tx, journal: JournalEntries, now: float, harbour_id: str | None) -> None:
    """Write the events ``journal``'s request moves call for, and their deliveries, in ``tx``.

    Only a move some live endpoint wants becomes an event: with no endpoint configured
    this is one read of the endpoints and nothing else.
    """
    moves = [(actor, subject, body, kind) for _, actor, subject, body in journal
             if (kind := event_type(body.get("from"), body.get("to"))) is not None
             and "version" in body]
    if not moves:
        return
    endpoints = [_endpoint(row) for row in tx.execute(
        f"SELECT {_ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE removed_at IS NULL "
        "ORDER BY created_at, id")]
    wanting = [e for e in endpoints if any(not e.events or kind in e.events
                                           for *_, kind in moves)]
    if not wanting:
        return
    for actor, subject, body, kind in moves:
        row = _request_row(tx, subject)
        if row is None:
            continue
        data = _event_data(tx, kind, row, actor, body, harbour_id)
        receivers = [e for e in wanting if (not e.events or kind in e.events)
                     and (e.principal is None or e.principal in data["recipients"])]
        if not receivers:
            continue
        the_id = event_id(subject, int(body["version"]), kind)
        stored = tx.execute("INSERT INTO outbox_events (id, type, request, data, created_at) "
                            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
                            (the_id, kind, subject, canonical_json(data), now))
        if not stored:
            continue  # this very move was announced already
        for endpoint in receivers:
            tx.execute("INSERT INTO webhook_deliveries (event_id, endpoint_id, state, attempts, "
                       "next_at, created_at, updated_at) VALUES (?, ?, 'pending', 0, ?, ?, ?)",
                       (the_id, endpoint.id, now, now, now))


def _request_row(tx: Tx, id: str) -> dict[str, Any] | None:
    row = tx.one(f"SELECT {', '.join(_REQUEST_FIELDS)} FROM requests WHERE id = ?",
                 (id,))
    if row is None:
        return None
    values = dict(zip(_REQUEST_FIELDS, row, strict=True))
    for name in _REQUEST_JSON:
        values[name] = loads(values[name])
    return values


def _event_data(tx: Tx, kind: str, row: dict[str, Any], actor: str, body: dict[str, Any],
                harbour_id: str | None) -> dict[str, Any]:
    """What an event says: the request as the move left it, who moved it, and to whom the
    event is addressed (``recipients``)."""
    row = {**row, "state": body["to"], "version": int(body["version"])}
    data: dict[str, Any] = {"version": EVENT_VERSION, "harbour_id": harbour_id,
                            "request": request_summary(row), "from": body.get("from"),
                            "to": body["to"], "actor": actor, "reason": body.get("reason")}
    requester = row["principal"]
    if kind == AWAITING_APPROVAL:
        routing = row.get("routing") or {}
        live = tx.execute("SELECT name, roles FROM principals WHERE revoked_at IS NULL "
                          "ORDER BY name")
        approvers = [name for name, roles in live
                     if may_approve(name, loads(roles), requester,
                                    bool(routing.get("self_approval")))]
        data.update(approvers=approvers, approvals_needed=routing.get("approvals"),
                    checkpoint_expires_at=body.get("expires_at"))
        recipients = set(approvers)
    else:
        recipients = {requester}
        if row.get("checkpoint_cid"):
            recipients |= {r[0] for r in tx.execute(
                "SELECT approver FROM resolutions WHERE checkpoint_cid = ?",
                (row["checkpoint_cid"],))}
        if kind == EXECUTED:
            data["executions"] = body.get("executions")
        if kind == RECONCILIATION:
            data["cause"] = body.get("cause")
            recipients |= {name for name, roles in tx.execute(
                "SELECT name, roles FROM principals WHERE revoked_at IS NULL")
                if "admin" in loads(roles)}
    data["recipients"] = sorted(recipients)
    return data


# -- endpoints and deliveries --------------------------------------------------------------


class WebhookRecords(StoreHooks):
    """Endpoint and delivery operations, over the hooks ``sql.SqlHarbourStore`` provides."""

    def add_webhook(self, url: str, *, format: str, events: list[str], secret: str,
                    principal: str | None, actor: str,
                    now: float | None = None) -> WebhookEndpoint:
        at = self._now(now)
        endpoint = WebhookEndpoint(id="wh_" + uuid.uuid4().hex[:20], url=url, format=format,
                                   events=sorted(events), principal=principal, secret=secret,
                                   created_at=at, created_by=actor)
        with self.transaction() as tx:
            tx.execute(f"INSERT INTO webhook_endpoints ({_ENDPOINT_COLUMNS}) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                       (endpoint.id, url, format, canonical_json(endpoint.events), principal,
                        secret, at, actor))
            self._append_tx(tx, "webhook.added", actor, endpoint.id, {
                "id": endpoint.id, "origin": origin(url), "format": format,
                "events": endpoint.events, "principal": principal}, at)
        return endpoint

    def remove_webhook(self, endpoint_id: str, *, actor: str,
                       now: float | None = None) -> WebhookEndpoint:
        at = self._now(now)
        with self.transaction() as tx:
            row = tx.one(f"UPDATE webhook_endpoints SET removed_at = ? WHERE id = ? "
                         f"AND removed_at IS NULL RETURNING {_ENDPOINT_COLUMNS}",
                         (at, endpoint_id))
            if row is None:
                raise NotFound(f"no webhook endpoint {str(endpoint_id)[:64]!r} is configured",
                               detail={"id": str(endpoint_id)[:64]})
            delivery_transition(DeliveryState.PENDING, DeliveryState.CANCELLED)
            cancelled = tx.execute(
                "UPDATE webhook_deliveries SET state = 'cancelled', lease_owner = NULL, "
                "lease_until = NULL, updated_at = ? WHERE endpoint_id = ? AND state = 'pending' "
                "RETURNING event_id", (at, endpoint_id))
            self._append_tx(tx, "webhook.removed", actor, endpoint_id, {
                "id": endpoint_id, "origin": origin(row[1]),
                "cancelled_deliveries": len(cancelled)}, at)
        return _endpoint(row)

    def get_webhook(self, endpoint_id: str) -> WebhookEndpoint:
        with self.reading() as tx:
            row = tx.one(f"SELECT {_ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = ?",
                         (endpoint_id,))
        if row is None:
            raise NotFound(f"no webhook endpoint {str(endpoint_id)[:64]!r}",
                           detail={"id": str(endpoint_id)[:64]})
        return _endpoint(row)

    def list_webhooks(self, *, include_removed: bool = False) -> list[WebhookEndpoint]:
        clause = "" if include_removed else " WHERE removed_at IS NULL"
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_ENDPOINT_COLUMNS} FROM webhook_endpoints{clause} "
                              "ORDER BY created_at, id")
        return [_endpoint(row) for row in rows]

    def outbox_events(self, request: str | None = None) -> list[OutboxEvent]:
        clause, params = ("", ()) if request is None else (" WHERE request = ?", (request,))
        with self.reading() as tx:
            rows = tx.execute(f"SELECT id, type, request, data, created_at FROM outbox_events"
                              f"{clause} ORDER BY created_at, id", params)
        return [OutboxEvent(r[0], r[1], r[2], loads(r[3]), r[4]) for r in rows]

    def deliveries(self, *, state: DeliveryState | str | None = None,
                   endpoint_id: str | None = None, limit: int = 100) -> list[Delivery]:
        where, params = [], []
        if state is not None:
            where.append("d.state = ?")
            params.append(DeliveryState(state).value)
        if endpoint_id is not None:
            where.append("d.endpoint_id = ?")
            params.append(endpoint_id)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_DELIVERY_COLUMNS} FROM {_DELIVERY_FROM}{clause} "
                              "ORDER BY d.updated_at DESC, d.event_id DESC LIMIT ?",
                              (*params, int(limit)))
        return [_delivery(row) for row in rows]

    def claim_deliveries(self, owner: str, *, now: float, lease_seconds: float, limit: int,
                         per_endpoint: int | None = None,
                         skip_endpoints: frozenset[str] = frozenset()) -> list[Delivery]:
        skipped = sorted(skip_endpoints)
        not_in = (f" AND endpoint_id NOT IN ({', '.join('?' for _ in skipped)})"
                  if skipped else "")
        share = int(per_endpoint) if per_endpoint is not None else int(limit)
        # A read first: with nothing due (most rounds) no write lock is taken at all.
        with self.reading() as tx:
            due = tx.execute(
                "SELECT event_id, endpoint_id FROM (SELECT event_id, endpoint_id, next_at, "
                "ROW_NUMBER() OVER (PARTITION BY endpoint_id ORDER BY next_at, event_id) AS n "
                "FROM webhook_deliveries WHERE state = 'pending' AND next_at <= ? "
                f"AND (lease_until IS NULL OR lease_until <= ?){not_in} "
                # A delivery written by a move that raced its endpoint's removal (PostgreSQL,
                # READ COMMITTED) stays pending, but is never sent.
                "AND endpoint_id IN (SELECT id FROM webhook_endpoints WHERE removed_at IS NULL)"
                ") due WHERE n <= ? "
                "ORDER BY next_at, event_id, endpoint_id LIMIT ?",
                (now, now, *skipped, share, int(limit)))
        if not due:
            return []
        claimed: list[Delivery] = []
        with self.transaction() as tx:
            for event, endpoint in due:
                won = tx.execute(
                    "UPDATE webhook_deliveries SET attempts = attempts + 1, lease_owner = ?, "
                    "lease_until = ?, updated_at = ? WHERE event_id = ? AND endpoint_id = ? "
                    "AND state = 'pending' AND next_at <= ? "
                    "AND (lease_until IS NULL OR lease_until <= ?) RETURNING attempts",
                    (owner, now + lease_seconds, now, event, endpoint, now, now))
                if won:
                    row = tx.one(f"SELECT {_DELIVERY_COLUMNS} FROM {_DELIVERY_FROM} "
                                 "WHERE d.event_id = ? AND d.endpoint_id = ?", (event, endpoint))
                    assert row is not None  # this transaction holds the row
                    claimed.append(_delivery(row))
        return claimed

    def finish_delivery(self, event_id: str, endpoint_id: str, owner: str, *,
                        delivered: bool, status: int | None, error: str | None,
                        retry_at: float | None, now: float | None = None) -> bool:
        at = self._now(now)
        if delivered:
            to, next_at, delivered_at = DeliveryState.DELIVERED, at, at
        elif retry_at is None:
            to, next_at, delivered_at = DeliveryState.FAILED, at, None
        else:
            to, next_at, delivered_at = DeliveryState.PENDING, float(retry_at), None
        state = delivery_transition(DeliveryState.PENDING, to)
        with self.transaction() as tx:
            moved = tx.execute(
                "UPDATE webhook_deliveries SET state = ?, next_at = ?, lease_owner = NULL, "
                "lease_until = NULL, last_status = ?, last_error = ?, delivered_at = ?, "
                "updated_at = ? WHERE event_id = ? AND endpoint_id = ? AND state = 'pending' "
                "AND lease_owner = ? RETURNING attempts",
                (state.value, next_at, status, error, delivered_at, at, event_id, endpoint_id,
                 owner))
        return bool(moved)

    def delivery_figures(self) -> list[EndpointFigures]:
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT e.id, d.state, COUNT(d.event_id), MAX(d.delivered_at), "
                "MIN(CASE WHEN d.state = 'pending' THEN d.created_at END) "
                "FROM webhook_endpoints e LEFT JOIN webhook_deliveries d "
                "ON d.endpoint_id = e.id WHERE e.removed_at IS NULL "
                "GROUP BY e.id, d.state ORDER BY e.id")
        figures: dict[str, dict[str, Any]] = {}
        for endpoint, state, count, delivered_at, pending_since in rows:
            held = figures.setdefault(endpoint, {"counts": {}, "delivered": None,
                                                 "pending": None})
            if state is not None:
                held["counts"][state] = int(count)
            if delivered_at is not None:
                held["delivered"] = max(held["delivered"] or 0.0, float(delivered_at))
            if pending_since is not None:
                held["pending"] = float(pending_since)
        return [EndpointFigures(endpoint_id=k, counts=v["counts"],
                                last_delivered_at=v["delivered"], oldest_pending_at=v["pending"])
                for k, v in figures.items()]
