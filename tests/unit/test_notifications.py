"""Notifications' pure parts: which moves are announced, ids, endpoint checks, signatures,
formats and backoff."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest

from marque.errors import InvalidInput
from marque.harbour.lifecycle import TRANSITIONS, RequestState
from marque.harbour.notifications.delivery import DeliveryPolicy
from marque.harbour.notifications.endpoints import (
    check_events,
    check_secret,
    check_url,
    new_secret,
)
from marque.harbour.notifications.events import event_id, event_type
from marque.harbour.notifications.formats import render
from marque.harbour.notifications.signing import signed_headers
from marque.harbour.store.outbox import OutboxEvent

S = RequestState
ANNOUNCED = {
    (S.PREPARING, S.AWAITING_APPROVAL): "request.awaiting_approval",
    (S.AWAITING_APPROVAL, S.PREPARED): "request.approved",
    (S.AWAITING_APPROVAL, S.REJECTED): "request.rejected",
    (S.PREPARED, S.VERIFIED): "request.executed",
    (S.EXECUTING, S.VERIFIED): "request.executed",
    (S.RECONCILIATION, S.VERIFIED): "request.executed",
    (S.PREPARED, S.FAILED): "request.executed",
    (S.EXECUTING, S.FAILED): "request.executed",
    (S.RECONCILIATION, S.FAILED): "request.executed",
    (S.PREPARED, S.RECONCILIATION): "request.reconciliation",
    (S.EXECUTING, S.RECONCILIATION): "request.reconciliation",
    (S.VERIFIED, S.RECONCILIATION): "request.reconciliation",
}


def test_exactly_these_moves_are_announced() -> None:
    """Over every move the lifecycle allows, the announced ones and their types are these;
    a denied request (preparing → failed) and an allowed issue are silent."""
    moves = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    announced = {(a, b): kind for a, b in moves
                 if (kind := event_type(a.value, b.value)) is not None}
    assert announced == {k: v for k, v in ANNOUNCED.items() if k in moves}
    assert event_type("preparing", "failed") is None
    assert event_type("preparing", "prepared") is None
    assert event_type("nonsense", "verified") is None


def test_an_events_id_is_its_move() -> None:
    assert event_id("rq_1", 3, "request.approved") == event_id("rq_1", 3, "request.approved")
    assert len({event_id("rq_1", 3, "request.approved"), event_id("rq_1", 4, "request.approved"),
                event_id("rq_2", 3, "request.approved"),
                event_id("rq_1", 3, "request.rejected")}) == 4
    assert event_id("rq_1", 3, "x").startswith("evt_") and len(event_id("rq_1", 3, "x")) == 36


@pytest.mark.parametrize("url", ["https://hooks.example.com/services/a", "http://127.0.0.1:9/x",
                                 "http://localhost/x", "http://[::1]:8000/"])
def test_urls_accepted(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize("url", ["http://hooks.example.com/x", "ftp://example.com/",
                                 "https://u:p@example.com/", "https://example.com/#f",
                                 "https://exa mple.com/", "/relative", "https://", "",
                                 "https://example.com:99999/", "https://x/" + "a" * 2048])
def test_urls_refused(url: str) -> None:
    with pytest.raises(InvalidInput):
        check_url(url)


def test_plain_http_elsewhere_only_when_asked() -> None:
    assert check_url("http://hooks.example.com/x", allow_http=True)


def test_secrets() -> None:
    made = new_secret()
    assert check_secret(made + "\n") == made
    assert len(base64.b64decode(made.removeprefix("whsec_"))) == 32
    for bad in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not*base64",
                "whsec_" + base64.b64encode(b"short").decode(),
                "whsec_" + base64.b64encode(b"x" * 65).decode()):
        with pytest.raises(InvalidInput) as refused:
            check_secret(bad)
        assert bad.removeprefix("whsec_") not in refused.value.message


def test_event_filters() -> None:
    assert check_events(["request.rejected", "request.approved", "request.rejected"]) == [
        "request.approved", "request.rejected"]
    with pytest.raises(InvalidInput):
        check_events(["request.deleted"])


def test_the_signature_is_the_specifications() -> None:
    """Checked by the specification's formula here, and by the standardwebhooks package's
    own verify (which also checks the timestamp)."""
    from standardwebhooks.webhooks import Webhook

    secret, body, now = new_secret(), '{"a":"é"}'.encode(), time.time()
    headers = signed_headers(secret, "evt_1", body, now)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, b"evt_1." + str(int(now)).encode() + b"." + body, hashlib.sha256)
    assert headers["webhook-signature"] == "v1," + base64.b64encode(mac.digest()).decode()
    assert headers["webhook-timestamp"] == str(int(now)) and headers["webhook-id"] == "evt_1"
    assert Webhook(secret).verify(body, headers) == {"a": "é"}


def _event(**data: object) -> OutboxEvent:
    request = {"id": "rq_1", "principal": "a<b>", "pilot_id": "p1", "target": "bank",
               "state": "awaiting_approval", "reason": "fix & go",
               "statements": ["UPDATE t SET x = 1 WHERE y < 2"],
               "diff": {"mode": "rollback", "total_rows": 3, "max_rows": 2,
                        "within_max_rows": False, "statements": [{"rows": 3}],
                        "caveats": []}}
    return OutboxEvent(id="evt_1", type="request.awaiting_approval", request="rq_1",
                       data={"request": request, "approvers": ["bob"], "approvals_needed": 1,
                             **data}, created_at=1_800_000_000.0)


def test_the_slack_message_escapes_and_links() -> None:
    text = json.loads(render(_event(), "slack", "https://hb.example.com/"))["text"]
    assert "a&lt;b&gt;" in text and "fix &amp; go" in text and "y &lt; 2" in text
    assert "<https://hb.example.com/requests/rq_1|Open request rq_1 in the console>" in text
    assert "over budget" in text and "bob" in text


def test_the_generic_event_is_stable_bytes() -> None:
    one = render(_event(), "json", "https://hb.example.com")
    assert one == render(_event(), "json", "https://hb.example.com")
    body = json.loads(one)
    assert (body["type"], body["id"], body["timestamp"]) == (
        "request.awaiting_approval", "evt_1", "2027-01-15T08:00:00Z")
    assert body["data"]["console_url"] == "https://hb.example.com/requests/rq_1"
    assert "console_url" not in json.loads(render(_event(), "json", None))["data"]


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = DeliveryPolicy(first_delay=2, max_delay=30)
    assert [policy.retry_delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert policy.lease_seconds > policy.timeout


def test_a_delivery_ends_once() -> None:
    """Pending is retried or ends delivered, failed or cancelled; an ended one never moves."""
    from marque.harbour.lifecycle import IllegalTransition
    from marque.harbour.store.outbox import DeliveryState as D
    from marque.harbour.store.outbox import delivery_transition

    for to in D:
        assert delivery_transition(D.PENDING, to) is to
    for ended in (D.DELIVERED, D.FAILED, D.CANCELLED):
        for to in D:
            with pytest.raises(IllegalTransition):
                delivery_transition(ended, to)
