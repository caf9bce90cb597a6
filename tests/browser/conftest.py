"""Browser tests of the web console: real processes, real Chromium (DESIGN §12, issue 12).

A module gets one world: a Harbourmaster home made by ``marque harbour init``
(SQLite store, a routing config asking two approvers for every write) with its
principals added through the CLI, ``marque harbour serve``, and a real Pilot
(``marque pilot join`` then ``marque pilot serve``) serving a SQLite bank, which
registers itself and delivers its execution reports to the Harbourmaster as in
production. Chromium is Debian's (``/usr/bin/chromium``, or ``MARQUE_CHROMIUM``),
driven by Playwright's sync API; one browser serves the whole session and each
test opens its own contexts (cookie jars), so sessions never leak between tests.
Nothing is mocked.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import (
    MARQUE,
    READS_ALLOWED,
    TIMEOUT,
    HarbourWorld,
    cli_env,
    request_body,
    routing_toml,
    writes_delegated,
)
from support.wait import wait_until

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("MARQUE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

#: Every write needs two distinct approvers, never the requester; reads are allowed.
ROUTING = routing_toml(READS_ALLOWED, writes_delegated(2, self_approval=False))

#: A write whose preview returns the changed row (a sample to read before approving).
DEBIT_RETURNING = "UPDATE accounts SET balance = balance - 10 WHERE id = 1 RETURNING id, balance"

_ids = itertools.count(1)


def fresh_id(prefix: str) -> str:
    """A request id no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


class World(HarbourWorld):
    """One Harbourmaster asking two approvers for every write (:data:`ROUTING`), one joined
    Pilot serving, and the principals: alice (requester, the bank's key), erin (requester
    and approver, a key of her own), carol and dave (approvers), audrey (auditor)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, routing=ROUTING, bank_dir="p1", third_account=False,
                         principals=(("erin", "requester", "approver"), ("carol", "approver"),
                                     ("dave", "approver"), ("audrey", "auditor")),
                         keyed=frozenset({"erin"}), serve=True)
        self.extra: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def store_path(self) -> Path:
        return self.harbour.home / "harbour.sqlite3"

    def token(self, who: str) -> str:
        return self.harbour.tokens[who]

    def api(self, method: str, path: str, who: str | None, **kwargs: Any) -> httpx.Response:
        """The Harbourmaster's JSON API, as ``who``."""
        return self.server.call(method, path, None if who is None else self.token(who),
                                **kwargs)

    def submit(self, who: str, sql: str, *, reason: str = "a test", expect: int = 201,
               request_id: str | None = None, max_rows: int = 1) -> dict[str, Any]:
        """``POST /v1/requests`` as ``who``; the request object."""
        body = request_body(sql, request_id=request_id or fresh_id("rq"), max_rows=max_rows)
        body["reason"] = reason
        answer = self.api("POST", "/v1/requests", who, json=body)
        assert answer.status_code == expect, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def request(self, id: str, who: str = "admin") -> dict[str, Any]:
        answer = self.api("GET", f"/v1/requests/{id}", who)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def approve(self, id: str, who: str, reason: str = "looks right") -> dict[str, Any]:
        answer = self.api("POST", f"/v1/requests/{id}/approve", who, json={"reason": reason})
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def exec_cli(self, id: str, who: str, nonce: str, *, expect: int = 0) -> dict[str, Any]:
        """The requester runs ``marque exec --request ID`` from the CLI (exiting ``expect``);
        its outcome."""
        proc = subprocess.run(
            [str(MARQUE), "exec", "--request", id, "--key", str(self.bank.holder_key),
             "--nonce", nonce, "--harbour", self.url, "--token", self.token(who), "--json"],
            capture_output=True, text=True, timeout=TIMEOUT, env=cli_env(),
            stdin=subprocess.DEVNULL)
        assert proc.returncode == expect, (proc.stdout, proc.stderr)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        outcome: dict[str, Any] = lines[-1]
        return outcome


def make_world(root: Path) -> Iterator[World]:
    """Build and run a world under ``root``; stop every process it started after."""
    world = World(root)
    try:
        wait_until(lambda: world.api(
            "GET", "/v1/pilots", "admin").json()["pilots"], "the Pilot's registration", step=0.1)
        yield world
    finally:
        world.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One world per test module (its servers are shared by the module's tests)."""
    yield from make_world(tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, launched once for the session."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.fail(f"Chromium is needed at {CHROMIUM}: run ./scripts/ensure-chromium")
    with playwright_sync.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


class Console:
    """One person's browser session (a context: its own cookies) on the console."""

    def __init__(self, browser: Any, world: World, who: str | None, *,
                 viewport: dict[str, int] | None = None, javascript: bool = True) -> None:
        self.world = world
        self.who = who
        self.context = browser.new_context(viewport=viewport or DESKTOP,
                                           base_url=world.url, java_script_enabled=javascript)
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message),
                                               dialog.dismiss()))
        if who is not None:
            self.login(who)

    def login(self, who: str) -> None:
        """Log in through the form with ``who``'s token (the login page already shown, if it is)."""
        if "/login" not in self.page.url:
            self.page.goto("/login")
        self.page.get_by_label("Principal token").fill(self.world.token(who))
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url(lambda url: "/login" not in url)

    def csrf(self) -> str:
        """This session's CSRF token, as its forms carry it."""
        token: str = self.page.locator("form[action='/logout'] input[name=csrf]").get_attribute(
            "value")
        return token

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def consoles(browser: Any, world: World) -> Iterator[Callable[..., Console]]:
    """``consoles(who)`` opens a logged-in browser session; all closed after the test."""
    opened: list[Console] = []

    def open_one(who: str | None, **kwargs: Any) -> Console:
        console = Console(browser, world, who, **kwargs)
        opened.append(console)
        return console

    try:
        yield open_one
    finally:
        for console in opened:
            console.close()
