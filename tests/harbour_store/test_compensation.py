"""Compensating requests (DESIGN §11.2): the original moves with its compensation, atomically."""

from __future__ import annotations

from typing import Any

import pytest

from marque.harbour.lifecycle import IllegalTransition, RequestState
from marque.harbour.store.base import HarbourStore, StoredRequest

from .conftest import T0, all_entries, assert_chain_verifies, evidence_for, make_draft

S = RequestState


def verified(store: HarbourStore) -> StoredRequest:
    request, _ = store.create_request(make_draft(), now=T0)
    request = store.transition(request.id, 1, "prepared", actor="h", now=T0 + 1,
                               marque_id="mq_orig")
    return store.transition(request.id, 2, "verified", actor="h", now=T0 + 2)


def compensation(store: HarbourStore, original: StoredRequest,
                 request_id: str = "undo-1") -> StoredRequest:
    request, created = store.create_request(
        make_draft(request_id, rolls_back=original.id, sql="UPDATE accounts SET balance = 1"),
        now=T0 + 10)
    assert created and request.rolls_back == original.id
    return request


def move(store: HarbourStore, request: StoredRequest, to: str, **fields: Any) -> StoredRequest:
    return store.transition(request.id, request.version, to, actor="h", now=T0 + 20, **fields)


def test_approval_moves_the_original_to_rolling_back(store: HarbourStore) -> None:
    """The compensation's move to prepared takes the original to rolling_back, both logged."""
    original = verified(store)
    undo = compensation(store, original)
    undo = move(store, undo, "awaiting_approval")
    assert store.get_request(original.id).state is S.VERIFIED  # not yet approved
    move(store, undo, "prepared", marque_id="mq_undo")
    moved = store.get_request(original.id)
    assert (moved.state, moved.version) == (S.ROLLING_BACK, original.version + 1)
    last_two = all_entries(store)[-2:]
    assert [(e.kind, e.subject) for e in last_two] == [
        ("request.prepared", undo.id), ("request.rolling_back", original.id)]
    assert last_two[1].body["compensated_by"] == undo.id


def test_verified_compensation_rolls_the_original_back(store: HarbourStore) -> None:
    """Compensation verified → original rolled_back (and its scope is free)."""
    original = verified(store)
    undo = move(store, compensation(store, original), "prepared", marque_id="mq_undo")
    move(store, undo, "executing")
    move(store, store.get_request(undo.id), "verified")
    assert store.get_request(original.id).state is S.ROLLED_BACK
    assert store.find_active(original.logical_request_scope) is None
    assert_chain_verifies(store)


def test_failed_compensation_is_rollback_failed_and_can_be_retried(store: HarbourStore) -> None:
    """Compensation failed → rollback_failed (blocking); a second compensation may run."""
    original = verified(store)
    undo = move(store, compensation(store, original), "prepared", marque_id="mq_undo")
    move(store, undo, "failed")
    assert store.get_request(original.id).state is S.ROLLBACK_FAILED
    active = store.find_active(original.logical_request_scope)
    assert active is not None and active.id == original.id
    second = compensation(store, original, "undo-2")
    move(store, second, "prepared", marque_id="mq_undo2")
    assert store.get_request(original.id).state is S.ROLLING_BACK


def test_expired_compensation_leaves_the_original_verified(store: HarbourStore) -> None:
    """A compensation that provably never ran (expire_prepared) puts the original back."""
    original = verified(store)
    undo = move(store, compensation(store, original), "prepared", marque_id="mq_undo")
    store.expire_prepared(undo.id, undo.version, evidence=evidence_for("mq_undo"),
                          now=T0 + 10_000, skew_seconds=30, marque_exp=T0 + 600, reason="unused",
                          actor="admin")
    assert store.get_request(original.id).state is S.VERIFIED


def test_a_compensation_rejected_before_approval_leaves_the_original(store: HarbourStore) -> None:
    """Rejected or failed before approval: the original was never touched."""
    original = verified(store)
    undo = move(store, compensation(store, original), "awaiting_approval")
    move(store, undo, "rejected")
    other = move(store, compensation(store, original, "undo-2"), "failed")
    assert other.state is S.FAILED
    assert store.get_request(original.id) == original


def test_only_one_compensation_is_approved_at_a_time(store: HarbourStore) -> None:
    """A second compensation's approval while the original is rolling_back is refused whole."""
    original = verified(store)
    first = compensation(store, original)
    second = compensation(store, original, "undo-2")
    move(store, first, "prepared", marque_id="mq_a")
    with pytest.raises(IllegalTransition):
        move(store, second, "prepared", marque_id="mq_b")
    assert store.get_request(second.id) == second  # its own move rolled back too
    assert store.get_request(original.id).state is S.ROLLING_BACK


def test_only_a_verified_request_can_be_compensated(store: HarbourStore) -> None:
    """Creating a compensation of a request that is not verified is refused."""
    request, _ = store.create_request(make_draft(), now=T0)
    with pytest.raises(IllegalTransition):
        store.create_request(make_draft("undo-1", rolls_back=request.id), now=T0 + 1)
    assert store.find_history(make_draft("undo-1").logical_request_scope) == []


def test_the_originals_moves_are_not_plain_transitions(store: HarbourStore) -> None:
    """verified → rolling_back and rolling_back → rolled_back need the compensation."""
    original = verified(store)
    with pytest.raises(IllegalTransition):
        move(store, original, "rolling_back")
    undo = move(store, compensation(store, original), "prepared", marque_id="mq_undo")
    rolling = store.get_request(original.id)
    for to in ("rolled_back", "rollback_failed", "verified"):
        with pytest.raises(IllegalTransition):
            move(store, rolling, to)
    assert store.get_request(undo.id).state is S.PREPARED
