"""``/metrics``' request figures (harbour/figures.py) from the store's count-by-state query."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from marque.harbour.figures import StoreFigures
from marque.harbour.lifecycle import RequestState
from marque.harbour.store.base import HarbourStore

from .conftest import T0, make_draft
from .test_requests import walk


def _samples(store: HarbourStore) -> dict[str, dict[str, float]]:
    registry = CollectorRegistry()
    registry.register(StoreFigures(store))
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode("utf-8")):
        for sample in family.samples:
            label = sample.labels.get("state") or sample.labels.get("kind") or ""
            found.setdefault(sample.name, {})[label] = sample.value
    return found


def test_request_figures_count_each_state_with_zeros_for_the_rest(store: HarbourStore) -> None:
    """marque_harbour_requests{state} is the count of each state (zero for a state none is
    in) and approvals_waiting the awaiting_approval count, for requests in several states."""
    walks = {"a": ("awaiting_approval",), "b": ("awaiting_approval",),
             "c": ("prepared",), "d": ("prepared", "executing", "verified"),
             "e": ("failed",), "f": ("failed",), "g": ("failed",), "h": ()}
    for name, states in walks.items():
        request, _ = store.create_request(make_draft(f"fig-{name}"), now=T0)
        walk(store, request, *states)
    by_state = _samples(store)["marque_harbour_requests"]
    assert by_state == {state.value: 0.0 for state in RequestState} | {
        "awaiting_approval": 2.0, "prepared": 1.0, "verified": 1.0, "failed": 3.0,
        "preparing": 1.0}
    assert _samples(store)["marque_harbour_approvals_waiting"] == {"": 2.0}


def test_an_empty_store_reports_every_state_at_zero(store: HarbourStore) -> None:
    """No request: every state is shown, at 0, and nothing waits."""
    samples = _samples(store)
    assert samples["marque_harbour_requests"] == {s.value: 0.0 for s in RequestState}
    assert samples["marque_harbour_approvals_waiting"] == {"": 0.0}
