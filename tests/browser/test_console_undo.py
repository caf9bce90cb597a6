"""The requester's Undo button, in a real browser on real processes.

Alice's applied debit offers her "Undo this change" (and nobody else); clicking
it files the undo and opens its page, with the rows it puts back; once two
approvers approved it and she executed it, the account holds its old balance.
A row changed since makes the button answer undo_conflict by key, and nothing
is applied. Screenshots go to a temporary directory, or to
``MARQUE_CONSOLE_SCREENSHOTS`` (``scripts/console-screenshots`` points it at
docs/console/).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from support.wait import wait_until

from .conftest import DESKTOP, PHONE, Console, World

Consoles = Callable[..., Console]


def _balance(world: World, id: int) -> int:
    conn = sqlite3.connect(world.bank.bank)
    try:
        found: int = conn.execute("SELECT balance FROM accounts WHERE id = ?",
                                  (id,)).fetchone()[0]
        return found
    finally:
        conn.close()


def _set_balance(world: World, id: int, balance: int) -> None:
    conn = sqlite3.connect(world.bank.bank)
    with conn:
        conn.execute("INSERT OR REPLACE INTO accounts VALUES (?, ?)", (id, balance))
    conn.close()


def _applied(world: World, sql: str) -> dict[str, object]:
    made = world.submit("alice", sql, reason="refund ticket 4521")
    world.approve(str(made["id"]), "carol")
    world.approve(str(made["id"]), "dave")
    world.exec_cli(str(made["id"]), "alice", f"n-{made['id']}")
    wait_until(lambda: world.request(str(made["id"]))["state"] == "verified",
               "the debit's report", step=0.1)
    return made


def test_the_requester_undoes_an_applied_change_from_its_page(
        world: World, consoles: Consoles, tmp_path: Path) -> None:
    """Only alice sees the button; clicking it opens the undo's page with its rows; approved
    and executed, the balance is back and the debit is rolled_back."""
    out = Path(os.environ.get("MARQUE_CONSOLE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    _set_balance(world, 51, 100)
    debit = _applied(world, "UPDATE accounts SET balance = balance - 10 WHERE id = 51")
    assert _balance(world, 51) == 90
    carol = consoles("carol")
    carol.page.goto(f"/requests/{debit['id']}")
    assert carol.page.get_by_test_id("undo").count() == 0
    alice = consoles("alice")
    alice.page.goto(f"/requests/{debit['id']}")
    alice.page.get_by_label("Reason").last.fill("the refund went to the wrong account")
    alice.page.get_by_test_id("undo").click()
    alice.page.wait_for_url(lambda url: "done=undo_filed" in url)
    rows = alice.page.get_by_test_id("undo-rows")
    assert f"Undo of {debit['id']}" in rows.inner_text()
    cells = alice.page.get_by_test_id("undo-table").locator("tbody tr td").all_inner_texts()
    assert cells[-3:] == ["balance", "90", "100"], cells
    undo_id = alice.page.url.split("/requests/")[1].split("?")[0]
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        shot = consoles("alice", viewport=viewport)
        shot.page.goto(f"/requests/{undo_id}")
        shot.page.wait_for_load_state("networkidle")
        shot.page.screenshot(path=str(out / f"request-undo-{label}.png"), full_page=True)
    world.approve(undo_id, "carol")
    world.approve(undo_id, "dave")
    world.exec_cli(undo_id, "alice", f"n-{undo_id}")
    wait_until(lambda: world.request(str(debit["id"]))["state"] == "rolled_back",
               "the debit to be rolled back", step=0.1)
    assert _balance(world, 51) == 100


def test_a_row_changed_since_is_named_and_nothing_is_applied(world: World,
                                                            consoles: Consoles) -> None:
    """Someone else moved the balance after the debit: the button answers undo_conflict
    naming the account by key, and the balance stays what they wrote."""
    _set_balance(world, 52, 100)
    debit = _applied(world, "UPDATE accounts SET balance = balance - 10 WHERE id = 52")
    _set_balance(world, 52, 70)
    alice = consoles("alice")
    alice.page.goto(f"/requests/{debit['id']}")
    alice.page.get_by_test_id("undo").click()
    error = alice.page.get_by_test_id("error").inner_text()
    assert "undo_conflict" in error and "id=52" in error, error
    assert _balance(world, 52) == 70
    assert world.request(str(debit["id"]))["state"] == "verified"
