"""Requests in the store: ADR-038's blocking rule, history, versions and their logbook entries."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from marque.errors import Conflict, InvalidInput, NotFound
from marque.harbour.lifecycle import (
    BLOCKING,
    PRIMITIVE_ONLY,
    TRANSITIONS,
    IllegalTransition,
    IntentConflict,
    RequestState,
    StaleVersion,
)
from marque.harbour.store.base import HarbourStore, StoredRequest

from .conftest import T0, all_entries, assert_chain_verifies, make_draft

S = RequestState


def walk(store: HarbourStore, request: StoredRequest, *states: str,
         at: float = T0) -> StoredRequest:
    """Move ``request`` through ``states`` by plain transitions."""
    for offset, state in enumerate(states, start=1):
        request = store.transition(request.id, request.version, state, actor="harbour",
                                   now=at + offset)
    return request


def test_a_new_request_is_preparing_and_logged(store: HarbourStore) -> None:
    """create_request stores the draft in preparing at version 1 and logs request.preparing."""
    draft = make_draft()
    request, created = store.create_request(draft, now=T0)
    assert created
    assert request.id.startswith("rq_")
    assert (request.state, request.version) == (S.PREPARING, 1)
    assert request.change == draft.change and request.budget == draft.budget
    assert request.routing is None and request.marque_id is None
    assert store.get_request(request.id) == request
    [entry] = all_entries(store)
    assert (entry.kind, entry.subject, entry.actor) == ("request.preparing", request.id, "alice")
    assert entry.body["logical_request_scope"] == draft.logical_request_scope


def test_same_scope_and_intent_returns_the_existing_request(store: HarbourStore) -> None:
    """Repeating a request returns it, stores nothing new and logs nothing."""
    first, _ = store.create_request(make_draft(), now=T0)
    again, created = store.create_request(make_draft(reason="another reason"), now=T0 + 1)
    assert not created
    assert again == first
    assert len(all_entries(store)) == 1


def test_same_scope_other_intent_is_a_conflict(store: HarbourStore) -> None:
    """Same caller id, different change: IntentConflict (code conflict, HTTP 422)."""
    first, _ = store.create_request(make_draft(), now=T0)
    with pytest.raises(IntentConflict) as caught:
        store.create_request(make_draft(sql="DELETE FROM accounts"), now=T0 + 1)
    assert caught.value.code == "conflict" and caught.value.http_status == 422
    assert caught.value.detail["request"] == first.id
    assert len(store.find_history(first.logical_request_scope)) == 1


def test_another_principal_with_the_same_id_is_another_request(store: HarbourStore) -> None:
    """The scope includes the principal: bob's req-1 is not alice's."""
    alice, _ = store.create_request(make_draft(principal="alice"), now=T0)
    bob, created = store.create_request(make_draft(principal="bob"), now=T0)
    assert created and bob.id != alice.id


@pytest.mark.parametrize("path", [
    ("failed",),
    ("awaiting_approval", "rejected"),
    ("awaiting_approval", "expired"),
])
def test_a_non_blocking_request_does_not_block(store: HarbourStore, path: tuple[str, ...]) -> None:
    """failed, rejected and expired attempts free the scope; history keeps every attempt."""
    old, _ = store.create_request(make_draft(), now=T0)
    old = walk(store, old, *path)
    assert store.find_active(old.logical_request_scope) is None
    fresh, created = store.create_request(make_draft(sql="DELETE FROM accounts"), now=T0 + 10)
    assert created and fresh.id != old.id
    assert store.find_active(old.logical_request_scope) == fresh
    assert [r.id for r in store.find_history(old.logical_request_scope)] == [old.id, fresh.id]


@pytest.mark.parametrize("path", [
    (), ("awaiting_approval",), ("prepared",), ("prepared", "executing"),
    ("prepared", "verified"), ("prepared", "reconciliation"),
])
def test_a_blocking_request_blocks(store: HarbourStore, path: tuple[str, ...]) -> None:
    """While a request is in a blocking state, a different intent in its scope conflicts."""
    held, _ = store.create_request(make_draft(), now=T0)
    held = walk(store, held, *path)
    assert held.state in BLOCKING
    with pytest.raises(IntentConflict):
        store.create_request(make_draft(sql="DELETE FROM accounts"), now=T0 + 10)
    repeated, created = store.create_request(make_draft(), now=T0 + 10)
    assert not created and repeated.id == held.id
    assert store.find_active(held.logical_request_scope) == held


def test_history_returns_every_attempt_oldest_first(store: HarbourStore) -> None:
    """Three attempts, two failed: history lists all three in order; one is active."""
    ids = []
    for n in range(3):
        request, _ = store.create_request(make_draft(sql=f"SELECT {n}"), now=T0 + 10 * n)
        ids.append(request.id)
        if n < 2:
            walk(store, request, "failed", at=T0 + 10 * n)
    history = store.find_history(make_draft().logical_request_scope)
    assert [r.id for r in history] == ids
    assert [r.state for r in history] == [S.FAILED, S.FAILED, S.PREPARING]


def test_a_rolled_back_request_does_not_block(store: HarbourStore) -> None:
    """After a verified compensation the original is rolled_back and frees its scope."""
    original, _ = store.create_request(make_draft(), now=T0)
    original = walk(store, original, "prepared", "verified")
    undo, _ = store.create_request(make_draft("undo-1", rolls_back=original.id), now=T0 + 5)
    walk(store, undo, "prepared", "verified", at=T0 + 5)
    assert store.get_request(original.id).state is S.ROLLED_BACK
    again, created = store.create_request(make_draft(), now=T0 + 20)
    assert created and again.id != original.id


def test_transition_sets_fields_and_logs_its_kind(store: HarbourStore) -> None:
    """A transition's field updates land with the state; its entry is request.<state>."""
    request, _ = store.create_request(make_draft(), now=T0)
    routing = {"outcome": "allow", "config_cid": "sha256:" + "1" * 64, "approvals": 0,
               "code": None}
    moved = store.transition(request.id, 1, "prepared", actor="harbour", now=T0 + 1,
                             routing=routing, marque_id="mq_1", reason="allowed")
    assert (moved.state, moved.version, moved.marque_id, moved.routing) == (
        S.PREPARED, 2, "mq_1", routing)
    assert moved.updated_at == T0 + 1 and moved.created_at == T0
    entry = all_entries(store)[-1]
    assert entry.kind == "request.prepared" and entry.subject == request.id
    assert entry.body["from"] == "preparing" and entry.body["to"] == "prepared"
    assert entry.body["marque_id"] == "mq_1" and entry.body["reason"] == "allowed"


def test_transition_refuses_unknown_fields_and_states(store: HarbourStore) -> None:
    """Only routing, preview, checkpoint_cid and marque_id may be set; states are closed."""
    request, _ = store.create_request(make_draft(), now=T0)
    with pytest.raises(InvalidInput):
        store.transition(request.id, 1, "prepared", actor="x", state="verified")
    with pytest.raises(InvalidInput):
        store.transition(request.id, 1, "done", actor="x")
    with pytest.raises(NotFound):
        store.transition("rq_missing", 1, "prepared", actor="x")
    assert store.get_request(request.id) == request


def test_a_stale_version_is_refused_and_changes_nothing(store: HarbourStore) -> None:
    """A compare-and-set on an old version raises StaleVersion; state and logbook stay."""
    request, _ = store.create_request(make_draft(), now=T0)
    walk(store, request, "prepared")
    before = len(all_entries(store))
    with pytest.raises(StaleVersion) as caught:
        store.transition(request.id, 1, "failed", actor="x")
    assert isinstance(caught.value, Conflict)
    assert store.get_request(request.id).state is S.PREPARED
    assert len(all_entries(store)) == before


def test_an_illegal_move_is_refused_and_changes_nothing(store: HarbourStore) -> None:
    """preparing → verified is not in the table: IllegalTransition, nothing logged."""
    request, _ = store.create_request(make_draft(), now=T0)
    with pytest.raises(IllegalTransition):
        store.transition(request.id, 1, "verified", actor="x")
    assert store.get_request(request.id) == request
    assert len(all_entries(store)) == 1


def test_prepared_to_expired_needs_expire_prepared(store: HarbourStore) -> None:
    """A plain transition cannot expire a prepared request (ADR-038's primitive must)."""
    request, _ = store.create_request(make_draft(), now=T0)
    request = walk(store, request, "prepared")
    with pytest.raises(IllegalTransition):
        store.transition(request.id, request.version, "expired", actor="admin")
    assert store.get_request(request.id).state is S.PREPARED


def test_concurrent_transitions_with_one_version_one_wins(store: HarbourStore) -> None:
    """Eight threads move one request from the same version: exactly one succeeds."""
    request, _ = store.create_request(make_draft(), now=T0)
    request = walk(store, request, "prepared")
    targets = ["executing", "verified", "reconciliation", "failed"] * 2
    gate = threading.Barrier(len(targets))

    def attempt(to: str) -> str:
        gate.wait(timeout=30)
        try:
            store.transition(request.id, request.version, to, actor="racer", now=T0 + 9)
        except StaleVersion:
            return "lost"
        return to

    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        results = list(pool.map(attempt, targets))
    winners = [r for r in results if r != "lost"]
    assert len(winners) == 1
    final = store.get_request(request.id)
    assert (final.state.value, final.version) == (winners[0], request.version + 1)
    assert [e.kind for e in all_entries(store)].count(f"request.{winners[0]}") == 1
    assert_chain_verifies(store)


def test_sixteen_threads_creating_one_scope_leave_one_blocking_row(store: HarbourStore) -> None:
    """16 threads, same scope, half with another intent: one row; repeats share it."""
    gate = threading.Barrier(16)

    def create(n: int) -> tuple[str, Any]:
        gate.wait(timeout=30)
        sql = "SELECT 1" if n % 2 == 0 else "SELECT 2"
        try:
            request, created = store.create_request(make_draft(sql=sql), now=T0)
        except IntentConflict:
            return sql, "conflict"
        return sql, (request.id, created)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(create, range(16)))
    scope = make_draft().logical_request_scope
    history = store.find_history(scope)
    assert len(history) == 1
    winner = history[0]
    assert [o for _, o in results if o != "conflict" and o[1]] == [(winner.id, True)]
    for sql, outcome in results:
        if make_draft(sql=sql).intent_fingerprint == winner.intent_fingerprint:
            assert outcome in ((winner.id, False), (winner.id, True))
        else:
            assert outcome == "conflict"
    assert_chain_verifies(store)


def test_list_requests_filters_by_state_and_principal(store: HarbourStore) -> None:
    """list_requests narrows by state and by principal, newest first."""
    a, _ = store.create_request(make_draft("a", principal="alice"), now=T0)
    b, _ = store.create_request(make_draft("b", principal="bob"), now=T0 + 1)
    c, _ = store.create_request(make_draft("c", principal="alice"), now=T0 + 2)
    walk(store, c, "failed")
    assert [r.id for r in store.list_requests()] == [c.id, b.id, a.id]
    assert [r.id for r in store.list_requests(principal="alice")] == [c.id, a.id]
    assert [r.id for r in store.list_requests(state="preparing")] == [b.id, a.id]
    assert [r.id for r in store.list_requests(S.FAILED, "alice")] == [c.id]


def test_count_requests_counts_each_state_and_principal(store: HarbourStore) -> None:
    """count_requests is the number of requests per state (none: left out), of everyone or
    of one principal."""
    assert store.count_requests() == {}
    store.create_request(make_draft("n-a", principal="alice"), now=T0)
    store.create_request(make_draft("n-b", principal="bob"), now=T0)
    c, _ = store.create_request(make_draft("n-c", principal="alice"), now=T0)
    walk(store, c, "failed")
    assert store.count_requests() == {"preparing": 2, "failed": 1}
    assert store.count_requests("alice") == {"preparing": 1, "failed": 1}
    assert store.count_requests("nobody") == {}


def test_list_requests_pages_by_created_at_then_id(store: HarbourStore) -> None:
    """A page is at most ``limit`` requests after ``before``; two made at the same moment
    are ordered by id, so a walk sees each request once."""
    made = [store.create_request(make_draft(f"page-{n}", principal="alice"),
                                 now=T0 + n // 2)[0] for n in range(5)]
    newest = sorted(made, key=lambda r: (r.created_at, r.id), reverse=True)
    seen: list[str] = []
    before = None
    while True:
        page = store.list_requests(principal="alice", limit=2, before=before)
        assert len(page) <= 2
        seen += [r.id for r in page]
        if len(page) < 2:
            break
        before = (page[-1].created_at, page[-1].id)
    assert seen == [r.id for r in newest]
    assert store.list_requests(limit=1, before=(T0 - 1, "rq_")) == []


class StoreLifecycle(RuleBasedStateMachine):
    """Random moves of one stored request: the store follows the table, version by version."""

    def __init__(self, store: HarbourStore, counter: list[int]) -> None:
        super().__init__()
        self.store = store
        counter[0] += 1
        self.request, _ = store.create_request(
            make_draft(f"machine-{id(self)}-{counter[0]}"), now=T0)
        self.state = S.PREPARING
        self.version = 1

    @rule(to=st.sampled_from(list(RequestState)))
    def move(self, to: RequestState) -> None:
        legal = to in TRANSITIONS[self.state] and (self.state, to) not in PRIMITIVE_ONLY
        try:
            moved = self.store.transition(self.request.id, self.version, to, actor="machine")
        except IllegalTransition:
            assert not legal
        else:
            assert legal
            assert (moved.state, moved.version) == (to, self.version + 1)
            entry = self.store.logbook_entries(after=self.store.logbook_head()["seq"] - 1)[0]
            assert (entry.kind, entry.subject) == (f"request.{to.value}", self.request.id)
            self.state, self.version = to, self.version + 1

    @rule(to=st.sampled_from(list(RequestState)))
    def stale_move(self, to: RequestState) -> None:
        if self.version == 1:
            return
        with pytest.raises(StaleVersion):
            self.store.transition(self.request.id, self.version - 1, to, actor="machine")

    @invariant()
    def stored_state_is_the_models(self) -> None:
        stored = self.store.get_request(self.request.id)
        assert (stored.state, stored.version) == (self.state, self.version)
        active = self.store.find_active(stored.logical_request_scope)
        assert (active is not None and active.id == stored.id) == (self.state in BLOCKING)


def test_store_follows_the_lifecycle_table(shared_store: HarbourStore) -> None:
    """A hypothesis state machine over the store: legal moves move, others raise."""
    counter = [0]
    run_state_machine_as_test(
        lambda: StoreLifecycle(shared_store, counter),  # type: ignore[arg-type]
        settings=settings(max_examples=25, stateful_step_count=12, deadline=None,
                          suppress_health_check=list(HealthCheck)))
    assert_chain_verifies(shared_store)
