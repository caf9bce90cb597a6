"""The console shows a preview's caveats beside it (DESIGN §10, §12): a clearly labelled
warning on the request page naming each caveat, and nothing for a preview without one.

The PNG of such a request page goes to a temporary directory, or to the directory named by
``MARQUE_CONSOLE_SCREENSHOTS`` (``scripts/console-screenshots`` points it at docs/console/).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from .conftest import DESKTOP, PHONE, Console, World


def _bank(world: World, *sql: str) -> None:
    conn = sqlite3.connect(world.bank.bank)
    try:
        with conn:
            for statement in sql:
                conn.execute(statement)
    finally:
        conn.close()


def test_the_request_page_warns_of_the_previews_caveats(
        world: World, consoles: Callable[..., Console], tmp_path: Path) -> None:
    """A write to a table with a trigger: the page says the preview may not show everything,
    names the trigger under its statement, and fits a phone's width; a write to a table
    without one shows no warning."""
    _bank(world, "CREATE TABLE IF NOT EXISTS audit (account INTEGER, at TEXT)",
          "CREATE TRIGGER IF NOT EXISTS accounts_audit AFTER UPDATE ON accounts "
          "BEGIN INSERT INTO audit VALUES (new.id, 'now'); END",
          "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, body TEXT)",
          "INSERT OR IGNORE INTO notes VALUES (1, '')")
    cautious = world.submit("alice", "UPDATE accounts SET balance = balance - 10 WHERE id = 1 "
                                     "RETURNING id, balance", reason="refund, ticket 4601")
    plain = world.submit("alice", "UPDATE notes SET body = 'called back' WHERE id = 1",
                         reason="note on ticket 4601")
    assert cautious["state"] == plain["state"] == "awaiting_approval"
    out = Path(os.environ.get("MARQUE_CONSOLE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        console = consoles("carol", viewport=viewport)
        console.page.goto(f"/requests/{cautious['id']}")
        warning = console.page.get_by_test_id("preview-caveats")
        assert warning.is_visible()
        assert "This preview may not show everything" in warning.inner_text()
        item = console.page.get_by_test_id("caveat-1-triggers")
        assert "main.accounts: accounts_audit" in item.inner_text()
        beside = console.page.get_by_test_id("statement-caveat-1")
        assert "triggers" in beside.inner_text()
        overflow = console.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the request page scrolls sideways at {label} width"
        console.page.screenshot(path=str(out / f"request-caveats-{label}.png"), full_page=True)
        console.page.goto(f"/requests/{plain['id']}")
        assert console.page.get_by_test_id("preview").is_visible()
        assert console.page.get_by_test_id("preview-caveats").count() == 0
