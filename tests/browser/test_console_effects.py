"""The console's request page for an Effect Set request (issue 14), in a real Chromium.

Its own world (module-scoped): a Harbourmaster asking two approvers for every
write, a joined Pilot serving the SQLite bank (accounts 1 and 2 at 100).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from support.wait import wait_until

from .conftest import Console, World, fresh_id

Consoles = Callable[..., Console]

DECLARATION = {"version": "marque-effect-set/0.1", "members": [
    {"effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
     "failure_policy": "halt", "max_items": 10}]}


def _submit(world: World, rows: list[dict[str, Any]], reason: str) -> dict[str, Any]:
    body = {"request_id": fresh_id("fx"), "pilot_id": "p1", "target": "bank",
            "change": {"effect_set": {"declaration": DECLARATION, "inputs": {"topup": {
                "version": "marque-effect-input/0.1", "columns": ["balance", "id"],
                "rows": rows}}}},
            "budget": {"executions": 1, "max_rows": 5}, "ttl_seconds": 600, "reason": reason}
    answer = world.api("POST", "/v1/requests", "alice", json=body)
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def _cells(console: Console, row: int) -> list[str]:
    texts: list[str] = console.page.get_by_test_id(f"effect-row-topup-{row}").locator(
        "td").all_inner_texts()
    return [" ".join(t.split()) for t in texts]


def test_the_request_page_shows_rows_before_and_after_and_then_the_receipt(
        world: World, consoles: Consoles) -> None:
    """An approver sees every row as before → after with the effect_preview_cid and the
    strength; after two approvals and `exec --request`, the page shows the set receipt and
    each row applied (and a script-like input value rendered as text)."""
    made = _submit(world, [{"id": 1, "balance": 150}, {"id": 2, "balance": 250}],
                   "top up <script>alert(1)</script>")
    carol = consoles("carol")
    page = carol.page
    page.goto(f"/requests/{made['id']}")
    members = page.get_by_test_id("effect-set").inner_text()
    assert "topup" in members and "accounts" in members and "update" in members
    preview = page.get_by_test_id("effect-preview")
    assert made["preview"]["effect_preview_cid"] in preview.inner_text()
    assert page.get_by_test_id("strength-topup").inner_text() == "full_diff"
    assert page.get_by_test_id("effect-count-topup").inner_text() == "2"
    assert _cells(carol, 1) == ["1", '{"id": 1}', "balance", "100", "150", "not run yet"]
    assert _cells(carol, 2) == ["2", '{"id": 2}', "balance", "100", "250", "not run yet"]
    assert "No receipt yet" in page.get_by_test_id("effect-receipt").inner_text()
    assert "top up <script>alert(1)</script>" in page.get_by_test_id("reason").inner_text()
    assert carol.dialogs == []

    page.get_by_label("Reason").fill("two rows, as shown")
    page.get_by_test_id("approve").click()
    page.wait_for_url("**?done=approved")
    world.approve(made["id"], "dave")
    outcome = world.exec_cli(made["id"], "alice", "n1")
    assert outcome["status"] == "applied", outcome
    assert world.bank.balances() == {1: 150, 2: 250}
    wait_until(lambda: world.request(made["id"])["receipt"], "the set receipt", step=0.1)

    page.goto(f"/requests/{made['id']}")
    receipt = page.get_by_test_id("effect-receipt")
    assert "applied" in page.get_by_test_id("receipt-status").inner_text()
    assert "succeeded" in page.get_by_test_id("receipt-run").inner_text()
    assert world.request(made["id"])["receipt"]["set_receipt_cid"] in receipt.inner_text()
    assert _cells(carol, 1)[-1] == "✓ applied" and _cells(carol, 2)[-1] == "✓ applied"
    assert page.get_by_test_id("row-state").locator(".tone-bad").count() == 0


def test_a_stale_preview_shows_the_request_failed_with_its_next_step(
        world: World, consoles: Consoles) -> None:
    """A row written after the approvals: the execution is stale_preview, and the request
    page shows the request failed — stale_preview, saying to re-request for a new preview —
    not an execution that may run again."""
    before = world.bank.balances()
    made = _submit(world, [{"id": 1, "balance": 111}], "one row")
    world.approve(made["id"], "carol")
    world.approve(made["id"], "dave")
    conn = sqlite3.connect(world.bank.bank)
    with conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
    conn.close()
    outcome = world.exec_cli(made["id"], "alice", "n1", expect=4)
    assert outcome["error"]["code"] == "stale_preview", outcome
    wait_until(lambda: world.request(made["id"])["state"] == "failed", "the request to fail",
               step=0.1)

    carol = consoles("carol")
    carol.page.goto(f"/requests/{made['id']}")
    status = carol.page.get_by_test_id("status")
    assert status.get_attribute("data-state") == "failed"
    text = " ".join(status.inner_text().split())
    assert "stale_preview" in text and "Re-request" in text and "new preview" in text
    assert "may run again" not in text
    assert world.bank.balances() == {**before, 1: before[1] + 1}
