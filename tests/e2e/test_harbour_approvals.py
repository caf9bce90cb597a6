"""Trust in every approval, through real `marque harbour serve` and `marque pilot serve`.

A compensation (``rolls_back``) names only a request its requester may see, and
one they may not see is answered exactly like a missing one; an approval whose
revalidation fails is a refusal that says the request ended ``failed``; a
second Resolution by the same approver that would be dropped (another reason,
the other decision) is refused with the one that stands. Everything goes
through `marque` subprocesses and the HTTP API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harbour import DEBIT, request_body
from test_harbour_cli_flow import Stack, request_args, wait_for_state

from marque.harbour.routing import BOOTSTRAP_PROFILE_TOML

CREDIT = "UPDATE accounts SET balance = balance + 10 WHERE id = 1"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _asked(stack: Stack, token: str, *extra: Any, sql: str = DEBIT) -> dict[str, Any]:
    asked = stack.as_(token, *request_args(*extra, sql=sql))
    assert asked.returncode == 0, asked
    assert asked.json["state"] == "awaiting_approval", asked.json
    return asked.json


def _verified(stack: Stack) -> dict[str, Any]:
    """Alice's debit, approved by bob, run once, reported: ``verified``."""
    request = _asked(stack, stack.alice)
    approved = stack.as_(stack.bob, "approve", request["id"], "--json")
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved
    ran = stack.as_(stack.alice, "exec", "--request", request["id"], "--key",
                    stack.bank.holder_key, "--nonce", "n1", "--json")
    assert ran.returncode == 0 and ran.json["status"] == "applied", ran
    final = wait_for_state(stack, request["id"], "verified")
    assert final["state"] == "verified", final
    return final


def _compensation(stack: Stack, token: str, rolls_back: str, request_id: str) -> Any:
    body = request_body(CREDIT, request_id=request_id)
    body["rolls_back"] = rolls_back
    return stack.server.call("POST", "/v1/requests", token, json=body)


def test_a_compensation_may_name_only_a_request_its_requester_may_see(stack: Stack) -> None:
    """Another requester's request — verified or not — is answered 404 not_found exactly like
    a missing id, and nothing is stored; its own requester's compensation is accepted and
    shows what it compensates."""
    original = _verified(stack)
    waiting = _asked(stack, stack.alice)
    missing = "rq_" + "0" * 32
    answers = {name: _compensation(stack, stack.carol, rq, f"mallory-{name}")
               for name, rq in (("verified", original["id"]), ("waiting", waiting["id"]),
                                ("missing", missing))}
    bodies = {}
    for name, answer in answers.items():
        assert answer.status_code == 404, (name, answer.text)
        body = answer.json()
        assert body["code"] == "not_found", body
        rq = {"verified": original["id"], "waiting": waiting["id"], "missing": missing}[name]
        assert body["rolls_back"] == rq
        # The same words and members whatever the id named: nothing tells them apart.
        bodies[name] = {k: (str(v).replace(rq, "RQ") if k in ("detail", "rolls_back") else v)
                        for k, v in body.items()}
    assert bodies["verified"] == bodies["waiting"] == bodies["missing"], bodies
    listed = stack.as_(stack.carol, "requests", "--json")
    assert listed.returncode == 0 and listed.json["requests"] == [], listed
    assert wait_for_state(stack, original["id"], "verified")["state"] == "verified"

    own = _compensation(stack, stack.alice, original["id"], "alice-undo")
    assert own.status_code == 201, own.text
    assert own.json()["rolls_back"] == original["id"]
    shown = stack.as_(stack.bob, "requests", "show", own.json()["id"], "--json")
    assert shown.returncode == 0 and shown.json["rolls_back"] == original["id"], shown
    human = stack.as_(stack.bob, "requests", "show", own.json()["id"])
    assert f"compensates {original['id']}" in human.stdout, human
    approved = stack.as_(stack.bob, "approve", own.json()["id"], "--json")
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved
    assert wait_for_state(stack, original["id"], "rolling_back")["state"] == "rolling_back"


def test_an_approval_whose_revalidation_fails_is_a_refusal_naming_the_new_state(
        stack: Stack) -> None:
    """The routing config changed since the Checkpoint: ``approve`` exits 3 (HTTP 403) with
    revalidation_failed and the request's new state, ``failed``; no marque."""
    by_cli = _asked(stack, stack.alice)
    by_http = _asked(stack, stack.alice)
    stack.harbour.set_routing(BOOTSTRAP_PROFILE_TOML.replace("self_approval = false",
                                                             "self_approval = true"))
    refused = stack.as_(stack.bob, "approve", by_cli["id"], "--reason", "fine", "--json")
    assert refused.returncode == 3, refused
    error = refused.json["error"]
    assert error["code"] == "revalidation_failed", error
    assert error["detail"]["id"] == by_cli["id"] and error["detail"]["state"] == "failed"
    assert error["detail"]["failure"]["code"] == "revalidation_failed"
    shown = stack.as_(stack.alice, "requests", "show", by_cli["id"], "--json").json
    assert shown["state"] == "failed" and shown["marque"] is None, shown

    answer = stack.server.call("POST", f"/v1/requests/{by_http['id']}/approve", stack.bob,
                               json={"reason": "fine"})
    assert answer.status_code == 403, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "revalidation_failed" and problem["state"] == "failed", problem
    assert problem["id"] == by_http["id"]


def test_a_second_resolution_by_the_same_approver_is_refused_with_the_stored_one(
        stack: Stack) -> None:
    """Another reason, or the other decision, is already_approved / already_rejected (exit 2,
    HTTP 409) carrying the Resolution that stands; the very same one again is a retry."""
    approved = _asked(stack, stack.alice)
    first = stack.as_(stack.bob, "approve", approved["id"], "--reason", "checked", "--json")
    assert first.returncode == 0 and first.json["state"] == "prepared", first
    [stored] = first.json["resolutions"]
    for args in (["approve", approved["id"], "--reason", "checked twice"],
                 ["approve", approved["id"]],
                 ["reject", approved["id"], "--reason", "changed my mind"]):
        again = stack.as_(stack.bob, *args, "--json")
        assert again.returncode == 2, (args, again)
        error = again.json["error"]
        assert error["code"] == "already_approved", error
        assert error["detail"]["resolution"] == {
            "decision": "approve", "reason": "checked", "at": stored["at"],
            "resolution_cid": stored["resolution_cid"]}
    retry = stack.as_(stack.bob, "approve", approved["id"], "--reason", "checked", "--json")
    assert retry.returncode == 0 and retry.json["state"] == "prepared", retry
    assert len(retry.json["resolutions"]) == 1

    rejected = _asked(stack, stack.alice)
    no = stack.as_(stack.bob, "reject", rejected["id"], "--reason", "not today", "--json")
    assert no.returncode == 0 and no.json["state"] == "rejected", no
    answer = stack.server.call("POST", f"/v1/requests/{rejected['id']}/approve", stack.bob,
                               json={"reason": "on second thought"})
    assert answer.status_code == 409, answer.text
    problem = answer.json()
    assert problem["code"] == "already_rejected", problem
    assert problem["resolution"]["reason"] == "not today"
    assert problem["resolution"]["decision"] == "reject"
    again = stack.as_(stack.bob, "reject", rejected["id"], "--reason", "still no", "--json")
    assert again.returncode == 2 and again.json["error"]["code"] == "already_rejected", again
