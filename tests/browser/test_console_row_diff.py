"""The request page shows the diff an approver approves (a real browser, real processes).

A waiting write's page has a table per statement — key, column, before, after —
with the changed cells marked, inserted and deleted rows labelled; a preview
over its budget offers no Approve button and says why.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from .conftest import Console, World

Consoles = Callable[..., Console]


def _add_account(world: World, id: int, balance: int) -> None:
    conn = sqlite3.connect(world.bank.bank)
    with conn:
        conn.execute("INSERT OR REPLACE INTO accounts VALUES (?, ?)", (id, balance))
    conn.close()


def test_the_request_page_shows_each_row_before_and_after(world: World,
                                                          consoles: Consoles) -> None:
    """An update marks its changed cell (100 → 90) and leaves the key column unmarked; a
    delete's row is labelled deleted, with no after-image; an insert's is labelled inserted."""
    _add_account(world, 41, 100)
    _add_account(world, 42, 7)
    updated = world.submit("alice", "UPDATE accounts SET balance = balance - 10 WHERE id = 41")
    carol = consoles("carol")
    page = carol.page
    page.goto(f"/requests/{updated['id']}")
    table = page.get_by_test_id("diff-1")
    assert table.locator("thead th").all_inner_texts() == ["Key", "Row", "Column", "Before",
                                                           "After"]
    assert "every changed row (1)" in page.get_by_test_id("diff-caption-1").inner_text()
    changed = table.locator("tr[data-changed=true]")
    assert changed.count() == 1
    assert changed.locator("td").all_inner_texts()[-3:] == ["balance", "100", "90"]
    assert "updated" in table.get_by_test_id("diff-op").inner_text()
    unchanged = table.locator("tbody tr:not([data-changed])")
    assert unchanged.locator("td").all_inner_texts()[-3:] == ["id", "41", "41"]
    # The changed cell is highlighted: its background is not the unchanged row's.
    after_bg = changed.get_by_test_id("after").evaluate(
        "e => getComputedStyle(e).backgroundColor")
    plain_bg = unchanged.get_by_test_id("after").evaluate(
        "e => getComputedStyle(e).backgroundColor")
    assert after_bg != plain_bg
    assert "diff CID sha256:" in page.get_by_test_id("preview").inner_text()
    assert page.get_by_test_id("approve").count() == 1

    deleted = world.submit("alice", "DELETE FROM accounts WHERE id = 42")
    page.goto(f"/requests/{deleted['id']}")
    table = page.get_by_test_id("diff-1")
    assert "deleted" in table.get_by_test_id("diff-op").inner_text()
    assert table.get_by_test_id("after").all_inner_texts() == ["no row", "no row"]
    assert table.get_by_test_id("before").all_inner_texts() == ["7", "42"]

    inserted = world.submit("alice", "INSERT INTO accounts (id, balance) VALUES (43, 1)")
    page.goto(f"/requests/{inserted['id']}")
    table = page.get_by_test_id("diff-1")
    assert "inserted" in table.get_by_test_id("diff-op").inner_text()
    assert table.get_by_test_id("before").all_inner_texts() == ["no row", "no row"]


def test_an_over_budget_preview_offers_no_approve_and_says_why(world: World,
                                                              consoles: Consoles) -> None:
    """rows > max_rows: the page says it cannot be approved (an execution would claim an
    attempt and abort with max_rows_exceeded); only Reject is offered."""
    made = world.submit("alice", "UPDATE accounts SET balance = balance + 1", max_rows=1)
    carol = consoles("carol")
    carol.page.goto(f"/requests/{made['id']}")
    alert = carol.page.get_by_test_id("over-budget").inner_text()
    assert "cannot be approved" in alert and "max_rows_exceeded" in alert
    assert "will be refused" not in alert
    assert carol.page.get_by_test_id("approve").count() == 0
    assert carol.page.get_by_test_id("reject").count() == 1
    assert "Not approvable" in carol.page.get_by_test_id("not-approvable").inner_text()
    # Posting the approval anyway is refused by the core: preview_over_budget.
    answer = carol.page.request.post(f"/requests/{made['id']}/approve",
                                     form={"csrf": carol.csrf(), "reason": "anyway"})
    assert answer.status == 403 and "preview_over_budget" in answer.text()
    assert world.request(made["id"])["resolutions"] == []
