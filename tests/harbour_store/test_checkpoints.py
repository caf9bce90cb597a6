"""Checkpoints, Resolutions and reports in the store."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from marque.cid import cid
from marque.errors import Conflict, InvalidInput, NotFound
from marque.harbour.lifecycle import RequestState, StaleVersion
from marque.harbour.store.base import HarbourStore, StoredRequest

from .conftest import T0, all_entries, assert_chain_verifies, make_draft

S = RequestState


def sealed(store: HarbourStore) -> tuple[StoredRequest, str]:
    request, _ = store.create_request(make_draft(), now=T0)
    body = {"version": "marque-checkpoint/0.1",
            "logical_request_scope": request.logical_request_scope,
            "intent_fingerprint": request.intent_fingerprint, "expires_at": T0 + 3600}
    checkpoint_cid = cid(body)
    request = store.seal_checkpoint(request.id, 1, checkpoint_cid=checkpoint_cid, body=body,
                                    expires_at=T0 + 3600, actor="harbour", now=T0 + 1)
    return request, checkpoint_cid


def resolve(store: HarbourStore, checkpoint_cid: str, approver: str, decision: str = "approve",
            at: float = T0 + 2) -> tuple[object, bool]:
    body = {"version": "marque-resolution/0.1", "checkpoint_cid": checkpoint_cid,
            "decision": decision, "approver": approver, "reason": "ok", "at": at}
    return store.add_resolution(checkpoint_cid, resolution_cid=cid(body), approver=approver,
                                decision=decision, body=body, now=at)


def test_sealing_stores_the_checkpoint_and_awaits_approval(store: HarbourStore) -> None:
    """seal_checkpoint stores body and CID, moves to awaiting_approval, logs it."""
    request, checkpoint_cid = sealed(store)
    assert (request.state, request.version, request.checkpoint_cid) == (
        S.AWAITING_APPROVAL, 2, checkpoint_cid)
    checkpoint = store.get_checkpoint(checkpoint_cid)
    assert checkpoint.request == request.id and checkpoint.expires_at == T0 + 3600
    assert cid(checkpoint.body) == checkpoint_cid
    entry = all_entries(store)[-1]
    assert entry.kind == "request.awaiting_approval"
    assert entry.body["checkpoint_cid"] == checkpoint_cid
    with pytest.raises(NotFound):
        store.get_checkpoint("sha256:" + "0" * 64)


def test_sealing_needs_the_current_version_and_a_new_cid(store: HarbourStore) -> None:
    """A stale version or a Checkpoint CID already sealed is refused; nothing is stored."""
    request, checkpoint_cid = sealed(store)
    other, _ = store.create_request(make_draft("req-2"), now=T0)
    with pytest.raises(StaleVersion):
        store.seal_checkpoint(other.id, 7, checkpoint_cid="sha256:" + "9" * 64, body={},
                              expires_at=T0, actor="h")
    with pytest.raises(Conflict):
        store.seal_checkpoint(other.id, 1, checkpoint_cid=checkpoint_cid, body={},
                              expires_at=T0, actor="h")
    assert store.get_request(other.id) == other


def test_two_approvals_by_one_approver_count_once(store: HarbourStore) -> None:
    """The same approver twice: one stored Resolution, the second call returns the first."""
    _, checkpoint_cid = sealed(store)
    first, new = resolve(store, checkpoint_cid, "carol", at=T0 + 2)
    assert new
    again, new_again = resolve(store, checkpoint_cid, "carol", at=T0 + 3)
    assert not new_again and again == first
    resolve(store, checkpoint_cid, "dave", at=T0 + 4)
    assert [r.approver for r in store.resolutions(checkpoint_cid)] == ["carol", "dave"]
    kinds = [e.kind for e in all_entries(store)]
    assert kinds.count("resolution.approve") == 2


def test_concurrent_approvals_by_one_approver_store_one(store: HarbourStore) -> None:
    """Eight threads resolve as one approver at once: exactly one Resolution is new."""
    _, checkpoint_cid = sealed(store)
    gate = threading.Barrier(8)

    def one(n: int) -> bool:
        gate.wait(timeout=30)
        return resolve(store, checkpoint_cid, "carol", at=T0 + 2 + n)[1]

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(one, range(8))) == [False] * 7 + [True]
    assert len(store.resolutions(checkpoint_cid)) == 1
    assert_chain_verifies(store)


def test_resolutions_need_an_open_checkpoint(store: HarbourStore) -> None:
    """Unknown Checkpoint: NotFound; decided request: Conflict; bad decision: InvalidInput."""
    request, checkpoint_cid = sealed(store)
    with pytest.raises(NotFound):
        resolve(store, "sha256:" + "1" * 64, "carol")
    with pytest.raises(InvalidInput):
        resolve(store, checkpoint_cid, "carol", decision="maybe")
    resolve(store, checkpoint_cid, "carol", decision="reject")
    store.transition(request.id, request.version, "rejected", actor="h", now=T0 + 3)
    with pytest.raises(Conflict):
        resolve(store, checkpoint_cid, "dave")
    assert [r.decision for r in store.resolutions(checkpoint_cid)] == ["reject"]


def test_reports_are_stored_once_per_key(store: HarbourStore) -> None:
    """(marque_id, nonce, attempt, status) is unique: a retried report is stored once."""
    request, _ = store.create_request(make_draft(), now=T0)
    store.transition(request.id, 1, "prepared", actor="h", now=T0, marque_id="mq_1")
    assert store.record_report("mq_1", "n1", 1, "in_progress", {"a": 1}, now=T0 + 1)
    assert not store.record_report("mq_1", "n1", 1, "in_progress", {"a": 1}, now=T0 + 2)
    assert store.record_report("mq_1", "n1", 1, "applied", {"rows": 1}, now=T0 + 3)
    reports = store.reports("mq_1")
    assert [(r.status, r.request) for r in reports] == [("in_progress", request.id),
                                                        ("applied", request.id)]
    kinds = [e.kind for e in all_entries(store)]
    assert kinds[-2:] == ["execution.in_progress", "execution.applied"]


def test_one_key_counts_once_per_checkpoint_under_any_name(store: HarbourStore) -> None:
    """An approval by bob's key under another name, on a Checkpoint bob's key resolved, is
    Conflict (a unique index over checkpoint and key): nothing more is stored."""
    _, checkpoint_cid = sealed(store)
    key = "k" * 43
    for approver in ("bob", "bob_twin"):
        body = {"version": "marque-resolution/0.1", "checkpoint_cid": checkpoint_cid,
                "decision": "approve", "approver": approver, "reason": "ok", "at": T0 + 2}
        if approver == "bob":
            assert store.add_resolution(checkpoint_cid, resolution_cid=cid(body),
                                        approver=approver, decision="approve", body=body,
                                        now=T0 + 2, approver_jkt=key)[1]
            continue
        with pytest.raises(Conflict) as refused:
            store.add_resolution(checkpoint_cid, resolution_cid=cid(body), approver=approver,
                                 decision="approve", body=body, now=T0 + 2, approver_jkt=key)
        assert refused.value.detail["holder"] == "bob"
    assert [r.approver for r in store.resolutions(checkpoint_cid)] == ["bob"]
    # Approvers without a key are told apart by name alone.
    resolve(store, checkpoint_cid, "carol")
    resolve(store, checkpoint_cid, "dave")
    assert len(store.resolutions(checkpoint_cid)) == 3


def test_request_parts_reads_several_requests_parts_as_each_alone(store: HarbourStore) -> None:
    """request_parts gives, for a whole page, what get_checkpoint, resolutions and reports
    give one request at a time, in the same order; a request without them has none."""
    first, first_cid = sealed(store)
    resolve(store, first_cid, "carol")
    resolve(store, first_cid, "dave", at=T0 + 3)
    plain, _ = store.create_request(make_draft("plain"), now=T0)
    ran, _ = store.create_request(make_draft("ran"), now=T0)
    ran = store.transition(ran.id, 1, "prepared", actor="h", now=T0, marque_id="mq_parts")
    store.record_report("mq_parts", "n2", 1, "applied", {"b": 2}, now=T0 + 4)
    store.record_report("mq_parts", "n1", 1, "applied", {"a": 1}, now=T0 + 4)
    parts = store.request_parts([first, plain, ran])
    assert parts.checkpoints == {first_cid: store.get_checkpoint(first_cid)}
    assert parts.resolutions == {first_cid: store.resolutions(first_cid)}
    assert [r.approver for r in parts.resolutions[first_cid]] == ["carol", "dave"]
    assert parts.reports == {"mq_parts": store.reports("mq_parts")}
    assert [r.nonce for r in parts.reports["mq_parts"]] == ["n1", "n2"]
    nothing = store.request_parts([plain])
    assert (nothing.checkpoints, nothing.resolutions, nothing.reports) == ({}, {}, {})
