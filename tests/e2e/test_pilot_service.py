"""The Pilot as an HTTP service: a real `marque pilot serve` process on loopback.

Executions stream NDJSON as they happen; a caller that lets go follows the
same execution again; refusals are problem documents with nothing claimed; a
service killed with SIGKILL mid-execution is settled by reconciliation after a
restart; /v1/health and /metrics say what the ledger holds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
from e2e_support import Service, World
from prometheus_client.parser import text_string_to_metric_families

from marque.token import make_proof, new_key

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
# One row, after counting a few million recursive rows first: a second or more.
SLOW = (
    "UPDATE accounts SET balance = balance - 10 + (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x+1 FROM c WHERE x < 4000000) SELECT count(*) - count(*) FROM c) WHERE id = 1"
)
ORDER = ["claimed", "fence_checked", "statement_started", "statement_finished", "asserted",
         "committed", "settle_behind"]




def holder(world: World) -> dict[str, Any]:
    return json.loads(world.holder_key.read_text())


def body(world: World, marque_file: Any, nonce: str, key: dict[str, Any] | None = None
         ) -> dict[str, str]:
    token = marque_file.read_text().strip()
    proof = make_proof(key or holder(world), token, nonce=nonce, pilot_id=world.pilot_id)
    return {"marque": token, "nonce": nonce, "proof": proof}


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


def claims(world: World) -> int:
    return world.ledger_count("claims")


def test_an_execution_streams_its_events_in_order_then_the_outcome(
        world: World, service: Service) -> None:
    """POST /v1/executions: NDJSON events in DESIGN §3's order, the last line the outcome."""
    marque = world.issue([DEBIT])
    with httpx.stream("POST", f"{service.url}/v1/executions", json=body(world, marque, "n1"),
                      headers={"X-Request-Id": "trace-123"}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        assert response.headers["x-request-id"] == "trace-123"
        got = lines(response)
    kinds = [e["event"] for e in got]
    assert [k for k in kinds if k in ORDER] == [k for k in ORDER if k in kinds]
    # An applied write is answered from the target's commit and recorded just behind
    # (settle_write_behind, on by default): the stream says so, the ledger then holds it.
    assert {"claimed", "committed", "settle_behind"} <= set(kinds)
    assert "outcome_recorded" not in kinds
    assert kinds[-1] == "outcome"
    outcome = got[-1]["outcome"]
    assert (outcome["status"], outcome["attempt"], outcome["rows_affected"]) == ("applied", 1, 1)
    assert world.balances()[1] == 90

    again = httpx.post(f"{service.url}/v1/executions", json=body(world, marque, "n1"),
                       timeout=30)
    assert again.status_code == 200
    replay = [json.loads(x) for x in again.text.splitlines()]
    assert replay[-1]["outcome"]["replayed"] is True
    assert world.balances()[1] == 90  # replayed, never run again


def test_an_execution_asked_for_its_outcome_only_streams_one_line(
        world: World, service: Service) -> None:
    """POST /v1/executions?events=false: the stream is the outcome line alone; the
    execution is the same, its events still recorded in the ledger."""
    marque = world.issue([DEBIT])
    response = httpx.post(f"{service.url}/v1/executions?events=false",
                          json=body(world, marque, "q1"), timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    got = lines(response)
    assert [e["event"] for e in got] == ["outcome"]
    assert (got[0]["outcome"]["status"], got[0]["outcome"]["rows_affected"]) == ("applied", 1)
    assert world.balances()[1] == 90
    deadline = time.monotonic() + 10
    while world.ledger_count("events") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # recorded just behind the answer (settle_write_behind)
    assert world.ledger_count("events") >= 1


def test_events_arrive_while_the_statement_runs(world: World, service: Service) -> None:
    """The stream is live: statement_started arrives while the attempt is still in progress."""
    marque = world.issue([SLOW])
    marque_id = world.marque_id(marque)
    seen_in_progress = False
    with httpx.stream("POST", f"{service.url}/v1/executions", json=body(world, marque, "slow"),
                      timeout=60) as response:
        for line in response.iter_lines():
            event = json.loads(line)
            if event["event"] == "statement_started":
                [(status,)] = world.ledger_rows(
                    "SELECT status FROM attempts WHERE marque_id = ? AND nonce = ?",
                    (marque_id, "slow"))
                seen_in_progress = status == "in_progress"
            last = event
    assert seen_in_progress
    assert last["outcome"]["status"] == "applied"


def test_a_caller_that_lets_go_follows_the_same_execution(world: World, service: Service) -> None:
    """A client that drops the stream mid-execution follows it to its outcome; applied once."""
    marque = world.issue([SLOW])
    marque_id = world.marque_id(marque)
    with httpx.stream("POST", f"{service.url}/v1/executions", json=body(world, marque, "f1"),
                      timeout=60) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["event"] == "claimed"
    # The connection is gone; the execution is not.
    with httpx.stream("GET", f"{service.url}/v1/executions/{marque_id}/f1",
                      params={"follow": "true"}, timeout=60) as response:
        assert response.status_code == 200
        followed = lines(response)
    assert followed[0]["event"] == "claimed"
    assert followed[-1]["event"] == "outcome"
    assert followed[-1]["outcome"]["status"] == "applied"
    assert world.balances()[1] == 90
    assert claims(world) == 1

    shown = httpx.get(f"{service.url}/v1/executions/{marque_id}/f1", timeout=30)
    assert shown.status_code == 200 and shown.json()["status"] == "applied"


def test_refusals_are_problem_documents_and_claim_nothing(world: World, service: Service) -> None:
    """A proof by another key: 403 pop_key_mismatch as RFC 9457, no nonce claimed."""
    marque = world.issue([DEBIT])
    response = httpx.post(f"{service.url}/v1/executions",
                          json=body(world, marque, "n1", key=new_key()), timeout=30)
    assert response.status_code == 403
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "pop_key_mismatch"
    assert problem["type"] == "urn:marque:error:pop_key_mismatch"
    assert problem["status"] == 403
    assert "x-request-id" in response.headers
    assert claims(world) == 0

    bad = httpx.post(f"{service.url}/v1/executions", content=b"not json", timeout=30)
    assert (bad.status_code, bad.json()["code"]) == (400, "input_invalid")
    missing = httpx.get(f"{service.url}/v1/executions/mq_none/n1", timeout=30)
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    assert world.balances()[1] == 100


def test_a_service_killed_mid_execution_is_settled_after_a_restart(world: World) -> None:
    """SIGKILL mid-statement; after a restart a follow settles it and a retry applies once."""
    marque = world.issue([SLOW], attempts=3)
    marque_id = world.marque_id(marque)
    first = Service(world)
    try:
        with httpx.stream("POST", f"{first.url}/v1/executions",
                          json=body(world, marque, "k1"), timeout=60) as response:
            for line in response.iter_lines():
                if json.loads(line)["event"] == "statement_started":
                    break
            os.kill(first.proc.pid, signal.SIGKILL)
    except httpx.HTTPError:
        pass  # the stream dies with the server
    finally:
        first.stop(signal.SIGKILL)
    second = Service(world)
    try:
        followed = httpx.get(f"{second.url}/v1/executions/{marque_id}/k1",
                             params={"follow": "true"}, timeout=60)
        outcome = json.loads(followed.text.splitlines()[-1])["outcome"]
        assert outcome["status"] == "aborted_not_applied"  # killed before COMMIT: tombstoned
        retry = httpx.post(f"{second.url}/v1/executions", json=body(world, marque, "k1"),
                           timeout=60)
        final = json.loads(retry.text.splitlines()[-1])["outcome"]
        assert (final["status"], final["attempt"]) == ("applied", 2)
    finally:
        second.stop()
    assert world.balances()[1] == 90


def test_a_service_killed_behind_an_applied_answer_settles_it_from_the_stamp(
        world: World) -> None:
    """MARQUE_CRASH_AT=settle_behind: the caller got `applied`, then the service died before
    the ledger recorded it. The ledger says in_progress (the window was real); after a
    restart, recovery settles it applied from the target's stamp, and a retry replays."""
    marque = world.issue([DEBIT], attempts=3)
    marque_id = world.marque_id(marque)
    first = Service(world, env={"MARQUE_CRASH_AT": "settle_behind"})
    try:
        try:
            response = httpx.post(f"{first.url}/v1/executions",
                                  json=body(world, marque, "s1"), timeout=30)
        except httpx.RemoteProtocolError:
            pass  # the settler died before the outcome line left: the caller retries below
        else:  # the line went out first: it said applied
            outcome = json.loads(response.text.splitlines()[-1])["outcome"]
            assert (outcome["status"], outcome["rows_affected"]) == ("applied", 1)
        assert first.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        first.stop(signal.SIGKILL)
    [(status,)] = world.ledger_rows(
        "SELECT status FROM attempts WHERE marque_id = ? AND nonce = ?", (marque_id, "s1"))
    assert status == "in_progress"
    second = Service(world)
    try:
        retry = httpx.post(f"{second.url}/v1/executions", json=body(world, marque, "s1"),
                           timeout=30)
        final = json.loads(retry.text.splitlines()[-1])["outcome"]
        assert (final["status"], final["attempt"], final["rows_affected"]) == ("applied", 1, 1)
        assert final["replayed"] is True
    finally:
        second.stop()
    assert world.balances()[1] == 90  # once
    [(status, rows)] = world.ledger_rows(
        "SELECT status, rows_affected FROM attempts WHERE marque_id = ? AND nonce = ?",
        (marque_id, "s1"))
    assert (status, rows) == ("applied", 1)


def test_health_and_metrics_follow_the_ledger(world: World, service: Service) -> None:
    """/v1/health names the Pilot and its targets; /metrics parses and its counters move."""
    health = httpx.get(f"{service.url}/v1/health", timeout=30).json()
    assert health["pilot_id"] == world.pilot_id
    assert health["incarnation"] == world.incarnation
    assert health["targets"] == {"bank": {"reachable": True, "replaced": False}}
    assert health["ledger"]["in_progress"] == 0

    def executions_applied() -> float:
        text = httpx.get(f"{service.url}/metrics", timeout=30).text
        for family in text_string_to_metric_families(text):
            if family.name == "marque_executions":
                return sum(s.value for s in family.samples
                           if s.name == "marque_executions_total"
                           and s.labels.get("status") == "applied")
        return 0.0

    before = executions_applied()
    marque = world.issue([DEBIT])
    httpx.post(f"{service.url}/v1/executions", json=body(world, marque, "m1"), timeout=30)
    deadline = time.monotonic() + 10
    while executions_applied() != before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert executions_applied() == before + 1
    assert httpx.get(f"{service.url}/v1/health", timeout=30).json()["ledger"]["entries"] == 1


def test_sigterm_lets_a_running_execution_finish_and_record(world: World) -> None:
    """SIGTERM mid-statement: the service stops only after the execution applied and recorded."""
    marque = world.issue([SLOW])
    marque_id = world.marque_id(marque)
    running = Service(world)
    got: list[dict[str, Any]] = []
    try:
        with httpx.stream("POST", f"{running.url}/v1/executions",
                          json=body(world, marque, "t1"), timeout=60) as response:
            for line in response.iter_lines():
                got.append(json.loads(line))
                if got[-1]["event"] == "statement_started":
                    running.proc.send_signal(signal.SIGTERM)
    finally:
        status = running.stop()
    assert status == 0
    assert got[-1]["event"] == "outcome" and got[-1]["outcome"]["status"] == "applied"
    [(recorded,)] = world.ledger_rows(
        "SELECT status FROM attempts WHERE marque_id = ? AND nonce = ?", (marque_id, "t1"))
    assert recorded == "applied"
    assert world.balances()[1] == 90


def test_a_preview_over_http_counts_rows_and_changes_nothing(
        world: World, service: Service) -> None:
    """POST /v1/previews: exact rows of an UPDATE, rolled back; a replayed token is refused."""
    from marque.change import Change, Statement
    from marque.token.service_tokens import PreviewGrant, issue_preview_token

    issuer = json.loads(world.issuer_key.read_text())
    token = issue_preview_token(issuer, PreviewGrant(
        pilot_id=world.pilot_id, incarnation=world.incarnation, target="bank",
        change=Change((Statement("UPDATE accounts SET balance = balance + 1"),)), max_rows=1))
    response = httpx.post(f"{service.url}/v1/previews", json={"preview": token}, timeout=30)
    assert response.status_code == 200, response.text
    preview = response.json()
    assert (preview["mode"], preview["total_rows"], preview["within_max_rows"]) == (
        "rollback", 2, False)
    assert preview["preview_cid"].startswith("sha256:")
    assert world.balances() == {1: 100, 2: 100}
    assert world.ledger_count("claims") == 0 and world.stamps() == []

    again = httpx.post(f"{service.url}/v1/previews", json={"preview": token}, timeout=30)
    assert (again.status_code, again.json()["code"]) == (403, "pop_replayed")


def test_evidence_of_a_marque_needs_a_query_token(world: World, service: Service) -> None:
    """GET /v1/marques/{id}: 401 without a token; with one, the claim and the applied stamp."""
    from marque.token.service_tokens import issue_query_token

    marque = world.issue([DEBIT])
    marque_id = world.marque_id(marque)
    httpx.post(f"{service.url}/v1/executions", json=body(world, marque, "e1"), timeout=30)
    anonymous = httpx.get(f"{service.url}/v1/marques/{marque_id}", timeout=30)
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthenticated")

    issuer = json.loads(world.issuer_key.read_text())
    query = issue_query_token(issuer, pilot_id=world.pilot_id, marque_id=marque_id)
    shown = httpx.get(f"{service.url}/v1/marques/{marque_id}",
                      headers={"Authorization": f"Bearer {query}"}, timeout=30)
    assert shown.status_code == 200, shown.text
    evidence = shown.json()
    assert evidence["marque_id"] == marque_id
    assert [c["nonce"] for c in evidence["claims"]] == ["e1"]
    assert [(s["nonce"], s["kind"]) for s in evidence["stamps"]] == [("e1", "applied")]


def test_each_refusal_over_http_is_its_problem_and_claims_nothing(
        world: World, service: Service) -> None:
    """DESIGN §2's refusals over HTTP: the code and 403 (400 for bad input), no claim."""
    url = f"{service.url}/v1/executions"
    marque = world.issue([DEBIT], executions=1)
    token = marque.read_text().strip()
    other = world.issue([DEBIT], incarnation="inc_" + "0" * 32)
    good = body(world, marque, "n1")
    cases = {
        "marque_invalid": {**good, "marque": token[:-4] + "AAAA"},
        "pop_missing": {**good, "proof": None},
        "pop_invalid": {**good, "proof": "not.a.proof"},
        "pop_key_mismatch": body(world, marque, "n1", key=new_key()),
        "wrong_incarnation": body(world, other, "n1"),
        "input_invalid": {**good, "nonce": "bad\nnonce"},
    }
    for code, request in cases.items():
        response = httpx.post(url, json=request, timeout=30)
        assert response.json()["code"] == code, (code, response.text)
        assert response.status_code == (400 if code == "input_invalid" else 403), code
    assert claims(world) == 0

    assert httpx.post(url, json=good, timeout=30).status_code == 200
    replayed = httpx.post(url, json=good, timeout=30)  # the same proof again
    assert (replayed.status_code, replayed.json()["code"]) == (403, "pop_replayed")
    spent = httpx.post(url, json=body(world, marque, "n2"), timeout=30)
    assert (spent.status_code, spent.json()["code"]) == (403, "budget_exhausted")
    assert claims(world) == 1
    assert world.balances()[1] == 90
