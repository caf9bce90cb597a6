"""Arbitrary input at every endpoint of a real `harbour serve` and a real `pilot serve`.

Hypothesis throws JSON values (valid bodies with one member replaced, any JSON at all, and
bytes that are not JSON), query strings, path segments and headers at each endpoint, as a
principal holding every role, so each call gets past authentication into its handler.
Whatever comes in, nothing answers 5xx, and every 4xx of the APIs is a problem document
with a `code`. (The console's pages answer errors as HTML pages; they must not be 5xx.)

`make test` runs a modest number of examples per endpoint; set `MARQUE_FUZZ_EXAMPLES`
(e.g. 2000) for a soak-style run.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.harbour import READ, TIMEOUT, Harbour, HarbourServer, PilotBank, request_body

EXAMPLES = int(os.environ.get("MARQUE_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get(
    "MARQUE_FUZZ_EXAMPLES"), suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.data_too_large])
PROBLEM = "application/problem+json"

#: Text of any code point, lone surrogates included (JSON escapes them as \uD800).
ANY_TEXT = (st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
            | st.sampled_from(["\ud800", "ok \udfff", "\x00", "\u0301e"]))
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
           | st.sampled_from(["", " ", "rq_", "0", "-1", "9" * 30, "x" * 5000]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(ANY_TEXT, inner, max_size=4), max_leaves=12)
#: Printable ASCII (what an HTTP header or a URL's query may carry as given).
ASCII = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40)


@dataclass
class World:
    harbour: Harbour
    server: HarbourServer
    pilot: PilotBank
    request_id: str
    #: One client for every call (a client per call would spend most of the time on setup).
    http: httpx.Client

    @property
    def token(self) -> str:
        return self.harbour.tokens["root"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("http-fuzz")
    harbour = Harbour(root / "harbour")
    pilot = PilotBank(root / "p1", harbour, pilot_id="root")
    harbour.add("root", "requester", "approver", "auditor", "admin", "pilot",
                key=pilot.holder_pub)
    pilot.start()
    server = HarbourServer(harbour.home)  # its stderr goes to a file: server.logged()
    try:
        assert server.call("POST", "/v1/pilots", harbour.tokens["root"],
                           json=pilot.registration()).status_code == 200
        made = server.call("POST", "/v1/requests", harbour.tokens["root"],
                           json=request_body(READ, pilot_id="root", request_id="fuzz-1"))
        assert made.status_code == 201, made.text
        with httpx.Client(timeout=TIMEOUT) as http:
            yield World(harbour, server, pilot, made.json()["id"], http)
    finally:
        assert server.stop() == 0
        pilot.stop()


def mutated(valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    """``valid`` with one member replaced by any JSON value, or dropped, or one added."""
    keys = sorted(valid)

    def replace(key: str, value: Any) -> dict[str, Any]:
        return {**valid, key: value}

    def drop(key: str) -> dict[str, Any]:
        return {k: v for k, v in valid.items() if k != key}

    return (st.builds(replace, st.sampled_from(keys), JSON)
            | st.builds(drop, st.sampled_from(keys))
            | st.builds(replace, ANY_TEXT, JSON))


def pct(text: str) -> str:
    """``text`` percent-encoded for a URL, a lone surrogate as the bytes it would take
    (``%ED%A0%80``: not UTF-8, as a careless client sends it)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def query_string(query: dict[str, str]) -> str:
    return "&".join(f"{pct(k)}={pct(v)}" for k, v in query.items())


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


def bodies(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Request bodies: near-valid JSON, any JSON, and bytes that may not be JSON at all."""
    return (mutated(valid).map(encoded) | JSON.map(encoded)
            | st.binary(max_size=64) | st.just(b'{"a": NaN}') | st.just(b"[" * 5000))


def segments(world_ids: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(world_ids) | ANY_TEXT.filter(bool)


def queries(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    keys = (st.sampled_from(names) | ASCII.filter(bool)) if names else ASCII.filter(bool)
    return st.dictionaries(keys,
                           ASCII | ANY_TEXT | st.sampled_from(["99999999999999999999999",
                                                              "-1", "0", "1e9", "true"]),
                           max_size=3)


def check(answer: httpx.Response, *, api: bool) -> None:
    """No 5xx; an API's 4xx is a problem document with a ``code``."""
    where = f"{answer.request.method} {answer.request.url}"
    assert answer.status_code < 500, (where, answer.status_code, answer.text[:800])
    if api and 400 <= answer.status_code < 500:
        assert answer.headers.get("content-type", "").split(";")[0] == PROBLEM, (where,
                                                                                 answer.text)
        body = answer.json()
        assert isinstance(body.get("code"), str) and body["code"], (where, body)
        assert body["status"] == answer.status_code, (where, body)


def send(http: httpx.Client, base: str, method: str, path: str, *, token: str | None = None,
         query: dict[str, str] | None = None, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    sent = dict(headers or {})
    if token is not None:
        sent.setdefault("Authorization", f"Bearer {token}")
    if body is not None:
        sent.setdefault("content-type", "application/json")
    url = base + path + (f"?{query_string(query)}" if query else "")
    return http.request(method, url, content=body, headers=sent)


# -- the Harbourmaster's API ---------------------------------------------------------------

#: (method, path with {id}, query parameters it reads, a valid body to mutate or None).
HARBOUR = [
    ("GET", "/v1/requests", ["state", "limit", "cursor"], None),
    ("POST", "/v1/requests", [], request_body(READ, pilot_id="root", request_id="fuzz-2")),
    ("GET", "/v1/requests/{id}", [], None),
    ("POST", "/v1/requests/{id}/approve", [], {"reason": "fine"}),
    ("POST", "/v1/requests/{id}/reject", [], {"reason": "no"}),
    ("POST", "/v1/requests/{id}/expire", [], {"reason": "old"}),
    ("POST", "/v1/requests/{id}/undo", [], {"reason": "put back", "request_id": "u-1"}),
    ("GET", "/v1/requests/{id}/marque", [], None),
    ("GET", "/v1/requests/{id}/logbook", [], None),
    ("POST", "/v1/pilots", [], {"pilot_id": "root", "url": "http://127.0.0.1:9",
                                "incarnation": "x", "targets": {"bank": {"dialect": "sqlite"}}}),
    ("GET", "/v1/pilots", [], None),
    ("POST", "/v1/reports", [], {"pilot_id": "root", "reports": [{"marque_id": "m"}]}),
    ("GET", "/v1/logbook", ["after", "limit", "kind"], None),
    ("GET", "/v1/logbook/head", [], None),
    ("GET", "/.well-known/jwks.json", [], None),
    ("GET", "/v1/health", [], None),
    ("GET", "/metrics", [], None),
    ("GET", "/v1/oidc", [], None),
    ("POST", "/v1/oidc/exchange", [], {"id_token": "a.b.c", "access_token": "t"}),
    ("POST", "/v1/oidc/logout", [], None),
]


@pytest.mark.parametrize(("method", "path", "params", "valid"), HARBOUR,
                         ids=[f"{m} {p}" for m, p, _, _ in HARBOUR])
def test_the_harbourmasters_api_answers_any_input_without_a_5xx(
        world: World, method: str, path: str, params: list[str],
        valid: dict[str, Any] | None) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        where = path
        if "{id}" in where:
            segment = data.draw(segments([world.request_id, "fuzz-1"]))
            where = where.replace("{id}", pct(segment))
        body = data.draw(bodies(valid)) if valid is not None else None
        headers = {}
        if path == "/v1/requests" and method == "POST":
            headers = data.draw(st.dictionaries(st.just("Idempotency-Key"),
                                                ASCII.map(str.strip).filter(bool), max_size=1))
        answer = send(world.http, world.server.url, method, where, token=world.token,
                      query=data.draw(queries(params)), body=body, headers=headers)
        check(answer, api=True)

    run()


# -- the console -------------------------------------------------------------------------

CONSOLE = [("/", ["state"]), ("/requests/{id}", ["done"]), ("/requests/{id}/live", []),
           ("/pilots", []), ("/logbook", ["after", "kind"]), ("/login", ["next", "why"]),
           ("/login/oidc", ["next"]), ("/oidc/callback", ["state", "code", "error"])]


def console_cookie(world: World) -> str:
    with httpx.Client(base_url=world.server.url, timeout=TIMEOUT) as client:
        form = client.get("/login")
        match = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert match, form.text
        logged = client.post("/login", data={"token": world.token, "csrf": match.group(1)})
        assert logged.status_code == 303, logged.text
        return "; ".join(f"{name}={value}" for name, value in client.cookies.items())


@pytest.mark.parametrize(("path", "params"), CONSOLE, ids=[p for p, _ in CONSOLE])
def test_the_consoles_pages_answer_any_query_without_a_5xx(
        world: World, path: str, params: list[str]) -> None:
    cookies = console_cookie(world)

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        where = path.replace("{id}", pct(data.draw(segments([world.request_id]))))
        query = query_string(data.draw(queries(params)))
        answer = world.http.get(f"{world.server.url}{where}?{query}",
                                headers={"cookie": cookies})
        check(answer, api=False)

    run()


@FUZZ
@given(form=st.dictionaries(st.sampled_from(["token", "csrf", "next", "reason"]) | ASCII,
                            ANY_TEXT, max_size=4))
def test_the_consoles_forms_answer_any_input_without_a_5xx(world: World,
                                                          form: dict[str, str]) -> None:
    for path in ("/login", "/logout", f"/requests/{world.request_id}/approve",
                 f"/requests/{world.request_id}/undo"):
        body = query_string(form)
        answer = world.http.post(
            world.server.url + path, content=body.encode(),
            headers={"content-type": "application/x-www-form-urlencoded"})
        check(answer, api=False)


# -- the Pilot's service -------------------------------------------------------------------

PILOT = [
    ("POST", "/v1/executions", ["events"], {"marque": "a.b.c", "nonce": "n", "proof": "p"}),
    ("GET", "/v1/executions/{id}/{nonce}", ["follow"], None),
    ("POST", "/v1/previews", [], {"preview": "a.b.c"}),
    ("GET", "/v1/marques/{id}", [], None),
    ("GET", "/v1/health", [], None),
    ("GET", "/metrics", [], None),
]


@pytest.mark.parametrize(("method", "path", "params", "valid"), PILOT,
                         ids=[f"{m} {p}" for m, p, _, _ in PILOT])
def test_the_pilots_service_answers_any_input_without_a_5xx(
        world: World, method: str, path: str, params: list[str],
        valid: dict[str, Any] | None) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        where = path
        for name in ("{id}", "{nonce}"):
            where = where.replace(name, pct(data.draw(segments(["m", "n"]))))
        body = data.draw(bodies(valid)) if valid is not None else None
        token = data.draw(st.none() | ASCII.map(str.strip).filter(bool))
        answer = send(world.http, world.pilot.url, method, where, token=token,
                      query=data.draw(queries(params)), body=body)
        check(answer, api=True)

    run()


def test_the_harbourmaster_logged_no_unexpected_error(world: World) -> None:
    """Nothing thrown at it above made the service log a traceback (an error after an
    answer had begun would not show as a 5xx)."""
    logged = world.server.logged()
    assert "Traceback" not in logged, logged
