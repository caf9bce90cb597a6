"""Screenshots of the console at desktop (1280×800) and phone (390 px) widths (issue 12).

The world is filled the way a team's would be: a change waiting for its second
approval with its preview, one verified, one whose outcome is unknown. Each page
is captured whole; the PNGs go to a temporary directory, or to the directory
named by ``MARQUE_CONSOLE_SCREENSHOTS`` (``scripts/console-screenshots`` points
it at ``docs/console/``, whose PNGs the README shows).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from .conftest import DEBIT_RETURNING, DESKTOP, PHONE, Console, World

PAGES = ("queue", "request", "pilots")


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, read from its IHDR chunk."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_screenshots_of_the_queue_a_request_and_the_pilots(
        world: World, consoles: Callable[..., Console], tmp_path: Path) -> None:
    """The queue, a request with its preview and the Pilots page render at 1280 px and at
    390 px wide, without sideways scrolling of the page, and are saved as PNGs."""
    out = Path(os.environ.get("MARQUE_CONSOLE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    verified = world.submit("alice", DEBIT_RETURNING, reason="refund ticket 4521")
    world.approve(verified["id"], "carol", "matches the ticket")
    world.approve(verified["id"], "dave", "checked the account")
    world.exec_cli(verified["id"], "alice", "n1")
    world.submit("alice", "UPDATE accounts SET balance = balance + 5 WHERE id = 2 "
                          "RETURNING id, balance", reason="goodwill credit, ticket 4533")
    waiting = world.submit("alice", "UPDATE accounts SET balance = balance + 25 WHERE id = 2 "
                                    "RETURNING id, balance",
                           reason="refund of a double charge (ticket 4540)")
    world.approve(waiting["id"], "carol", "the double charge is in the statement")
    paths = {"queue": "/", "request": f"/requests/{waiting['id']}", "pilots": "/pilots"}
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        console = consoles("dave", viewport=viewport)
        for name in PAGES:
            console.page.goto(paths[name])
            console.page.wait_for_load_state("networkidle")
            overflow = console.page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"{name} scrolls sideways at {label} width"
            target = out / f"{name}-{label}.png"
            console.page.screenshot(path=str(target), full_page=True)
            width, height = png_size(target)
            assert width == viewport["width"] and height >= viewport["height"] // 2
