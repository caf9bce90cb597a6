"""Signed webhooks through real `harbour serve` and `pilot serve` processes.

A receiver on loopback verifies every signature from the Standard Webhooks
specification (the standard library's hmac; Marque signs with the
`standardwebhooks` package). It is down while the requests move, then takes
the first deliveries and answers 500 (so they must come again), then 200:
every event is delivered, none is lost, and every copy of one event carries
the same `webhook-id` and body. An endpoint that never answers holds nothing
up: not the requests, not the other endpoints.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import run_cli
from support.harbour import (
    DEBIT,
    Harbour,
    HarbourWorld,
    cli_json,
    execute_marque,
    free_port,
    request_body,
    wait_for_request,
)
from support.wait import wait_until
from webhook_receiver import Receiver, verify_signature

#: Long enough for every retry to come round several times (each is at most 2 s apart).
DEADLINE_SECONDS = 120.0
EXPECTED = sorted(["request.awaiting_approval", "request.awaiting_approval",
                   "request.rejected", "request.approved", "request.executed"])


class Stack(HarbourWorld):
    """A Harbourmaster served with fast webhook retries, and its Pilot p1 serving a bank;
    alice requests (holding the bank's key), bob approves."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, bank_dir="site", trust=False, third_account=False,
                         harbour_args=("--webhook-retry", "1s,2s"), serve=True)

    def call(self, method: str, path: str, who: str, **kwargs: Any) -> httpx.Response:
        return self.server.call(method, path, self.harbour.tokens[who], **kwargs)

    def webhook(self, url: str, *args: str) -> dict[str, Any]:
        return cli_json("harbour", "webhooks", "add", "--home", self.harbour.home, url, *args)

    def listed(self) -> dict[str, dict[str, Any]]:
        shown = cli_json("harbour", "webhooks", "list", "--home", self.harbour.home)
        return {item["id"]: item for item in shown["webhooks"]}

    def metrics(self) -> str:
        answer = self.call("GET", "/metrics", "admin")
        assert answer.status_code == 200, answer.text
        return answer.text


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    made = Stack(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def console_page(stack: Stack, who: str, path: str) -> httpx.Response:
    """``path`` of the console, as ``who`` logged in with their token."""
    with httpx.Client(base_url=stack.server.url, timeout=30) as console:
        form = console.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        logged_in = console.post("/login", data={"token": stack.harbour.tokens[who],
                                                 "csrf": csrf.group(1)})
        assert logged_in.status_code == 303, logged_in.text
        return console.get(path)


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` with exactly ``labels`` (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_event_is_delivered_signed_once_the_receiver_comes_back(stack: Stack) -> None:
    """Two requests live their lives while the receiver is down; once it is up (answering
    500, then 200) every event reaches both of its endpoints, verified, none lost, copies of
    one event with one id and one body; a dead third endpoint never held anything up."""
    port, dead = free_port(), free_port()
    generic = stack.webhook(f"http://127.0.0.1:{port}/json")
    slack = stack.webhook(f"http://127.0.0.1:{port}/slack", "--format", "slack")
    never = stack.webhook(f"http://127.0.0.1:{dead}/dead")
    receiver = Receiver(port, {"/json": generic["secret"], "/slack": slack["secret"]},
                        fail_first=3)

    # The requests move while no endpoint answers: a failing endpoint blocks no request.
    first = stack.call("POST", "/v1/requests", "alice",
                       json=request_body(DEBIT, request_id="debit-1")).json()
    second = stack.call("POST", "/v1/requests", "alice",
                        json=request_body(DEBIT, request_id="debit-2", max_rows=2)).json()
    assert first["state"] == second["state"] == "awaiting_approval", (first, second)
    rejected = stack.call("POST", f"/v1/requests/{second['id']}/reject", "bob",
                          json={"reason": "not today"})
    assert rejected.status_code == 200 and rejected.json()["state"] == "rejected"
    approved = stack.call("POST", f"/v1/requests/{first['id']}/approve", "bob", json={})
    assert approved.status_code == 200 and approved.json()["state"] == "prepared"
    marque = stack.call("GET", f"/v1/requests/{first['id']}/marque", "alice").json()
    outcome = execute_marque(stack.bank.url, stack.bank.holder_key, marque["marque"], "n-1")
    assert outcome["status"] == "applied", outcome
    shown = wait_for_request(stack.server.call, first["id"], stack.harbour.tokens["alice"],
                             lambda r: r["state"] == "verified", 60)
    assert shown["state"] == "verified", shown

    # Retried while down: several attempts failed, none was taken as delivered.
    assert wait_until(lambda: _metric(stack.metrics(), "marque_harbour_webhook_attempts_total",
                                      outcome="retrying") >= 6, timeout=DEADLINE_SECONDS, step=0.2)
    assert stack.listed()[generic["id"]]["deliveries"] == {"pending": 5}

    receiver.start()
    try:
        def settled() -> bool:
            listed = stack.listed()
            return all(listed[e["id"]]["deliveries"] == {"delivered": 5}
                       for e in (generic, slack))
        assert wait_until(settled, timeout=DEADLINE_SECONDS, step=0.2), stack.listed()
        seen = receiver.all()
    finally:
        receiver.stop()

    assert seen and all(r.valid for r in seen), [r for r in seen if not r.valid]
    by_id: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for r in seen:
        by_id[(r.path, r.message_id)].append(r.body)
    # The three answered 500 came again: same id, same body, every time.
    assert sum(len(bodies) - 1 for bodies in by_id.values()) >= 3
    assert all(len(set(bodies)) == 1 for bodies in by_id.values())
    events = {r.message_id: r.json() for r in receiver.accepted("/json")}
    assert sorted(e["type"] for e in events.values()) == EXPECTED
    assert all(e["id"] == message_id for message_id, e in events.items())
    slack_ids = {r.message_id for r in receiver.accepted("/slack")}
    assert slack_ids == set(events), "one event, one id, on every endpoint"

    waiting = [e for e in events.values() if e["type"] == "request.awaiting_approval"
               and e["data"]["request"]["id"] == first["id"]]
    assert waiting[0]["data"]["approvers"] == ["bob"]
    assert waiting[0]["data"]["request"]["diff"]["total_rows"] == 1
    assert waiting[0]["data"]["console_url"] == f"{stack.server.url}/requests/{first['id']}"
    executed = next(e for e in events.values() if e["type"] == "request.executed")
    assert executed["data"]["request"]["state"] == "verified"
    texts = [r.json()["text"] for r in receiver.accepted("/slack")]
    approval = next(t for t in texts if "Approval needed" in t and first["id"] in t)
    assert f"<{stack.server.url}/requests/{first['id']}|" in approval
    assert "UPDATE accounts SET balance = balance - 10 WHERE id = 1" in approval

    # The dead endpoint is still retrying all five, and says so; the others are done.
    listed = stack.listed()
    assert listed[never["id"]]["deliveries"] == {"pending": 5}
    text = stack.metrics()
    for endpoint in (generic, slack):
        assert _metric(text, "marque_harbour_webhook_deliveries", endpoint=endpoint["id"],
                       state="delivered") == 5
    assert _metric(text, "marque_harbour_webhook_deliveries", endpoint=never["id"],
                   state="pending") == 5
    assert _metric(text, "marque_harbour_webhook_oldest_pending_seconds",
                   endpoint=never["id"]) > 0
    assert _metric(text, "marque_harbour_webhook_attempts_total", outcome="delivered") >= 10

    # The console's admin page says the same: who is done, who is being retried and why.
    page = console_page(stack, "admin", "/notifications")
    assert page.status_code == 200, page.text
    dead_row = page.text.split(f'data-endpoint="{never["id"]}"', 1)[1].split("</tr>", 1)[0]
    assert "5 retrying" in dead_row and f"http://127.0.0.1:{dead}/…" in dead_row
    retrying = page.text.split('data-testid="retrying-deliveries"', 1)[1]
    assert "ConnectError" in retrying and first["id"] in retrying
    live_row = page.text.split(f'data-endpoint="{generic["id"]}"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'data-testid="delivered">5<', live_row), live_row
    assert generic["secret"] not in page.text
    assert console_page(stack, "alice", "/notifications").status_code == 403


def test_webhooks_commands(tmp_path: Path) -> None:
    """add checks its URL and makes a secret shown once (or reads one); list never shows a
    secret; test posts a signed webhook.test (exit 7 when nobody accepts it); remove."""
    harbour = Harbour(tmp_path / "harbour")
    home = harbour.home
    refused = run_cli("harbour", "webhooks", "add", "--home", home,
                      "http://hooks.example.com/x", "--json")
    assert refused.returncode == 2 and '"input_invalid"' in refused.stdout
    assert run_cli("harbour", "webhooks", "add", "--home", home, "https://u:p@example.com/",
                   "--json").returncode == 2
    port = free_port()
    made = cli_json("harbour", "webhooks", "add", "--home", home,
                    f"http://127.0.0.1:{port}/hook", "--event", "request.approved")
    assert made["secret"].startswith("whsec_") and made["events"] == ["request.approved"]
    secret_file = tmp_path / "secret"
    secret_file.write_text("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" + "\n")
    brought = cli_json("harbour", "webhooks", "add", "--home", home,
                       "https://hooks.example.com/services/x", "--format", "slack",
                       "--secret-file", secret_file)
    assert "secret" not in brought
    listed = run_cli("harbour", "webhooks", "list", "--home", home, "--json")
    assert listed.returncode == 0 and made["secret"] not in listed.stdout
    assert "QUJDREVG" not in listed.stdout
    assert len(json.loads(listed.stdout)["webhooks"]) == 2

    nobody = run_cli("harbour", "webhooks", "test", "--home", home, made["id"], "--json")
    assert nobody.returncode == 7 and '"webhook_delivery_failed"' in nobody.stdout
    receiver = Receiver(port, {"/hook": made["secret"]})
    receiver.start()
    try:
        tested = cli_json("harbour", "webhooks", "test", "--home", home, made["id"])
    finally:
        receiver.stop()
    [got] = receiver.all()
    assert tested["delivered"] and tested["webhook_id"] == got.message_id and got.valid
    assert got.json()["type"] == "webhook.test"
    # Signed with this endpoint's secret, not any other's.
    assert not verify_signature(secret_file.read_text().strip(), got.message_id,
                                got.timestamp, got.signature, got.body)

    removed = cli_json("harbour", "webhooks", "remove", "--home", home, made["id"])
    assert removed["removed_at"] is not None
    assert [w["id"] for w in cli_json("harbour", "webhooks", "list", "--home",
                                      home)["webhooks"]] == [brought["id"]]
    again = run_cli("harbour", "webhooks", "remove", "--home", home, made["id"], "--json")
    assert again.returncode == 2 and '"not_found"' in again.stdout
