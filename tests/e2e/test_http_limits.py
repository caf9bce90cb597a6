"""What the HTTP services take in: bodies bounded, input that cannot be stored refused, and
the requests list paged. Real `marque harbour serve` and `marque pilot serve` processes,
spoken to over HTTP (and the CLI's `marque requests` as a process).

A body over its endpoint's limit is `payload_too_large` (413) before any of it is parsed,
whether it says its length or arrives chunked; nothing of it is stored. A lone surrogate in
a string, or a sequence number past 64 bits, is `input_invalid` (400), never a 500.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import (
    MARQUE,
    READ,
    TIMEOUT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    new_public_key,
    request_body,
)

from marque.clients.harbour import HarbourClient
from marque.harbour.http import API_BODY_BYTES, FORM_BODY_BYTES, REPORTS_BODY_BYTES
from marque.harbour.intake import REASON_CHARS
from marque.harbour.views import REQUESTS_PAGE, REQUESTS_PAGE_MAX
from marque.pilot.http import BODY_BYTES

PROBLEM = "application/problem+json"
_ids = itertools.count(1)


@dataclass
class Stack:
    harbour: Harbour
    pilot: PilotBank
    server: HarbourServer

    def call(self, method: str, path: str, who: str, **kwargs: Any) -> httpx.Response:
        return self.server.call(method, path, self.harbour.tokens[who], **kwargs)

    def submit(self, who: str = "alice") -> dict[str, Any]:
        body = request_body(READ, request_id=f"limits-{next(_ids)}")
        answer = self.call("POST", "/v1/requests", who, json=body)
        assert answer.status_code == 201, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def stored(self) -> tuple[int, int]:
        """How many requests the admin sees, and the logbook's head seq."""
        head = self.call("GET", "/v1/logbook/head", "admin").json()["seq"]
        with HarbourClient(self.server.url, self.harbour.tokens["admin"]) as client:
            return len(client.list_requests()), head


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("http-limits")
    harbour = Harbour(root / "harbour")
    pilot = PilotBank(root / "p1", harbour)
    harbour.add("alice", "requester", key=pilot.holder_pub)
    harbour.add("bob", "requester", key=new_public_key(root / "bob.pub.jwk"))
    harbour.add("carol", "approver")
    harbour.add("p1", "pilot")
    pilot.start()
    server = HarbourServer(harbour.home)
    try:
        registered = server.call("POST", "/v1/pilots", harbour.tokens["p1"],
                                 json=pilot.registration())
        assert registered.status_code == 200, registered.text
        yield Stack(harbour, pilot, server)
    finally:
        assert server.stop() == 0
        pilot.stop()


def assert_problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text[:500]
    assert answer.headers["content-type"].split(";")[0] == PROBLEM
    body: dict[str, Any] = answer.json()
    assert body["status"] == status and body["code"] == code, body
    assert answer.headers.get("x-request-id")
    return body


def padded(size: int) -> bytes:
    """A JSON request body of ``size`` bytes (a valid submission, padded in its reason)."""
    base = request_body(READ, request_id=f"big-{next(_ids)}")
    base["reason"] = ""
    text = json.dumps(base).encode()
    base["reason"] = "x" * (size - len(text))
    out = json.dumps(base).encode()
    assert len(out) == size
    return out


def chunks(data: bytes, size: int = 256 * 1024) -> Iterator[bytes]:
    """``data`` as a chunked body (httpx sends an iterator without a Content-Length)."""
    for start in range(0, len(data), size):
        yield data[start:start + size]


# -- bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_request_body_over_the_apis_limit_is_413_and_nothing_is_stored(
        stack: Stack, framing: str) -> None:
    before = stack.stored()
    big = padded(API_BODY_BYTES + 1)
    content: Any = big if framing == "content-length" else chunks(big)
    answer = stack.call("POST", "/v1/requests", "alice", content=content,
                        headers={"content-type": "application/json"})
    body = assert_problem(answer, 413, "payload_too_large")
    assert body["limit"] == API_BODY_BYTES
    assert stack.stored() == before


def test_a_body_at_the_limit_is_read(stack: Stack) -> None:
    """Exactly the limit is not too large: it is read and judged (its reason is too long)."""
    answer = stack.call("POST", "/v1/requests", "alice", content=padded(API_BODY_BYTES),
                        headers={"content-type": "application/json"})
    assert_problem(answer, 400, "input_invalid")


def test_reports_have_their_own_larger_limit(stack: Stack) -> None:
    """A Pilot's batch of reports may be larger than another call, and is bounded too."""
    pad = "x" * (API_BODY_BYTES + 1)
    answer = stack.call("POST", "/v1/reports", "p1", json={"pilot_id": "p1", "reports": [],
                                                          "pad": pad})
    assert answer.status_code != 413, answer.text[:300]
    over = b'{"pilot_id": "p1", "reports": [], "pad": "' + b"x" * REPORTS_BODY_BYTES + b'"}'
    answer = stack.call("POST", "/v1/reports", "p1", content=chunks(over),
                        headers={"content-type": "application/json"})
    assert_problem(answer, 413, "payload_too_large")


def test_a_console_form_over_its_limit_is_413(stack: Stack) -> None:
    answer = stack.server.call("POST", "/login", data={"token": "t" * FORM_BODY_BYTES,
                                                       "csrf": "x"})
    assert_problem(answer, 413, "payload_too_large")


@pytest.mark.parametrize("path", ["/v1/executions", "/v1/previews"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_the_pilots_bodies_are_bounded_too(stack: Stack, path: str, framing: str) -> None:
    big = b'{"marque": "' + b"x" * BODY_BYTES + b'", "nonce": "n", "preview": "p"}'
    content: Any = big if framing == "content-length" else chunks(big)
    answer = httpx.post(stack.pilot.url + path, content=content, timeout=TIMEOUT,
                        headers={"content-type": "application/json"})
    body = assert_problem(answer, 413, "payload_too_large")
    assert body["limit"] == BODY_BYTES
    # The service goes on: a small body is read and judged as before.
    small = httpx.post(stack.pilot.url + path, json={"marque": 1}, timeout=TIMEOUT)
    assert_problem(small, 400, "input_invalid")


def test_a_reason_longer_than_its_limit_is_input_invalid(stack: Stack) -> None:
    rq = stack.submit()["id"]
    long = "r" * (REASON_CHARS + 1)
    for action in ("reject", "approve"):
        answer = stack.call("POST", f"/v1/requests/{rq}/{action}", "carol",
                            json={"reason": long})
        body = assert_problem(answer, 400, "input_invalid")
        assert body["limit"] == REASON_CHARS
    answer = stack.call("POST", f"/v1/requests/{rq}/expire", "admin", json={"reason": long})
    assert_problem(answer, 400, "input_invalid")


# -- input that cannot be stored --------------------------------------------------------


def test_a_lone_surrogate_in_any_string_is_input_invalid(stack: Stack) -> None:
    before = stack.stored()
    body = json.dumps(request_body(READ, request_id=f"sur-{next(_ids)}")).replace(
        '"a test"', '"\\ud800"')
    answer = stack.call("POST", "/v1/requests", "alice", content=body.encode(),
                        headers={"content-type": "application/json"})
    assert_problem(answer, 400, "input_invalid")
    rq = stack.submit()["id"]
    answer = stack.call("POST", f"/v1/requests/{rq}/reject", "carol",
                        content=b'{"reason": "no \\udfff"}')
    assert_problem(answer, 400, "input_invalid")
    # A pair of escapes is one character, and fine.
    answer = stack.call("POST", f"/v1/requests/{rq}/reject", "carol",
                        content=b'{"reason": "ok \\ud83d\\ude00"}')
    assert answer.status_code in (200, 409), answer.text
    assert stack.stored()[0] == before[0] + 1
    executed = httpx.post(stack.pilot.url + "/v1/executions", timeout=TIMEOUT,
                          content=b'{"marque": "m", "nonce": "\\ud800"}')
    assert_problem(executed, 400, "input_invalid")


@pytest.mark.parametrize("after", ["99999999999999999999999", "9223372036854775808", "-1",
                                   "1e3"])
def test_a_logbook_position_out_of_range_is_input_invalid(stack: Stack, after: str) -> None:
    answer = stack.call("GET", f"/v1/logbook?after={after}", "admin")
    assert_problem(answer, 400, "input_invalid")


def test_the_largest_logbook_position_is_an_empty_page(stack: Stack) -> None:
    answer = stack.call("GET", "/v1/logbook?after=9223372036854775807", "admin")
    assert answer.status_code == 200, answer.text
    assert answer.json()["entries"] == []


def test_the_consoles_logbook_position_out_of_range_is_a_400_page(stack: Stack) -> None:
    with httpx.Client(base_url=stack.server.url, timeout=TIMEOUT) as client:
        form = client.get("/login")
        match = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert match, form.text
        logged = client.post("/login", data={"token": stack.harbour.tokens["admin"],
                                             "csrf": match.group(1)})
        assert logged.status_code == 303, logged.text
        # The console's logbook pages back from the newest entries (`before`); a position
        # past any 64-bit number is a 400 page, never a server error.
        page = client.get("/logbook?before=99999999999999999999999")
        newest = client.get("/logbook?before=999999999999999999")
    assert page.status_code == 400, page.text[:500]
    assert "input_invalid" in page.text
    assert newest.status_code == 200, newest.text[:500]


# -- paging -----------------------------------------------------------------------------


def test_requests_are_listed_a_page_at_a_time(stack: Stack) -> None:
    mine = [stack.submit("bob")["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        answer = stack.call("GET", f"/v1/requests{query}", "bob")
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert set(page) == {"requests", "next"}
        assert len(page["requests"]) <= 2
        seen += [r["id"] for r in page["requests"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == list(reversed(mine))  # newest first, each once
    assert pages == 3
    # A request made meanwhile does not shift the pages after the first.
    first = stack.call("GET", "/v1/requests?limit=2", "bob").json()
    newer = stack.submit("bob")["id"]
    second = stack.call("GET", f"/v1/requests?limit=2&cursor={first['next']}", "bob").json()
    assert [r["id"] for r in second["requests"]] == list(reversed(mine))[2:4]
    assert newer == stack.call("GET", "/v1/requests?limit=1", "bob").json()["requests"][0]["id"]


def test_a_page_is_bounded_and_a_bad_cursor_or_limit_is_input_invalid(stack: Stack) -> None:
    for _ in range(2):
        stack.submit()
    answer = stack.call("GET", f"/v1/requests?limit={REQUESTS_PAGE_MAX * 10}", "admin")
    assert answer.status_code == 200 and len(answer.json()["requests"]) <= REQUESTS_PAGE_MAX
    assert len(stack.call("GET", "/v1/requests", "admin").json()["requests"]) <= REQUESTS_PAGE
    for query in ("cursor=nope", "cursor=W1tdXQ", "limit=0", "limit=x",
                  "limit=99999999999999999999999"):
        assert_problem(stack.call("GET", f"/v1/requests?{query}", "admin"), 400,
                       "input_invalid")


def _cli(stack: Stack, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(MARQUE), "requests", *args, "--json"], capture_output=True, text=True,
        timeout=TIMEOUT, stdin=subprocess.DEVNULL,
        env=cli_env({"MARQUE_HARBOUR": stack.server.url,
                     "MARQUE_TOKEN": stack.harbour.tokens["admin"]}))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    found: dict[str, Any] = json.loads(proc.stdout)  # exactly one JSON object
    return found


def test_the_cli_lists_every_page_or_the_newest_n(stack: Stack, tmp_path: Path) -> None:
    with HarbourClient(stack.server.url, stack.harbour.tokens["admin"]) as client:
        everything = [r["id"] for r in client.list_requests()]
        paged = [r["id"] for r in client.iter_requests(page=2)]
    assert paged == everything and len(everything) >= 3
    listed = _cli(stack)
    assert set(listed) == {"requests"}
    assert [r["id"] for r in listed["requests"]] == everything
    newest = _cli(stack, "--limit", "2")
    assert [r["id"] for r in newest["requests"]] == everything[:2]
    assert newest["more"] is True
    assert _cli(stack, "list", "--limit", str(len(everything)))["more"] is False
