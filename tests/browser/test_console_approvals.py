"""What an approver is shown before and after an approval, in a real browser.

A compensating request says on its page which request it rolls back (its
state and requester, linked); a request whose Checkpoint no longer holds (the
routing config changed) leaves "Waiting for you", its page warns that an
approval would fail it, and the approval that does is shown as a refusal
with the request ``failed``. Real `harbour serve`, `pilot serve` and Chromium.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harbour import (
    DEBIT,
    READS_ALLOWED,
    request_body,
    routing_toml,
    writes_delegated,
)
from support.wait import wait_until

from .conftest import Console, World, fresh_id, make_world

Consoles = Callable[..., Console]
CREDIT = "UPDATE accounts SET balance = balance + 10 WHERE id = 1"


def test_a_compensation_shows_which_request_it_rolls_back(
        world: World, consoles: Consoles) -> None:
    """The compensating request's page names its original, linked, with its state and who
    asked for it."""
    original = world.submit("alice", DEBIT, reason="the change")
    world.approve(original["id"], "carol")
    world.approve(original["id"], "dave")
    assert world.exec_cli(original["id"], "alice", "n1")["status"] == "applied"
    wait_until(lambda: world.request(original["id"])["state"] == "verified",
               "the original verified", step=0.1)
    body = request_body(CREDIT, request_id=fresh_id("undo"))
    body["rolls_back"] = original["id"]
    answer = world.api("POST", "/v1/requests", "alice", json=body)
    assert answer.status_code == 201, answer.text
    undo = answer.json()

    carol = consoles("carol")
    carol.page.goto(f"/requests/{undo['id']}")
    shown = carol.page.get_by_test_id("compensates")
    assert shown.inner_text().startswith(
        f"Compensates {original['id']} (verified, asked by alice)"), shown.inner_text()
    shown.get_by_role("link", name=original["id"]).click()
    carol.page.wait_for_url(f"**/requests/{original['id']}")
    assert carol.page.get_by_test_id("compensates").count() == 0


@pytest.fixture
def own_world(tmp_path: Path) -> Iterator[World]:
    """A world of this test's own: it adopts another routing config."""
    yield from make_world(tmp_path)


def test_a_request_that_can_no_longer_be_approved_leaves_waiting_for_you(
        own_world: World, browser: Any) -> None:
    """Once the routing config changed, the request leaves Dave's queue, its page says an
    approval would fail it, and Dave's approval is shown as revalidation_failed with the
    request failed."""
    world = own_world
    made = world.submit("alice", DEBIT, reason="before the change")
    world.approve(made["id"], "carol")  # one of two: still waiting
    dave = Console(browser, world, "dave")
    try:
        waiting = dave.page.get_by_test_id("waiting")
        assert waiting.get_by_role("link", name=made["id"]).count() == 1
        world.harbour.set_routing(routing_toml(READS_ALLOWED, writes_delegated(1)))
        dave.page.goto("/")
        assert dave.page.get_by_test_id("waiting-none").count() == 1
        assert dave.page.locator(f"[data-testid=waiting] [data-request='{made['id']}']"
                                 ).count() == 0
        dave.page.goto(f"/requests/{made['id']}")
        assert "config_changed" in dave.page.get_by_test_id("no-longer-holds").inner_text()
        dave.page.get_by_label("Reason").fill("fine")
        dave.page.get_by_test_id("approve").click()
        dave.page.wait_for_load_state()
        error = dave.page.get_by_test_id("error").inner_text()
        assert "revalidation_failed" in error and "failed" in error, error
        assert world.request(made["id"])["state"] == "failed"
    finally:
        dave.close()
