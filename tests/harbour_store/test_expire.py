"""ADR-038's ``expire_prepared``: it expires only what provably never ran and never can."""

from __future__ import annotations

from typing import Any

import pytest

from marque.harbour.lifecycle import ExpiryRefused, RequestState, StaleVersion
from marque.harbour.store.base import HarbourStore, StoredRequest

from .conftest import T0, all_entries, assert_chain_verifies, evidence_for, make_draft

EXP = T0 + 600
SKEW = 30.0
LATER = EXP + SKEW + 1


def prepared(store: HarbourStore, request_id: str = "req-1") -> StoredRequest:
    """A request in prepared with marque ``mq_<request_id>``."""
    request, _ = store.create_request(make_draft(request_id), now=T0)
    return store.transition(request.id, 1, "prepared", actor="harbour", now=T0 + 1,
                            marque_id=f"mq_{request_id}")


def expire(store: HarbourStore, request: StoredRequest, *, version: int | None = None,
           evidence: dict[str, Any] | None = None, now: float = LATER) -> StoredRequest:
    assert request.marque_id is not None
    return store.expire_prepared(
        request.id, request.version if version is None else version,
        evidence=evidence if evidence is not None else evidence_for(request.marque_id),
        now=now, skew_seconds=SKEW, marque_exp=EXP, reason="confirmation window lapsed",
        actor="admin")


def assert_unchanged(store: HarbourStore, request: StoredRequest, entries: int) -> None:
    assert store.get_request(request.id) == request
    assert len(all_entries(store)) == entries


def test_expire_prepared_succeeds_with_clean_evidence(store: HarbourStore) -> None:
    """Past exp + skew, no report, no claim, no stamp: expired, logged, scope freed."""
    request = prepared(store)
    expired = expire(store, request)
    assert (expired.state, expired.version) == (RequestState.EXPIRED, request.version + 1)
    entry = all_entries(store)[-1]
    assert (entry.kind, entry.actor, entry.subject) == ("request.expired", "admin", request.id)
    assert entry.body["reason"] == "confirmation window lapsed"
    assert entry.body["marque_id"] == request.marque_id
    assert store.find_active(request.logical_request_scope) is None
    fresh, created = store.create_request(make_draft(sql="SELECT 1"), now=LATER + 1)
    assert created and fresh.id != request.id
    assert_chain_verifies(store)


def test_wrong_version_is_refused(store: HarbourStore) -> None:
    """An expected version that is not the request's: StaleVersion, nothing changes."""
    request = prepared(store)
    before = len(all_entries(store))
    with pytest.raises(StaleVersion):
        expire(store, request, version=request.version - 1)
    assert_unchanged(store, request, before)


@pytest.mark.parametrize("now", [EXP - 1, EXP, EXP + SKEW - 0.5])
def test_an_unexpired_marque_is_refused(store: HarbourStore, now: float) -> None:
    """Before exp plus the skew allowance the marque may still run: refused."""
    request = prepared(store)
    before = len(all_entries(store))
    with pytest.raises(ExpiryRefused) as caught:
        expire(store, request, now=now)
    assert caught.value.detail["reason"] == "marque_unexpired"
    assert_unchanged(store, request, before)


def test_a_request_with_a_report_is_refused(store: HarbourStore) -> None:
    """A recorded execution report means something ran: refused."""
    request = prepared(store)
    assert request.marque_id is not None
    assert store.record_report(request.marque_id, "n1", 1, "aborted_not_applied", {"x": 1},
                               now=T0 + 5)
    request = store.get_request(request.id)
    before = len(all_entries(store))
    with pytest.raises(ExpiryRefused) as caught:
        expire(store, request)
    assert caught.value.detail["reason"] == "report_recorded"
    assert_unchanged(store, request, before)


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"claims": [{"nonce": "n1", "attempts": [{"attempt": 1, "status": "in_progress"}]}]},
     "claim_seen"),
    ({"budget": {"target": "bank", "executions_left": 0}}, "claim_seen"),
    ({"stamps": [{"nonce": "n1", "kind": "applied", "target": "bank"}]}, "stamp_seen"),
    ({"stamps": [{"nonce": "n1", "kind": "applied"}], "reachable": False}, "stamp_seen"),
    ({"reachable": False}, "evidence_incomplete"),
    ({"reachable": None}, "evidence_incomplete"),
])
def test_evidence_of_a_claim_or_stamp_is_refused(store: HarbourStore, kwargs: dict[str, Any],
                                                 reason: str) -> None:
    """A claim, a budget row, a stamp, or a target not asked: refused, nothing changes."""
    request = prepared(store)
    assert request.marque_id is not None
    before = len(all_entries(store))
    with pytest.raises(ExpiryRefused) as caught:
        expire(store, request, evidence=evidence_for(request.marque_id, **kwargs))
    assert caught.value.detail["reason"] == reason
    assert_unchanged(store, request, before)


@pytest.mark.parametrize("evidence", [
    {},
    {"marque_id": "mq_other", "pilot": {"id": "pilot-1"}, "claims": [], "stamps": [],
     "target_reachable": True},
    {"marque_id": "mq_req-1", "pilot": {"id": "pilot-9"}, "claims": [], "stamps": [],
     "target_reachable": True},
    {"marque_id": "mq_req-1", "pilot": {"id": "pilot-1"}, "target_reachable": True},
])
def test_evidence_about_something_else_is_refused(store: HarbourStore,
                                                  evidence: dict[str, Any]) -> None:
    """Evidence for another marque or Pilot, or without claims and stamps, proves nothing."""
    request = prepared(store)
    before = len(all_entries(store))
    with pytest.raises(ExpiryRefused) as caught:
        expire(store, request, evidence=evidence)
    assert caught.value.detail["reason"] == "evidence_incomplete"
    assert_unchanged(store, request, before)


@pytest.mark.parametrize("path", [(), ("awaiting_approval",), ("prepared", "executing"),
                                  ("prepared", "reconciliation")])
def test_only_prepared_requests_expire(store: HarbourStore, path: tuple[str, ...]) -> None:
    """From any state but prepared the primitive refuses (not_prepared)."""
    request, _ = store.create_request(make_draft(), now=T0)
    for n, state in enumerate(path):
        request = store.transition(request.id, request.version, state, actor="h",
                                   now=T0 + n + 1, marque_id="mq_req-1")
    before = len(all_entries(store))
    with pytest.raises(ExpiryRefused) as caught:
        store.expire_prepared(request.id, request.version, evidence=evidence_for("mq_req-1"),
                              now=LATER, skew_seconds=SKEW, marque_exp=EXP, reason="r",
                              actor="admin")
    assert caught.value.detail["reason"] == "not_prepared"
    assert_unchanged(store, request, before)


def test_a_second_expiry_of_the_same_version_is_refused(store: HarbourStore) -> None:
    """Double expiry: the second call's version is stale."""
    request = prepared(store)
    expire(store, request)
    with pytest.raises(StaleVersion):
        expire(store, request)
