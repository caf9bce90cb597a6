"""Webhook endpoints and the outbox in the store: events move with the state, deliveries are
claimed by compare-and-set on a lease and finished only by their lease's holder."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from marque.cid import cid
from marque.errors import HarbourUnavailable, NotFound
from marque.harbour.notifications.events import event_id
from marque.harbour.store import schema
from marque.harbour.store.base import HarbourStore, StoredRequest
from marque.harbour.store.outbox import DeliveryState

from .conftest import T0, StorePool, all_entries, make_draft, raw_tx

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def add(store: HarbourStore, url: str = "http://127.0.0.1:9/hook", *,
        events: list[str] | None = None, principal: str | None = None,
        now: float = T0) -> str:
    return store.add_webhook(url, format="json", events=events or [], secret=SECRET,
                             principal=principal, actor="cli:op", now=now).id


def sealed(store: HarbourStore, request_id: str = "req-1", *,
           principal: str = "alice") -> tuple[StoredRequest, str]:
    request, _ = store.create_request(make_draft(request_id, principal=principal), now=T0)
    body = {"version": "marque-checkpoint/0.1", "scope": request.logical_request_scope}
    checkpoint_cid = cid(body)
    request = store.seal_checkpoint(
        request.id, request.version, checkpoint_cid=checkpoint_cid, body=body,
        expires_at=T0 + 3600, actor="alice", now=T0 + 1, kind="checkpoint.sealed",
        routing={"outcome": "delegate", "approvals": 1, "config_cid": "sha256:" + "1" * 64},
        preview={"mode": "rollback", "total_rows": 1, "max_rows": 1, "within_max_rows": True,
                 "statements": [{"sql": "UPDATE accounts SET balance = 0", "rows": 1}]})
    return request, checkpoint_cid


def test_a_move_writes_its_event_and_deliveries_in_its_transaction(store: HarbourStore) -> None:
    """Sealing a Checkpoint writes request.awaiting_approval, addressed to the approvers (not
    the requester), with one pending delivery per endpoint; its id derives from the move."""
    store.add_principal("alice", ["requester", "approver"], actor="t", now=T0)
    store.add_principal("bob", ["approver"], actor="t", now=T0)
    store.add_principal("carol", ["auditor"], actor="t", now=T0)
    first, second = add(store), add(store, "http://127.0.0.1:9/other")
    request, _ = sealed(store)
    [event] = store.outbox_events()
    assert event.type == "request.awaiting_approval" and event.request == request.id
    assert event.id == event_id(request.id, request.version, event.type)
    assert event.data["approvers"] == ["bob"] and event.data["recipients"] == ["bob"]
    assert event.data["request"]["state"] == "awaiting_approval"
    assert event.data["request"]["diff"]["total_rows"] == 1
    assert event.data["harbour_id"] == store.harbour_id
    deliveries = store.deliveries()
    assert {d.endpoint.id for d in deliveries} == {first, second}
    assert all(d.state is DeliveryState.PENDING and d.attempts == 0 for d in deliveries)
    kinds = [e.kind for e in all_entries(store)]
    assert kinds.count("webhook.added") == 2 and "checkpoint.sealed" in kinds


def test_no_endpoint_no_event(store: HarbourStore) -> None:
    """Without an endpoint that wants it, a move writes nothing to the outbox."""
    sealed(store)
    assert store.outbox_events() == []
    add(store, events=["request.rejected"])
    sealed(store, "req-2")
    assert store.outbox_events() == []


def test_a_move_that_fails_writes_no_event(store: HarbourStore) -> None:
    """When the move's transaction fails after its event was written (here: the logbook has
    lost its head row, so the append refuses), the event goes with it: nothing announced."""
    add(store)
    request, _ = store.create_request(make_draft(), now=T0)
    with raw_tx(store) as tx:
        tx.execute("DELETE FROM logbook_head")
    with pytest.raises(HarbourUnavailable):
        store.transition(request.id, request.version, "awaiting_approval", actor="t", now=T0)
    assert store.outbox_events() == [] and store.deliveries() == []
    assert store.get_request(request.id).state.value == "preparing"


def test_each_event_of_a_requests_life(store: HarbourStore) -> None:
    """approved (awaiting → prepared), executed (a report that applied), rejected,
    reconciliation; an allowed request's marque is not an approval and says nothing."""
    store.register_pilot("pilot-1", "http://127.0.0.1:1", "inc-1", ["bank"],
                         dialects={"bank": "sqlite"}, now=T0)
    add(store)
    request, _ = sealed(store)
    approved = store.transition(request.id, request.version, "prepared", actor="bob",
                                now=T0 + 2, kind="marque.issued", marque_id="mq_1",
                                marque="a.b.c", marque_expires_at=T0 + 600)
    store.ingest_report({"marque_id": "mq_1", "nonce": "n1", "attempt": 1, "status": "applied",
                         "rows_affected": 1, "error": None, "cause": "executed",
                         "pilot": {"id": "pilot-1", "incarnation": "inc-1"}},
                        actor="pilot-1", now=T0 + 3)
    other, _ = sealed(store, "req-2")
    store.transition(other.id, other.version, "rejected", actor="bob", now=T0 + 4,
                     reason="no")
    allowed, _ = store.create_request(make_draft("req-3"), now=T0)
    allowed = store.transition(allowed.id, 1, "prepared", actor="alice", now=T0 + 5,
                               kind="marque.issued", marque_id="mq_3", marque="a.b.c",
                               marque_expires_at=T0 + 600)
    store.register_pilot("pilot-1", "http://127.0.0.1:1", "inc-2", ["bank"],
                         dialects={"bank": "sqlite"}, now=T0 + 6)
    def types(of: StoredRequest) -> list[str]:
        return [e.type for e in store.outbox_events(of.id)]

    assert types(request) == ["request.awaiting_approval", "request.approved",
                              "request.executed"]
    assert types(other) == ["request.awaiting_approval", "request.rejected"]
    assert types(allowed) == ["request.reconciliation"]
    executed = store.outbox_events(request.id)[2]
    assert executed.data["request"]["state"] == "verified"
    assert executed.data["executions"][0]["status"] == "applied"
    assert approved.state.value == "prepared"


def test_endpoints_choose_events_and_principals(store: HarbourStore) -> None:
    """An events filter keeps an endpoint to those types; a principal's endpoint gets only
    the events addressed to that principal."""
    store.add_principal("alice", ["requester"], actor="t", now=T0)
    store.add_principal("bob", ["approver"], actor="t", now=T0)
    store.add_principal("dave", ["approver"], actor="t", now=T0)
    only_rejected = add(store, events=["request.rejected"])
    bobs = add(store, principal="bob")
    alices = add(store, principal="alice")
    store.revoke_principal("dave", actor="t", now=T0)
    request, _ = sealed(store)
    awaiting = {d.endpoint.id for d in store.deliveries()}
    assert awaiting == {bobs}
    assert store.outbox_events()[0].data["approvers"] == ["bob"]
    store.transition(request.id, request.version, "rejected", actor="bob", now=T0 + 2)
    rejected = {d.endpoint.id for d in store.deliveries() if d.event.type == "request.rejected"}
    assert rejected == {only_rejected, alices}


def test_a_delivery_is_claimed_by_one_owner_at_a_time(store: HarbourStore) -> None:
    """Claims race: each delivery goes to exactly one of several owners; a lease that ran
    out is claimed again, with the same event id, and the stale owner cannot finish it."""
    endpoint = add(store)
    for n in range(6):
        sealed(store, f"req-{n}")
    barrier = threading.Barrier(3)

    def claim(owner: str) -> list[tuple[str, str]]:
        barrier.wait()
        return [(d.event.id, owner) for d in store.claim_deliveries(
            owner, now=T0 + 10, lease_seconds=30, limit=10)]

    with ThreadPoolExecutor(3) as pool:
        results = [row for rows in pool.map(claim, ["a", "b", "c"]) for row in rows]
    assert sorted(e for e, _ in results) == sorted(e.id for e in store.outbox_events())
    assert store.claim_deliveries("d", now=T0 + 20, lease_seconds=30, limit=10) == []
    again = store.claim_deliveries("e", now=T0 + 41, lease_seconds=30, limit=10)
    assert len(again) == 6 and all(d.attempts == 2 for d in again)
    first_event, first_owner = results[0]
    assert not store.finish_delivery(first_event, endpoint, first_owner, delivered=True,
                                     status=200, error=None, retry_at=None, now=T0 + 42)
    assert store.finish_delivery(first_event, endpoint, "e", delivered=True, status=200,
                                 error=None, retry_at=None, now=T0 + 42)
    [done] = store.deliveries(state="delivered")
    assert (done.event.id, done.attempts, done.delivered_at) == (first_event, 2, T0 + 42)


def test_finishing_retries_fails_and_removal_cancels(store: HarbourStore) -> None:
    """A failed attempt is pending again from its retry time (not claimable before it), or
    failed for good; removing the endpoint cancels what is pending, even mid-attempt."""
    endpoint = add(store)
    sealed(store)
    sealed(store, "req-2")
    one, two = store.claim_deliveries("a", now=T0 + 5, lease_seconds=300, limit=10)
    assert store.finish_delivery(one.event.id, endpoint, "a", delivered=False, status=500,
                                 error="HTTP 500", retry_at=T0 + 100, now=T0 + 6)
    assert store.claim_deliveries("b", now=T0 + 50, lease_seconds=30, limit=10) == []
    [retried] = store.claim_deliveries("b", now=T0 + 100, lease_seconds=30, limit=10)
    assert (retried.event.id, retried.attempts, retried.last_status) == (one.event.id, 2, 500)
    assert store.finish_delivery(retried.event.id, endpoint, "b", delivered=False,
                                 status=None, error="connection refused", retry_at=None,
                                 now=T0 + 101)
    [failed] = store.deliveries(state="failed")
    assert failed.last_error == "connection refused"
    figures = {f.endpoint_id: f for f in store.delivery_figures()}[endpoint]
    assert figures.counts == {"failed": 1, "pending": 1}
    store.remove_webhook(endpoint, actor="cli:op", now=T0 + 102)
    assert not store.finish_delivery(two.event.id, endpoint, "a", delivered=True, status=200,
                                     error=None, retry_at=None, now=T0 + 103)
    assert [d.state for d in store.deliveries(state="cancelled")] == [DeliveryState.CANCELLED]
    assert store.list_webhooks() == [] and store.get_webhook(endpoint).removed_at == T0 + 102
    with pytest.raises(NotFound):
        store.remove_webhook(endpoint, actor="cli:op")
    sealed(store, "req-3")
    assert len(store.outbox_events()) == 2  # a removed endpoint wants nothing new


def test_claims_share_out_endpoints(store: HarbourStore) -> None:
    """A caller's busy endpoints are left out of a claim, and no endpoint takes more than
    its share of one, however many of its deliveries are due: others are served."""
    busy, free = add(store), add(store, "http://127.0.0.1:9/free")
    sealed(store)
    claimed = store.claim_deliveries("a", now=T0 + 5, lease_seconds=30, limit=10,
                                     skip_endpoints=frozenset({busy}))
    assert [d.endpoint.id for d in claimed] == [free]
    for n in range(2, 6):
        sealed(store, f"req-{n}")
    shared = store.claim_deliveries("b", now=T0 + 50, lease_seconds=30, limit=10,
                                    per_endpoint=2)
    assert sorted(d.endpoint.id for d in shared) == sorted([busy, busy, free, free])


def test_the_secret_is_kept_but_never_shown(store: HarbourStore) -> None:
    """The store keeps the secret to sign with; the public view and the logbook never hold
    it, nor a URL's path (a Slack URL's path is its credential)."""
    endpoint = store.add_webhook("https://hooks.example.com/services/T0/B0/XYZ",
                                 format="slack", events=[], secret=SECRET, principal=None,
                                 actor="cli:op", now=T0)
    assert store.get_webhook(endpoint.id).secret == SECRET
    assert "secret" not in endpoint.public() and SECRET not in repr(endpoint)
    [entry] = [e for e in all_entries(store) if e.kind == "webhook.added"]
    assert entry.body["origin"] == "https://hooks.example.com"
    assert SECRET not in str(entry.body) and "XYZ" not in str(entry.body)


def test_a_version_8_store_gains_the_outbox(stores: StorePool) -> None:
    """Opening a version-8 store migrates it to LATEST with empty notification tables."""
    location = stores.location()
    old = stores.create_at_version(location, 8)
    request, _ = old.create_request(make_draft(), now=T0)
    old.close()
    store = stores.open(location)
    assert store.schema_version == schema.LATEST
    assert store.list_webhooks() == [] and store.outbox_events() == []
    assert store.get_request(request.id) == request
    add(store)
    store.transition(request.id, request.version, "awaiting_approval", actor="t", now=T0)
    assert [e.type for e in store.outbox_events()] == ["request.awaiting_approval"]


def test_a_removed_endpoints_straggler_is_never_sent(store: HarbourStore) -> None:
    """A delivery written for an endpoint by a move that raced its removal (possible under
    PostgreSQL's READ COMMITTED: the move read the endpoint before the removal committed)
    stays as it was written, and is never claimed."""
    endpoint = add(store)
    sealed(store)
    store.remove_webhook(endpoint, actor="cli:op", now=T0 + 2)
    [event] = store.outbox_events()
    with raw_tx(store) as tx:  # what the racing move left behind
        tx.execute("UPDATE webhook_deliveries SET state = 'pending' WHERE event_id = ?",
                   (event.id,))
    assert store.claim_deliveries("a", now=T0 + 10, lease_seconds=30, limit=10) == []
