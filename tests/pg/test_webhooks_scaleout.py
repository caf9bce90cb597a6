"""Two `harbour serve` processes on ONE PostgreSQL store deliver each webhook once.

Both processes run the delivery thread over the same outbox. Every attempt is
claimed by a compare-and-set on the delivery's lease, so while one process is
posting an event (the receiver holds each answer a moment) the other never
posts it too: each event arrives once, signed, and none is lost.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.webhook_receiver import Receiver
from support.harbour import (
    DEBIT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_json,
    free_port,
    request_body,
)

REQUESTS = 12
DEADLINE_SECONDS = 120.0


@pytest.fixture
def pair(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Harbour, list[HarbourServer]]]:
    harbour = Harbour(tmp_path / "harbour", store=pg_dsn)
    pilot = PilotBank(tmp_path / "p1", harbour)
    harbour.add("alice", "requester", key=pilot.holder_pub)
    harbour.add("bob", "approver")
    harbour.add("p1", "pilot")
    pilot.start()
    servers: list[HarbourServer] = []
    try:
        servers += [HarbourServer(harbour.home), HarbourServer(harbour.home)]
        registered = servers[0].call("POST", "/v1/pilots", harbour.tokens["p1"],
                                     json=pilot.registration())
        assert registered.status_code == 200, registered.text
        yield harbour, servers
    finally:
        for server in servers:
            assert server.stop() == 0
        pilot.stop()


def test_two_processes_never_post_one_event_at_once(
        pair: tuple[Harbour, list[HarbourServer]]) -> None:
    harbour, servers = pair
    port = free_port()
    endpoint = cli_json("harbour", "webhooks", "add", "--home", harbour.home,
                        f"http://127.0.0.1:{port}/hook", "--event",
                        "request.awaiting_approval")
    receiver = Receiver(port, {"/hook": endpoint["secret"]}, hold_seconds=0.3)
    receiver.start()
    try:
        for n in range(REQUESTS):
            made = servers[n % 2].call("POST", "/v1/requests", harbour.tokens["alice"],
                                       json=request_body(DEBIT, request_id=f"debit-{n}"))
            assert made.status_code == 201 and made.json()["state"] == "awaiting_approval"
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            listed = cli_json("harbour", "webhooks", "list", "--home", harbour.home)
            if listed["webhooks"][0]["deliveries"] == {"delivered": REQUESTS} \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        receiver.stop()
    seen = receiver.all()
    assert all(r.valid for r in seen)
    copies = Counter(r.message_id for r in seen)
    assert len(copies) == REQUESTS, copies
    assert set(copies.values()) == {1}, copies  # each lease held while it was posted
    assert receiver.overlaps == 0
    [shown] = listed["webhooks"]
    assert shown["deliveries"] == {"delivered": REQUESTS}
