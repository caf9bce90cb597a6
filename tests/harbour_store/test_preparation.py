"""A preparing request's attempts (schema 7): claimed by compare-and-set, due by the row."""

from __future__ import annotations

import pytest

from marque.harbour.lifecycle import IllegalTransition, StaleVersion
from marque.harbour.store.base import HarbourStore

from .conftest import T0, all_entries, assert_chain_verifies, make_draft

FAILURE = {"code": "pilot_unavailable", "message": "attempt 1 failed"}


def test_one_of_two_claims_on_the_same_version_wins(store: HarbourStore) -> None:
    """Two processes holding version 1 both claim the next attempt: exactly one gets it,
    the other is StaleVersion; the row keeps the winner's count, due time and failure."""
    request, _ = store.create_request(make_draft(), now=T0)
    assert (request.prepare_attempts, request.prepare_due) == (0, None)
    won = store.note_preparation(request.id, 1, attempts=1, due=T0 + 15, failure=FAILURE,
                                 actor="harbourmaster", now=T0 + 1,
                                 kind="request.preparation_deferred")
    with pytest.raises(StaleVersion):
        store.note_preparation(request.id, 1, attempts=1, due=T0 + 60, failure=None,
                               actor="harbourmaster", now=T0 + 1)
    stored = store.get_request(request.id)
    assert (stored.version, stored.prepare_attempts, stored.prepare_due, stored.failure) == (
        2, 1, T0 + 15, FAILURE) == (won.version, won.prepare_attempts, won.prepare_due,
                                    won.failure)
    [entry] = [e for e in all_entries(store) if e.kind == "request.preparation_deferred"]
    assert entry.body["attempt"] == 1 and entry.body["next_attempt_at"] == T0 + 15
    assert_chain_verifies(store)


def test_due_is_decided_by_the_row(store: HarbourStore) -> None:
    """A recorded due time decides; a request no attempt was recorded for is due once
    untouched long enough; a request no longer preparing is never due nor claimable."""
    noted, _ = store.create_request(make_draft("a"), now=T0)
    fresh, _ = store.create_request(make_draft("b"), now=T0 + 5)
    gone, _ = store.create_request(make_draft("c"), now=T0)
    store.note_preparation(noted.id, 1, attempts=1, due=T0 + 20, failure=FAILURE,
                           actor="h", now=T0 + 1)
    store.transition(gone.id, 1, "failed", actor="h", now=T0 + 1)

    def due(now: float, lease: float = 60) -> list[str]:
        return [r.id for r in store.preparations_due(now, untouched_since=now - lease)]

    assert due(T0 + 19) == []
    assert due(T0 + 20) == [noted.id]
    assert due(T0 + 65) == [noted.id, fresh.id]
    with pytest.raises(IllegalTransition):
        store.note_preparation(gone.id, 2, attempts=1, due=T0 + 20, failure=None, actor="h",
                               now=T0 + 2)
