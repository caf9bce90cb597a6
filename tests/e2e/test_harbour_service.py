"""`marque harbour serve`: the Harbourmaster's HTTP API as a real process (issue 11).

One Harbourmaster home (SQLite store) and one real Pilot serving a SQLite bank
are made through the CLI for the whole module; the Harbourmaster is served by
`marque harbour serve` and spoken to over HTTP only. Tests that change state
make their own requests, so they do not depend on each other's order.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.harbour import (
    DEBIT,
    READ,
    READS_ALLOWED,
    WRITES_DENIED,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    new_public_key,
    request_body,
    routing_toml,
)

from marque.logbook.heads import verify_head
from marque.token import TrustedKeys, unverified_claims

PROBLEM = "application/problem+json"
#: One principal per role, and the token of a principal revoked after it was added.
BY_ROLE = {"requester": "alice", "approver": "carol", "auditor": "audrey", "admin": "admin",
           "pilot": "p1"}
CALLERS = ("none", "revoked", *BY_ROLE)


@dataclass
class Setup:
    harbour: Harbour
    pilot: PilotBank
    server: HarbourServer

    def token(self, who: str) -> str | None:
        """The token of a principal, a role's principal, ``none`` or ``revoked``."""
        if who == "none":
            return None
        return self.harbour.tokens[BY_ROLE.get(who, who)]

    def call(self, method: str, path: str, who: str, **kwargs: Any) -> httpx.Response:
        return self.server.call(method, path, self.token(who), **kwargs)


_ids = itertools.count(1)


def fresh_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("harbour-service")
    harbour = Harbour(root / "harbour")
    pilot = PilotBank(root / "p1", harbour)
    holder_pub = pilot.holder_pub
    harbour.add("alice", "requester", key=holder_pub)
    harbour.add("bob", "requester", key=new_public_key(root / "bob.pub.jwk"))
    harbour.add("carol", "approver")
    harbour.add("dave", "approver")
    harbour.add("audrey", "auditor")
    harbour.add("p1", "pilot")
    harbour.add("p2", "pilot")
    harbour.add("revoked", "requester", "approver", "auditor", "admin", "pilot",
                key=new_public_key(root / "revoked.pub.jwk"))
    harbour.revoke("revoked")
    pilot.start()
    server = HarbourServer(harbour.home)
    try:
        registered = server.call("POST", "/v1/pilots", harbour.tokens["p1"],
                                 json=pilot.registration())
        assert registered.status_code == 200, registered.text
        yield Setup(harbour, pilot, server)
    finally:
        status = server.stop()
        pilot.stop()
    assert status == 0, "SIGTERM must stop `harbour serve` in order (exit 0)"


def submit(setup: Setup, sql: str, who: str = "alice", *, expect: int = 201,
           **kwargs: Any) -> dict[str, Any]:
    """POST /v1/requests as ``who``; the request object (``expect`` is the status)."""
    body = request_body(sql, request_id=kwargs.pop("request_id", None) or fresh_id("rq"),
                        **kwargs)
    answer = setup.call("POST", "/v1/requests", who, json=body)
    assert answer.status_code == expect, answer.text
    found: dict[str, Any] = answer.json()
    return found


def assert_problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``answer`` is an RFC 9457 problem document of ``status`` and ``code``."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].split(";")[0] == PROBLEM
    body: dict[str, Any] = answer.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["type"] == f"urn:marque:error:{code}"
    assert isinstance(body["title"], str) and isinstance(body["detail"], str)
    assert answer.headers.get("x-request-id")
    return body


# -- access: every endpoint × every kind of caller ----------------------------------------


@dataclass
class Case:
    method: str
    path: str
    allowed: tuple[str, ...]
    body: dict[str, Any] | None = None
    #: What an authenticated caller without access gets: 403, or 404 where ids must not leak.
    refused: int = 403
    #: What an allowed caller gets.
    success: tuple[int, ...] = (200, 201)


def make_case(setup: Setup, endpoint: str) -> Case:
    """The endpoint's call, made on fresh state where a success changes something."""
    everyone_reading = ("requester", "approver", "auditor", "admin")
    if endpoint == "POST /v1/requests":
        return Case("POST", "/v1/requests", ("requester",),
                    request_body(READ, request_id=fresh_id("matrix")))
    if endpoint == "GET /v1/requests":
        return Case("GET", "/v1/requests", everyone_reading)
    if endpoint == "GET /v1/requests/{id}":
        mine = submit(setup, READ)
        return Case("GET", f"/v1/requests/{mine['id']}", everyone_reading)
    if endpoint == "GET logbook of a request":
        mine = submit(setup, READ)
        return Case("GET", f"/v1/requests/{mine['id']}/logbook", everyone_reading)
    if endpoint in ("POST approve", "POST reject"):
        waiting = submit(setup, DEBIT)
        assert waiting["state"] == "awaiting_approval", waiting
        verb = endpoint.split()[1]
        return Case("POST", f"/v1/requests/{waiting['id']}/{verb}", ("approver",),
                    {"reason": "matrix"})
    if endpoint == "POST expire":
        # Its marque has not expired, so the admin gets past access and is then refused by
        # ADR-038's primitive (the marque may still run): 409, the request unchanged.
        prepared = submit(setup, READ)
        assert prepared["state"] == "prepared", prepared
        return Case("POST", f"/v1/requests/{prepared['id']}/expire", ("admin",),
                    {"reason": "matrix"}, success=(409,))
    if endpoint == "GET marque":
        prepared = submit(setup, READ)
        return Case("GET", f"/v1/requests/{prepared['id']}/marque", ("requester",),
                    refused=404)
    if endpoint == "POST /v1/pilots":
        return Case("POST", "/v1/pilots", ("pilot",), setup.pilot.registration())
    if endpoint == "GET /v1/pilots":
        return Case("GET", "/v1/pilots", ("approver", "auditor", "admin"))
    if endpoint == "POST /v1/reports":
        return Case("POST", "/v1/reports", ("pilot",), {"pilot_id": "p1", "reports": []})
    if endpoint in ("GET /v1/logbook", "GET /v1/logbook/head", "GET /metrics"):
        return Case("GET", endpoint.split()[1], ("auditor", "admin"))
    raise AssertionError(endpoint)


ENDPOINTS = ("POST /v1/requests", "GET /v1/requests", "GET /v1/requests/{id}",
             "GET logbook of a request", "POST approve",
             "POST reject", "POST expire", "GET marque", "POST /v1/pilots", "GET /v1/pilots",
             "POST /v1/reports", "GET /v1/logbook", "GET /v1/logbook/head", "GET /metrics")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_access_matrix(setup: Setup, endpoint: str) -> None:
    """No token or a revoked one → 401; a role without access → 403 (404 for a marque that
    is not yours); each allowed role → success. Refused callers go first: they change
    nothing the allowed caller then relies on."""
    case = make_case(setup, endpoint)
    refused = [c for c in CALLERS if c not in case.allowed]
    for caller in [*refused, *case.allowed]:
        kwargs = {} if case.body is None else {"json": case.body}
        answer = setup.call(case.method, case.path, caller, **kwargs)
        if caller in ("none", "revoked"):
            assert_problem(answer, 401, "unauthenticated")
            assert answer.headers["www-authenticate"].startswith("Bearer")
        elif caller not in case.allowed:
            assert_problem(answer, case.refused,
                           "forbidden" if case.refused == 403 else "not_found")
        else:
            assert answer.status_code in case.success, (caller, answer.text)
    if endpoint == "POST approve":
        assert answer.json()["state"] == "prepared"
    if endpoint == "POST reject":
        assert answer.json()["state"] == "rejected"
    if endpoint == "POST expire":
        assert answer.json()["reason"] == "marque_unexpired"
        path = case.path.removesuffix("/expire")
        assert setup.call("GET", path, "admin").json()["state"] == "prepared"


@pytest.mark.parametrize("header", ["Basic YWxpY2U6cHc=", "Bearer", "Bearer mqh_not-a-token"])
def test_a_malformed_or_unknown_bearer_is_unauthenticated(setup: Setup, header: str) -> None:
    answer = httpx.get(setup.server.url + "/v1/requests", headers={"Authorization": header})
    assert_problem(answer, 401, "unauthenticated")


def test_health_and_jwks_need_no_token(setup: Setup) -> None:
    health = httpx.get(setup.server.url + "/v1/health")
    assert health.status_code == 200
    assert health.json() == {"harbour_id": setup.harbour.harbour_id, "store": "ok"}
    jwks = httpx.get(setup.server.url + "/.well-known/jwks.json")
    assert jwks.status_code == 200
    [key] = jwks.json()["keys"]
    issuer = json.loads(setup.harbour.issuer_key.read_text())
    assert key["x"] == issuer["x"] and "d" not in key


def test_the_apis_unknown_paths_and_methods_are_problems(setup: Setup) -> None:
    """Under /v1/ the router's own 404 and 405 are problem documents like every other
    error of the API (with Allow kept); a page path outside it is the console's."""
    missing = httpx.get(setup.server.url + "/v1/nothing-here")
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    assert missing.headers["content-type"] == "application/problem+json"
    wrong = httpx.delete(setup.server.url + "/v1/logbook")
    assert (wrong.status_code, wrong.json()["code"]) == (405, "method_not_allowed")
    assert "GET" in wrong.headers["allow"]
    page = httpx.get(setup.server.url + "/no-such-page")
    assert page.status_code == 404
    assert page.headers["content-type"] != "application/problem+json"


# -- ownership: requests and marques of others do not leak ----------------------------------


def test_a_requester_cannot_see_another_requesters_request_or_marque(setup: Setup) -> None:
    mine = submit(setup, READ, request_id="alice-own")
    rq = mine["id"]
    assert mine["principal"] == "alice" and mine["state"] == "prepared"

    for path in (f"/v1/requests/{rq}", f"/v1/requests/{rq}/marque",
                 "/v1/requests/alice-own"):
        assert_problem(setup.call("GET", path, "bob"), 404, "not_found")
    listed = setup.call("GET", "/v1/requests", "bob").json()["requests"]
    assert rq not in {r["id"] for r in listed}
    assert {r["principal"] for r in listed} <= {"bob"}

    # Alice finds it by its id and by her own request id; the approver by its id.
    assert setup.call("GET", "/v1/requests/alice-own", "alice").json()["id"] == rq
    assert setup.call("GET", f"/v1/requests/{rq}", "carol").json()["id"] == rq
    assert rq in {r["id"] for r in setup.call("GET", "/v1/requests", "alice").json()["requests"]}
    assert_problem(setup.call("GET", f"/v1/requests/{rq}/logbook", "bob"), 404, "not_found")
    # Its own logbook entries: for its requester and for the readers, the same ones.
    own = setup.call("GET", f"/v1/requests/{rq}/logbook", "alice").json()
    assert own["id"] == rq and own == setup.call(
        "GET", f"/v1/requests/{rq}/logbook", "carol").json()
    assert {e["subject"] for e in own["entries"]} == {rq}
    assert [e["kind"] for e in own["entries"]][-1] == "marque.issued"
    assert own["next_after"] is None  # the whole of it: nothing follows
    # A page at a time, never a silent cut: the pages together are the whole.
    first = setup.call("GET", f"/v1/requests/{rq}/logbook?limit=1", "alice").json()
    assert first["entries"] == own["entries"][:1] and first["next_after"] is not None
    rest = setup.call("GET", f"/v1/requests/{rq}/logbook?after={first['next_after']}",
                      "alice").json()
    assert first["entries"] + rest["entries"] == own["entries"] and rest["next_after"] is None
    assert_problem(setup.call("GET", f"/v1/requests/{rq}/logbook?after=-1", "alice"), 400,
                   "input_invalid")
    marque = setup.call("GET", f"/v1/requests/{rq}/marque", "alice")
    assert marque.status_code == 200, marque.text
    claims = unverified_claims(marque.json()["marque"])
    assert claims is not None and claims["jti"] == marque.json()["marque_id"] == mine["marque_id"]


def test_a_pilot_principal_acts_only_for_its_own_pilot_id(setup: Setup) -> None:
    for_p1 = setup.pilot.registration()
    assert_problem(setup.call("POST", "/v1/pilots", "p2", json=for_p1), 403, "forbidden")
    assert_problem(setup.call("POST", "/v1/reports", "p2",
                              json={"pilot_id": "p1", "reports": []}), 403, "forbidden")
    pilots = setup.call("GET", "/v1/pilots", "admin").json()["pilots"]
    [p1] = [p for p in pilots if p["pilot_id"] == "p1"]
    assert p1["url"] == setup.pilot.url and p1["incarnation"] == setup.pilot.incarnation


# -- requests end to end over HTTP ------------------------------------------------------------


def test_a_delegated_request_is_previewed_approved_and_its_marque_handed_out(
        setup: Setup) -> None:
    waiting = submit(setup, DEBIT, request_id="debit-approved")
    assert waiting["state"] == "awaiting_approval"
    assert waiting["routing"]["outcome"] == "delegate"
    assert waiting["preview"] is not None and waiting["checkpoint"]["cid"]
    assert_problem(setup.call("GET", f"/v1/requests/{waiting['id']}/marque", "alice"),
                   409, "conflict")
    assert setup.pilot.balances() == {1: 100, 2: 100}  # a preview is rolled back

    approved = setup.call("POST", f"/v1/requests/{waiting['id']}/approve", "carol",
                          json={"reason": "looks right"})
    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert body["state"] == "prepared" and body["marque_id"]
    assert [r["approver"] for r in body["resolutions"]] == ["carol"]
    # Not awaiting approval any more: a second approver is told so.
    assert_problem(setup.call("POST", f"/v1/requests/{waiting['id']}/approve", "dave",
                              json={}), 409, "conflict")
    marque = setup.call("GET", f"/v1/requests/{waiting['id']}/marque", "alice").json()
    assert marque["marque_id"] == body["marque_id"]
    assert marque["pilot"] == {"id": "p1", "url": setup.pilot.url,
                               "incarnation": setup.pilot.incarnation}
    assert marque["target"] == "bank"


def test_a_requester_who_is_also_an_approver_cannot_approve_their_own_request(
        setup: Setup, tmp_path: Path) -> None:
    """The role does not lift the rule: 403 self_approval, and the request keeps waiting."""
    setup.harbour.add("erin", "requester", "approver",
                      key=new_public_key(tmp_path / "erin.pub.jwk"))
    own = submit(setup, DEBIT, who="erin")
    refused = setup.call("POST", f"/v1/requests/{own['id']}/approve", "erin", json={})
    assert_problem(refused, 403, "self_approval")
    after = setup.call("GET", f"/v1/requests/{own['id']}", "erin").json()
    assert after["state"] == "awaiting_approval" and after["resolutions"] == []


def test_a_rejected_request_says_why(setup: Setup) -> None:
    waiting = submit(setup, DEBIT)
    missing = setup.call("POST", f"/v1/requests/{waiting['id']}/reject", "carol", json={})
    assert_problem(missing, 400, "input_invalid")
    rejected = setup.call("POST", f"/v1/requests/{waiting['id']}/reject", "carol",
                          json={"reason": "not today"})
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["state"] == "rejected"
    assert rejected.json()["failure"]["code"] == "delegation_rejected"
    states = setup.call("GET", "/v1/requests?state=rejected", "audrey").json()["requests"]
    assert waiting["id"] in {r["id"] for r in states}
    assert {r["state"] for r in states} == {"rejected"}


def test_the_same_request_again_is_the_same_request(setup: Setup) -> None:
    body = request_body(READ)
    first = setup.call("POST", "/v1/requests", "alice", json=body,
                       headers={"Idempotency-Key": '"same-again"'})
    assert first.status_code == 201, first.text
    again = setup.call("POST", "/v1/requests", "alice", json=body,
                       headers={"Idempotency-Key": '"same-again"'})
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["request_id"] == "same-again"

    # Another intent under the same request id: 422, never a second request.
    other = request_body("SELECT balance FROM accounts WHERE id = 2")
    conflict = setup.call("POST", "/v1/requests", "alice", json=other,
                          headers={"Idempotency-Key": '"same-again"'})
    assert_problem(conflict, 422, "conflict")
    # The same request id is another logical request for another requester.
    bobs = setup.call("POST", "/v1/requests", "bob", json=other,
                      headers={"Idempotency-Key": '"same-again"'})
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]


@pytest.mark.parametrize("headers,body_id", [
    ({}, None),                                          # neither
    ({"Idempotency-Key": '"key-a"'}, "key-b"),          # both, different
    ({"Idempotency-Key": "unquoted"}, None),             # not an RFC 8941 string
    ({"Idempotency-Key": '"bad\\n"'}, None),             # an escape RFC 8941 has not
])
def test_the_request_id_must_be_given_once_and_well(setup: Setup, headers: dict[str, str],
                                                    body_id: str | None) -> None:
    body = request_body(READ)
    body.pop("request_id", None)
    if body_id is not None:
        body["request_id"] = body_id
    answer = setup.call("POST", "/v1/requests", "alice", json=body, headers=headers)
    assert_problem(answer, 400, "request_id_invalid")


def test_the_request_id_may_travel_in_both_places_when_equal(setup: Setup) -> None:
    body = request_body(READ, request_id="both-places")
    answer = setup.call("POST", "/v1/requests", "alice", json=body,
                        headers={"Idempotency-Key": '"both-places"'})
    assert answer.status_code == 201, answer.text
    assert answer.json()["request_id"] == "both-places"


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b'"a string"', b"", b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_input_invalid(setup: Setup,
                                                           content: bytes) -> None:
    for method, path, who in (("POST", "/v1/requests", "alice"),
                              ("POST", "/v1/pilots", "p1"),
                              ("POST", "/v1/reports", "p1")):
        answer = setup.call(method, path, who, content=content,
                            headers={"Content-Type": "application/json",
                                     "Idempotency-Key": '"shape"'})
        assert_problem(answer, 400, "input_invalid")


def test_a_request_for_an_unknown_pilot_is_input_invalid(setup: Setup) -> None:
    body = request_body(READ, pilot_id="nowhere", request_id=fresh_id("lost"))
    assert_problem(setup.call("POST", "/v1/requests", "alice", json=body), 400,
                   "input_invalid")


# -- reports ------------------------------------------------------------------------------------


def report(marque_id: str, setup: Setup, status: str = "applied") -> dict[str, Any]:
    return {"marque_id": marque_id, "nonce": "n-1", "attempt": 1, "status": status,
            "rows_affected": 1, "error": None, "cause": None,
            "pilot": {"id": "p1", "incarnation": setup.pilot.incarnation}}


def metric_samples(setup: Setup) -> dict[str, list[Any]]:
    answer = setup.call("GET", "/metrics", "audrey")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def test_reports_are_acknowledged_once_and_move_the_request(setup: Setup) -> None:
    prepared = submit(setup, READ)
    before = metric_samples(setup)["marque_harbour_reports_ingested_total"][0].value
    payload = {"pilot_id": "p1", "reports": [report(prepared["marque_id"], setup)]}
    first = setup.call("POST", "/v1/reports", "p1", json=payload)
    assert first.status_code == 200, first.text
    assert first.json() == {"acknowledged": 1, "new": 1, "ignored": 0}
    again = setup.call("POST", "/v1/reports", "p1", json=payload)
    assert again.json() == {"acknowledged": 1, "new": 0, "ignored": 0}
    after = metric_samples(setup)["marque_harbour_reports_ingested_total"][0].value
    assert after == before + 1

    verified = setup.call("GET", f"/v1/requests/{prepared['id']}", "alice").json()
    assert verified["state"] == "verified"
    assert [e["status"] for e in verified["executions"]] == ["applied"]
    kinds = [e["kind"] for e in setup.call("GET", "/v1/logbook?kind=execution.&limit=1000",
                                           "audrey").json()["entries"]]
    assert kinds.count("execution.applied") >= 1


def test_the_sweep_settles_a_request_in_reconciliation_from_the_targets_stamps(
        setup: Setup, tmp_path: Path) -> None:
    """A marque executed, then its Pilot re-registers under another incarnation: the request
    goes to `reconciliation`; one sweep of `harbour serve`'s reconciliation thread reads the
    stamp through the Pilot's evidence and settles it `verified`."""
    import subprocess

    from support.harbour import MARQUE

    from marque.cli.harbour_serve import ReconciliationSweep
    from marque.harbour.home import HarbourHome
    from marque.harbour.service import Harbourmaster

    harbour, server = setup.harbour, setup.server
    token = harbour.add("p3", "pilot")
    pilot = PilotBank(tmp_path / "p3", harbour, pilot_id="p3")
    pilot.start()
    try:
        assert server.call("POST", "/v1/pilots", token,
                           json=pilot.registration()).status_code == 200
        body = request_body(DEBIT, pilot_id="p3", request_id=fresh_id("swept"))
        harbour.add("swept", "requester", key=pilot.holder_pub)
        made = server.call("POST", "/v1/requests", harbour.tokens["swept"], json=body).json()
        approved = setup.call("POST", f"/v1/requests/{made['id']}/approve", "carol", json={})
        assert approved.json()["state"] == "prepared", approved.text
        marque = server.call("GET", f"/v1/requests/{made['id']}/marque",
                             harbour.tokens["swept"]).json()
        marque_file = tmp_path / "swept.marque"
        marque_file.write_text(marque["marque"])
        ran = subprocess.run([str(MARQUE), "exec", "--pilot", pilot.url, "--marque",
                              str(marque_file), "--key", str(pilot.holder_key), "--nonce", "n1",
                              "--json"], capture_output=True, text=True, timeout=30,
                             env=cli_env(), stdin=subprocess.DEVNULL)
        assert ran.returncode == 0, ran.stderr
        assert pilot.balances()[1] == 90

        moved = server.call("POST", "/v1/pilots", token,
                            json={**pilot.registration(), "incarnation": "another-ledger"})
        assert moved.json()["previous_incarnation"] == pilot.incarnation
        assert setup.call("GET", f"/v1/requests/{made['id']}", "audrey"
                          ).json()["state"] == "reconciliation"
        # Back to the Pilot's real incarnation, so its evidence is the one asked for.
        server.call("POST", "/v1/pilots", token, json=pilot.registration())
        assert setup.call("GET", f"/v1/requests/{made['id']}", "audrey"
                          ).json()["state"] == "reconciliation"  # stamps alone settle it

        core = Harbourmaster.open(HarbourHome(harbour.home))
        try:
            assert ReconciliationSweep(core).sweep() >= 1
        finally:
            core.close()
        settled = setup.call("GET", f"/v1/requests/{made['id']}", "audrey").json()
        assert settled["state"] == "verified", settled
        kinds = [e["kind"] for e in setup.call(
            "GET", "/v1/logbook?kind=reconciliation.&limit=1000", "audrey").json()["entries"]]
        assert "reconciliation.settled" in kinds
    finally:
        pilot.stop()


# -- logbook, head, metrics -------------------------------------------------------------------


def test_the_logbook_pages_with_after(setup: Setup) -> None:
    submit(setup, READ)  # at least a few entries beyond the setup's
    everything = setup.call("GET", "/v1/logbook?limit=1000", "admin").json()
    full = everything["entries"]
    assert len(full) >= 5
    assert [e["seq"] for e in full] == list(range(1, len(full) + 1))

    paged: list[dict[str, Any]] = []
    after = 0
    while True:
        page = setup.call("GET", f"/v1/logbook?after={after}&limit=2", "audrey")
        assert page.status_code == 200, page.text
        entries = page.json()["entries"]
        if not entries:
            break
        assert len(entries) <= 2
        assert page.json()["next_after"] == entries[-1]["seq"]
        paged += entries
        after = page.json()["next_after"]
    assert paged[:len(full)] == full

    principals = setup.call("GET", "/v1/logbook?kind=principal.&limit=1000", "admin").json()
    kinds = {e["kind"] for e in principals["entries"]}
    assert "principal.added" in kinds and all(k.startswith("principal.") for k in kinds)
    big = setup.call("GET", "/v1/logbook?limit=100000", "admin")
    assert big.status_code == 200 and len(big.json()["entries"]) <= 1000
    for query in ("limit=0", "after=-1", "after=x", "limit=two"):
        assert_problem(setup.call("GET", f"/v1/logbook?{query}", "admin"), 400,
                       "input_invalid")


def test_the_signed_head_verifies_with_the_jwks(setup: Setup) -> None:
    head = setup.call("GET", "/v1/logbook/head", "audrey").json()
    jwks = httpx.get(setup.server.url + "/.well-known/jwks.json").json()
    claims = verify_head(head["signed"], TrustedKeys(jwks["keys"]))
    assert claims == {"seq": head["seq"], "hash": head["hash"], "at": head["at"]}
    entries = setup.call("GET", f"/v1/logbook?after={head['seq'] - 1}", "audrey").json()
    assert entries["entries"][0]["seq"] == head["seq"]
    assert entries["entries"][0]["hash"] == head["hash"]


def test_metrics_parse_and_count_requests_by_state(setup: Setup) -> None:
    # A second registration of pilot p2 under another incarnation is a finding.
    for incarnation in ("inc-a", "inc-b"):
        answer = setup.call("POST", "/v1/pilots", "p2", json={
            "pilot_id": "p2", "url": "http://127.0.0.1:9", "incarnation": incarnation,
            "targets": {"bank": {"dialect": "sqlite"}}})
        assert answer.status_code == 200, answer.text
    assert answer.json()["previous_incarnation"] == "inc-a"
    samples = metric_samples(setup)
    by_state = {s.labels["state"]: s.value for s in samples["marque_harbour_requests"]}
    requests = setup.call("GET", "/v1/requests", "admin").json()["requests"]
    assert sum(by_state.values()) == len(requests)
    for state in {r["state"] for r in requests}:
        assert by_state[state] == sum(1 for r in requests if r["state"] == state)
    [waiting] = samples["marque_harbour_approvals_waiting"]
    assert waiting.value == by_state.get("awaiting_approval", 0)
    findings = {s.labels["kind"]: s.value for s in samples["marque_harbour_findings_total"]}
    assert findings.get("ledger_incarnation_changed", 0) >= 1
    [info] = samples["marque_harbour_info"]
    assert info.labels["harbour_id"] == setup.harbour.harbour_id


# -- problems and X-Request-Id ----------------------------------------------------------------


def test_problems_and_successes_carry_the_callers_request_id(setup: Setup) -> None:
    traced = {"X-Request-Id": "trace-4711"}
    refused = setup.call("GET", "/v1/logbook", "alice", headers=traced)
    assert_problem(refused, 403, "forbidden")
    assert refused.headers["x-request-id"] == "trace-4711"
    fine = setup.call("GET", "/v1/health", "none", headers=traced)
    assert fine.headers["x-request-id"] == "trace-4711"
    # A request id that could inject into logs or headers is replaced, never echoed.
    odd = setup.call("GET", "/v1/health", "none", headers={"X-Request-Id": "a b;c"})
    assert odd.headers["x-request-id"].startswith("req_")
    missing = setup.call("GET", "/v1/requests/rq_does_not_exist", "admin")
    assert_problem(missing, 404, "not_found")
    assert missing.headers["x-request-id"].startswith("req_")


DENY_WRITES = routing_toml(READS_ALLOWED, WRITES_DENIED)


def test_denied_and_unmatched_requests_are_stored_failed_and_answered_403_with_their_id(
        setup: Setup, tmp_path: Path) -> None:
    """Writes denied, DDL matched by no entry: each is stored `failed` with its code, the
    answer is 403 with that code and the stored request's `id`, and no marque exists."""
    harbour = Harbour(tmp_path / "h", routing=DENY_WRITES)
    harbour.add("alice", "requester", key=setup.pilot.holder_pub)
    harbour.add("p1", "pilot")
    server = HarbourServer(harbour.home)
    try:
        registered = server.call("POST", "/v1/pilots", harbour.tokens["p1"],
                                 json=setup.pilot.registration())
        assert registered.status_code == 200, registered.text
        for sql, code in ((DEBIT, "account_denied"),
                          ("CREATE TABLE audit (id INTEGER)", "account_no_match")):
            answer = server.call("POST", "/v1/requests", harbour.tokens["alice"],
                                 json=request_body(sql, request_id=fresh_id(code)))
            body = assert_problem(answer, 403, code)
            stored = server.call("GET", f"/v1/requests/{body['id']}", harbour.tokens["alice"])
            assert stored.status_code == 200, stored.text
            assert stored.json()["state"] == "failed"
            assert stored.json()["failure"]["code"] == code
            assert stored.json()["marque_id"] is None
            assert_problem(server.call("GET", f"/v1/requests/{body['id']}/marque",
                                       harbour.tokens["alice"]), 409, "conflict")
    finally:
        assert server.stop() == 0


# -- the command -------------------------------------------------------------------------------


@pytest.mark.parametrize("args,code", [
    (["--listen", "nowhere"], "input_invalid"),
    (["--tls-cert", "cert.pem"], "input_invalid"),
])
def test_serve_refuses_bad_options(setup: Setup, args: list[str], code: str) -> None:
    import subprocess

    from support.harbour import MARQUE

    proc = subprocess.run([str(MARQUE), "harbour", "serve", "--home", str(setup.harbour.home),
                           *args, "--json"], capture_output=True, text=True, timeout=30,
                          env=cli_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc
    assert json.loads(proc.stdout)["error"]["code"] == code


def test_serve_without_a_home_fails_clearly(tmp_path: Path) -> None:
    import subprocess

    from support.harbour import MARQUE

    proc = subprocess.run([str(MARQUE), "harbour", "serve", "--home", str(tmp_path / "none"),
                           "--listen", "127.0.0.1:0", "--json"], capture_output=True,
                          text=True, timeout=30, env=cli_env(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc
    assert json.loads(proc.stdout)["error"]["code"] == "not_found"


def test_sigint_also_stops_in_order(setup: Setup) -> None:
    second = HarbourServer(setup.harbour.home)
    assert second.call("GET", "/v1/health").status_code == 200
    assert second.stop(signal.SIGINT) == 0
