"""The console in a real browser: what each viewer is offered, its icon, and phone width.

A viewer is shown a link only to a page they may open: each link shown opens (200), each
section not shown is refused by the core (403) — for a requester, an approver, an
auditor and an admin. At phone width the queue's cards name each field, and a long
unbroken error stays inside its card.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.harbour import DEBIT

from .conftest import DESKTOP, PHONE, Console, World

Consoles = Callable[..., Console]
SECTIONS = {"/": "Requests", "/pilots": "Pilots", "/logbook": "Logbook",
            "/notifications": "Notifications"}
#: Who may open which section (DESIGN §11.7).
MAY_OPEN = {
    "alice": {"/"},                           # a requester
    "carol": {"/", "/pilots"},                # an approver
    "audrey": {"/", "/pilots", "/logbook"},   # an auditor
    "admin": {"/", "/pilots", "/logbook", "/notifications"},
}
#: The queue's columns, as the desktop table heads them.
COLUMNS = ["Request", "State", "Change", "Asked by", "Target", "Approvals", "Created"]


@pytest.mark.parametrize("who", sorted(MAY_OPEN))
def test_each_viewer_is_shown_only_the_sections_they_may_open(
        world: World, consoles: Consoles, who: str) -> None:
    viewer = consoles(who)
    links = viewer.page.locator("nav.nav a")
    shown = {links.nth(i).get_attribute("href"): links.nth(i).inner_text().strip()
             for i in range(links.count())}
    assert set(shown) == MAY_OPEN[who], shown
    assert all(SECTIONS[href] == label for href, label in shown.items())
    for href in SECTIONS:
        answer = viewer.page.goto(href)
        assert answer is not None
        expected = 200 if href in MAY_OPEN[who] else 403
        assert answer.status == expected, (who, href, answer.status)


def test_the_console_has_an_icon_and_loads_without_a_404(world: World,
                                                         consoles: Consoles) -> None:
    carol = consoles(None)
    failed: list[str] = []
    carol.page.on("response", lambda r: failed.append(f"{r.status} {r.url}")
                  if r.status >= 400 else None)
    carol.page.on("console", lambda m: failed.append(m.text) if m.type == "error" else None)
    carol.login("carol")
    carol.page.goto("/")
    carol.page.wait_for_load_state("networkidle")
    icon = carol.context.request.get("/favicon.ico")
    assert icon.status == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.body().startswith(b"<svg")
    assert carol.page.locator("link[rel=icon]").get_attribute("href") == "/favicon.ico"
    assert failed == []


def test_at_phone_width_the_queues_cards_name_each_field(world: World,
                                                         consoles: Consoles) -> None:
    made = world.submit("alice", DEBIT)
    phone = consoles("carol", viewport=PHONE)
    row = phone.page.locator(f"[data-testid=all] tr[data-request='{made['id']}']")
    labels = row.locator(".cell-label")
    assert labels.count() == len(COLUMNS)
    for i, name in enumerate(COLUMNS):
        assert labels.nth(i).is_visible(), name
        assert labels.nth(i).inner_text().strip().lower() == name.lower()
    # On a desktop the table's own head names the columns; the labels are not shown.
    desk = consoles("carol", viewport=DESKTOP)
    row = desk.page.locator(f"[data-testid=all] tr[data-request='{made['id']}']")
    assert not any(row.locator(".cell-label").nth(i).is_visible() for i in range(len(COLUMNS)))


def _overflows(console: Console, selector: str) -> list[dict[str, Any]]:
    """Every element matching ``selector`` whose content is wider than its box."""
    found: list[dict[str, Any]] = console.page.evaluate(
        """(sel) => [...document.querySelectorAll(sel)]
              .map(el => ({scroll: el.scrollWidth, client: el.clientWidth,
                           text: el.textContent.slice(0, 80)}))
              .filter(m => m.scroll > m.client)""", selector)
    return found


def test_at_phone_width_a_long_unbroken_error_wraps_inside_its_card(
        world: World, consoles: Consoles) -> None:
    phone = consoles("carol", viewport=PHONE)
    answer = phone.page.goto("/requests/rq_" + "0" * 120)  # one word, no break in it
    assert answer is not None and answer.status == 404
    error = phone.page.get_by_test_id("error")
    assert "not_found" in error.inner_text()
    assert _overflows(phone, "[data-testid=error], [data-testid=error] *") == []
    width = phone.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"]
