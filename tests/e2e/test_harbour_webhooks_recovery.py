"""Webhooks when a `harbour serve` process dies mid-attempt, and when an endpoint never
answers: at least once, and a delivery that ends failed says so.

A process killed (SIGKILL) while its attempt is in the receiver's hands never recorded
the delivery; its lease runs out and the next process delivers the event again, with
the same `webhook-id` and body. A delivery refused past `--webhook-give-up` ends
`failed`: shown by `webhooks list`, the console and `/metrics`, and the request is
untouched.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import (
    DEBIT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_json,
    free_port,
    request_body,
)
from support.wait import wait_until
from webhook_receiver import Receiver

DEADLINE_SECONDS = 120.0  # past a lease (35 s) with room to spare


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Harbour, PilotBank]]:
    harbour = Harbour(tmp_path / "harbour")
    bank = PilotBank(tmp_path / "p1", harbour)
    harbour.add("alice", "requester", key=bank.holder_pub)
    harbour.add("bob", "approver")
    harbour.add("p1", "pilot")
    bank.start()
    try:
        yield harbour, bank
    finally:
        bank.stop()


def _awaiting(harbour: Harbour, server: HarbourServer, bank: PilotBank,
              request_id: str) -> dict[str, Any]:
    assert server.call("POST", "/v1/pilots", harbour.tokens["p1"],
                       json=bank.registration()).status_code == 200
    made = server.call("POST", "/v1/requests", harbour.tokens["alice"],
                       json=request_body(DEBIT, request_id=request_id))
    assert made.status_code == 201 and made.json()["state"] == "awaiting_approval", made.text
    found: dict[str, Any] = made.json()
    return found


def test_an_attempt_a_killed_process_held_is_delivered_again_with_its_id(
        site: tuple[Harbour, PilotBank]) -> None:
    harbour, bank = site
    port = free_port()
    hook = cli_json("harbour", "webhooks", "add", "--home", harbour.home,
                    f"http://127.0.0.1:{port}/hook")
    receiver = Receiver(port, {"/hook": hook["secret"]}, hold_seconds=3.0)
    receiver.start()
    # Both processes link to the console at one public address (as behind a proxy), so
    # their copies of an event are the same bytes.
    public = ("--public-url", "https://harbour.example.com")
    first = HarbourServer(harbour.home, args=public)
    second: HarbourServer | None = None
    try:
        request = _awaiting(harbour, first, bank, "debit-crash")
        assert wait_until(receiver.all, timeout=DEADLINE_SECONDS, step=0.2), \
            "the first attempt never arrived"
        first.stop(signal.SIGKILL)  # while the receiver still holds the attempt
        second = HarbourServer(harbour.home, args=public)

        def delivered() -> bool:
            listed = cli_json("harbour", "webhooks", "list", "--home", harbour.home)
            return bool(listed["webhooks"][0]["deliveries"] == {"delivered": 1})

        assert wait_until(delivered, timeout=DEADLINE_SECONDS, step=0.2), cli_json(
            "harbour", "webhooks", "list", "--home", harbour.home)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        receiver.stop()
    seen = receiver.all()
    assert len(seen) >= 2 and all(r.valid for r in seen)
    assert {r.message_id for r in seen} == {seen[0].message_id}
    assert {r.body for r in seen} == {seen[0].body}
    assert seen[0].json()["data"]["console_url"] == \
        f"https://harbour.example.com/requests/{request['id']}"


def test_a_delivery_refused_past_its_give_up_age_ends_failed_and_says_so(
        site: tuple[Harbour, PilotBank]) -> None:
    harbour, bank = site
    dead = free_port()
    hook = cli_json("harbour", "webhooks", "add", "--home", harbour.home,
                    f"http://127.0.0.1:{dead}/hook")
    server = HarbourServer(harbour.home, args=("--webhook-retry", "1s,1s",
                                               "--webhook-give-up", "2s"))
    try:
        request = _awaiting(harbour, server, bank, "debit-dead")

        def failed() -> bool:
            listed = cli_json("harbour", "webhooks", "list", "--home", harbour.home)
            return bool(listed["webhooks"][0]["deliveries"] == {"failed": 1})

        assert wait_until(failed, timeout=DEADLINE_SECONDS, step=0.2), cli_json(
            "harbour", "webhooks", "list", "--home", harbour.home)
        metrics = server.call("GET", "/metrics", harbour.tokens["admin"]).text
        assert re.search(r'marque_harbour_webhook_attempts_total\{outcome="gave_up"\} 1\.0',
                         metrics), metrics
        with httpx.Client(base_url=server.url, timeout=30) as console:
            csrf = re.search(r'name="csrf" value="([^"]+)"', console.get("/login").text)
            assert csrf is not None
            assert console.post("/login", data={"token": harbour.tokens["admin"],
                                                "csrf": csrf.group(1)}).status_code == 303
            page = console.get("/notifications").text
        failed_table = page.split('data-testid="failed-deliveries"', 1)[1]
        assert request["id"] in failed_table and "ConnectError" in failed_table
        shown = server.call("GET", f"/v1/requests/{request['id']}", harbour.tokens["bob"])
        assert shown.json()["state"] == "awaiting_approval"
        assert hook["id"] in page
    finally:
        server.stop()
