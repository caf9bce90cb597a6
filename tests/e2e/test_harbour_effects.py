"""Effect Set requests through a real `harbour serve` and a joined `pilot serve` (issue 14).

An Effect Set request is a request like any other: routed per member (a write
under the bootstrap profile is delegated), previewed by its Pilot (every row
before → after), sealed in a Checkpoint over the complete set preview,
approved by another principal, issued as a marque naming the
``effect_preview_cid``, executed through the Pilot, and verified from the
Pilot's report — which carries the set receipt the request then shows. Over
the HTTP API and through the CLI; real SQLite, nothing mocked.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Result, run_cli
from support.harbour import (
    TOPUP_DECLARATION,
    TOPUP_ROWS,
    HarbourWorld,
    cli_env,
    effect_body,
    execute_marque,
    wait_for_request,
)

from marque.change import EffectSetChange
from marque.harbour.routing import BOOTSTRAP_PROFILE_TOML
from marque.token import unverified_claims

DECLARATION, ROWS = TOPUP_DECLARATION, TOPUP_ROWS


class Stack(HarbourWorld):
    """A Harbourmaster (bootstrap profile), a joined Pilot serving `bank` (3 accounts, and a
    `ledger_notes` table), a requester, an approver and an auditor."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, bank_sql=(
            "CREATE TABLE ledger_notes (id INTEGER PRIMARY KEY, note TEXT)",),
            principals=(("bob", "approver"), ("audra", "auditor")), serve=True)
        self.audra = self.harbour.tokens["audra"]
        self.url = self.server.url
        self._ids = 0

    def fresh(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    def cli(self, token: str, *args: Any) -> Result:
        env = cli_env({"MARQUE_HARBOUR": self.url, "MARQUE_TOKEN": token})
        return run_cli(*args, env=env, timeout=60)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("harbour-effects"))
    try:
        yield running
    finally:
        running.stop()


def set_balances(stack: Stack, balances: dict[int, int]) -> None:
    conn = sqlite3.connect(stack.bank.bank)
    with conn:
        conn.executemany("UPDATE accounts SET balance = ? WHERE id = ?",
                         [(b, i) for i, b in balances.items()])
    conn.close()


def execute(stack: Stack, marque: str, nonce: str) -> dict[str, Any]:
    """POST the marque to the Pilot's /v1/executions; the outcome line."""
    return execute_marque(stack.bank.url, stack.bank.holder_key, marque, nonce)


def wait_for(stack: Stack, rq: str, ready: Any, seconds: float = 20) -> dict[str, Any]:
    return wait_for_request(stack.call, rq, stack.alice, ready, seconds)


def test_an_effect_set_request_is_delegated_previewed_approved_applied_and_verified(
        stack: Stack) -> None:
    """Over HTTP: an update of 3 rows is delegated, previewed row by row, sealed, approved by
    another principal, issued naming the effect_preview_cid, applied exactly, and verified
    with its set receipt."""
    set_balances(stack, {1: 100, 2: 100, 3: 100})
    answer = stack.call("POST", "/v1/requests", stack.alice,
                        json=effect_body(ROWS, request_id=stack.fresh("topup")))
    assert answer.status_code == 201, answer.text
    request = answer.json()
    assert request["state"] == "awaiting_approval"
    assert request["routing"]["outcome"] == "delegate"
    preview = request["preview"]
    assert preview["version"] == "actql-effect-preview/0.1" and preview["executed"] is False
    [member] = preview["members"]
    assert [(c["before"]["value"]["balance"], c["after"]["value"]["balance"])
            for c in member["changes"]] == [(100, 150), (100, 250), (100, 350)]
    assert preview["authoring_context"]["logical_request_scope"] == \
        request["logical_request_scope"]
    checkpoint = request["checkpoint"]["body"]
    assert checkpoint["preview_cid"] == preview["effect_preview_cid"]
    assert checkpoint["change_cid"] == EffectSetChange(preview["effect_preview_cid"]).change_cid
    assert request["receipt"] is None and request["marque"] is None
    assert stack.bank.balances() == {1: 100, 2: 100, 3: 100}

    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob,
                          json={"reason": "three rows, as shown"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "prepared"
    handed = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()
    claims = unverified_claims(handed["marque"]) or {}
    assert claims["change"] == EffectSetChange(preview["effect_preview_cid"]).to_claim()
    assert claims["req"] == request["logical_request_scope"]
    assert claims["approval"]["checkpoint_cid"] == request["checkpoint"]["cid"]
    assert claims["approval"]["resolutions"] == [
        r["resolution_cid"] for r in approved.json()["resolutions"]]

    outcome = execute(stack, handed["marque"], "n-1")
    assert outcome["status"] == "applied" and outcome["rows_affected"] == 3
    assert stack.bank.balances() == {1: 150, 2: 250, 3: 350}

    final = wait_for(stack, request["id"], lambda r: r["receipt"] is not None
                     and r["state"] == "verified")
    assert final["state"] == "verified", final
    receipt = final["receipt"]
    assert receipt["status"] == "applied" and receipt["run_outcome"] == "succeeded"
    assert receipt["row_states"] == {"topup": ["applied", "applied", "applied"]}
    assert receipt["set_receipt"]["effect_preview_cid"] == preview["effect_preview_cid"]
    assert receipt["set_receipt"]["authorization"] == {
        "kind": "approval", "checkpoint_cid": request["checkpoint"]["cid"],
        "resolution_cids": claims["approval"]["resolutions"]}


def test_the_same_effect_set_again_is_the_same_request_and_a_changed_input_conflicts(
        stack: Stack) -> None:
    """Same id + same declaration and relation (rows in another order) → the same request
    (200); a changed input value under that id → conflict (422)."""
    set_balances(stack, {1: 100, 2: 100, 3: 100})
    rid = stack.fresh("same")
    first = stack.call("POST", "/v1/requests", stack.alice, json=effect_body(ROWS, request_id=rid))
    assert first.status_code == 201, first.text
    again = stack.call("POST", "/v1/requests", stack.alice,
                       json=effect_body(list(reversed(ROWS)), request_id=rid))
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["intent_fingerprint"] == first.json()["intent_fingerprint"]
    changed = [dict(ROWS[0], balance=151), *ROWS[1:]]
    conflict = stack.call("POST", "/v1/requests", stack.alice,
                          json=effect_body(changed, request_id=rid))
    assert conflict.status_code == 422, conflict.text
    assert conflict.json()["code"] == "conflict"


def test_a_row_changed_between_preview_and_apply_ends_stale_preview_with_nothing_applied(
        stack: Stack) -> None:
    """A row written after the Checkpoint was sealed: the execution is aborted_not_applied
    with stale_preview, and no row of the set changes."""
    set_balances(stack, {1: 100, 2: 100, 3: 100})
    request = stack.call("POST", "/v1/requests", stack.alice,
                         json=effect_body(ROWS, request_id=stack.fresh("stale"))).json()
    assert request["state"] == "awaiting_approval", request
    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob, json={})
    assert approved.status_code == 200, approved.text
    set_balances(stack, {2: 101})  # someone else writes row 2
    marque = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()
    outcome = execute(stack, marque["marque"], "n-1")
    assert outcome["status"] == "aborted_not_applied", outcome
    assert outcome["error"]["code"] == "stale_preview"
    assert stack.bank.balances() == {1: 100, 2: 101, 3: 100}
    shown = wait_for(stack, request["id"], lambda r: r["executions"])
    assert [(e["nonce"], e["status"]) for e in shown["executions"]] == [
        ("n-1", "aborted_not_applied")]
    assert shown["receipt"] is None  # nothing was dispatched, so no receipt was sealed


def test_a_stale_preview_ends_the_request_and_its_caller_id_keeps_answering(
        stack: Stack) -> None:
    """Through the CLI: a row written after approval makes `exec --request <caller id>` end
    stale_preview (exit 4), saying to re-request — not that the nonce may run again. The
    Pilot's report ends the request failed (stale_preview, with that next step); the caller
    id still resolves to it (`requests show`, `GET /v1/requests/{id}`), and `exec --request`
    now refuses truthfully (the request is failed) instead of not_found. Submitting again
    under the same id is a new request with a new preview of the rows as they are now."""
    set_balances(stack, {1: 100, 2: 100, 3: 100})
    rid = stack.fresh("stale-cli")
    request = stack.call("POST", "/v1/requests", stack.alice,
                         json=effect_body(ROWS, request_id=rid)).json()
    assert request["state"] == "awaiting_approval", request
    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob, json={})
    assert approved.status_code == 200, approved.text
    set_balances(stack, {2: 101})  # someone else writes row 2

    ran = stack.cli(stack.alice, "exec", "--request", rid, "--key", stack.bank.holder_key,
                    "--nonce", "n-1")

    assert ran.returncode == 4, ran
    assert "stale_preview" in ran.stdout and "Re-request" in ran.stdout, ran
    assert "may run again" not in ran.stdout, ran
    final = wait_for(stack, request["id"], lambda r: r["state"] != "prepared"
                     and r["state"] != "executing")
    assert final["state"] == "failed", final
    assert final["failure"]["code"] == "stale_preview"
    assert "Re-request" in final["failure"]["message"]
    assert "new preview" in final["failure"]["message"]
    shown = stack.cli(stack.alice, "requests", "show", rid, "--json")
    assert shown.returncode == 0, shown
    assert (shown.json["id"], shown.json["state"]) == (request["id"], "failed")
    human = stack.cli(stack.alice, "requests", "show", rid)
    assert human.returncode == 0 and "stale_preview" in human.stdout, human
    over_http = stack.call("GET", f"/v1/requests/{rid}", stack.alice)
    assert over_http.status_code == 200 and over_http.json()["id"] == request["id"]
    refused = stack.cli(stack.alice, "exec", "--request", rid, "--key", stack.bank.holder_key,
                        "--nonce", "n-2", "--json")
    assert refused.returncode == 2, refused
    assert refused.json["error"]["code"] == "conflict", refused
    assert "failed" in refused.json["error"]["message"]
    assert "stale_preview" in refused.json["error"]["message"]
    assert stack.bank.balances() == {1: 100, 2: 101, 3: 100}

    again = stack.call("POST", "/v1/requests", stack.alice,
                       json=effect_body(ROWS, request_id=rid))
    assert again.status_code == 201, again.text
    fresh = again.json()
    assert fresh["id"] != request["id"] and fresh["state"] == "awaiting_approval"
    befores = [c["before"]["value"]["balance"]
               for c in fresh["preview"]["members"][0]["changes"]]
    assert befores == [100, 101, 100]  # the rows as they are now
    latest = stack.cli(stack.alice, "requests", "show", rid, "--json")
    assert latest.returncode == 0 and latest.json["id"] == fresh["id"], latest


def test_routing_evaluates_every_member_and_one_denied_table_denies_the_set(
        stack: Stack) -> None:
    """Under a config that denies writes to main.ledger_notes, a set with one member on it is
    denied (403 account_denied, stored failed); the same set without it is delegated."""
    stack.harbour.set_routing("""\
version = "marque-routing/0.1"

[[entry]]
principal = "*"
target = "*"
resource = ["main.ledger_notes"]
operation = "*"
outcome = "deny"

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = "*"
except = [{principal = "*", target = "*", resource = ["main.ledger_notes"], operation = "*"}]
outcome = "delegate"
approvals = 1
""")
    try:
        set_balances(stack, {1: 100, 2: 100, 3: 100})
        declaration = {"version": "marque-effect-set/0.1", "members": [
            DECLARATION["members"][0],
            {"effect_id": "note", "kind": "create", "table": "ledger_notes", "key": ["id"],
             "failure_policy": "halt", "max_items": 5}]}
        inputs = {"topup": {"version": "marque-effect-input/0.1", "columns": ["balance", "id"],
                            "rows": ROWS},
                  "note": {"version": "marque-effect-input/0.1", "columns": ["id", "note"],
                           "rows": [{"id": 1, "note": "topped up"}]}}
        denied = stack.call("POST", "/v1/requests", stack.alice, json=effect_body(
            ROWS, request_id=stack.fresh("deny"), declaration=declaration, inputs=inputs))
        assert denied.status_code == 403, denied.text
        problem = denied.json()
        assert problem["code"] == "account_denied"
        tuples = [(t["statement"], t["resource"], t["operation"], t["outcome"])
                  for t in problem["routing"]["tuples"]]
        assert tuples == [(0, "main.accounts", "write", "delegate"),
                          (1, "main.ledger_notes", "write", "deny")]
        stored = stack.call("GET", f"/v1/requests/{problem['id']}", stack.alice).json()
        assert stored["state"] == "failed" and stored["failure"]["code"] == "account_denied"
        assert stored["marque_id"] is None and stored["preview"] is None
        allowed = stack.call("POST", "/v1/requests", stack.alice,
                             json=effect_body(ROWS, request_id=stack.fresh("deny-ok")))
        assert allowed.status_code == 201, allowed.text
        assert allowed.json()["routing"]["outcome"] == "delegate"
    finally:
        stack.harbour.set_routing(BOOTSTRAP_PROFILE_TOML)


def test_the_whole_effect_set_flow_through_the_cli(stack: Stack) -> None:
    """`marque request --effects FILE` (a CSV input beside it) waits for approval with its
    rows shown, `marque approve` by another principal issues it, `exec --request` applies it,
    and `requests show` ends verified with the set receipt."""
    set_balances(stack, {1: 100, 2: 100, 3: 100})
    folder = stack.root / "cli-effects"
    folder.mkdir()
    (folder / "topup.json").write_text(json.dumps({
        "version": "marque-effect-set/0.1", "members": [
            {**DECLARATION["members"][0], "input": "topup.csv"}]}))
    (folder / "topup.csv").write_text("id,balance\n1,110\n2,120\n")
    # CSV values are strings; SQLite's INTEGER affinity stores them as integers.
    asked = stack.cli(stack.alice, "request", "--pilot", "p1", "--target", "bank",
                      "--effects", folder / "topup.json", "--executions", 1, "--max-rows", 5,
                      "--request-id", "cli-topup", "--json")
    assert asked.returncode == 0, asked
    request = asked.json
    assert request["state"] == "awaiting_approval", request
    assert request["change"]["effect_set"]["inputs"]["topup"]["rows"] == [
        {"balance": "110", "id": "1"}, {"balance": "120", "id": "2"}]
    human = stack.cli(stack.bob, "requests", "show", request["id"])
    assert human.returncode == 0, human
    assert "effect topup: update accounts" in human.stdout
    assert "effect preview sha256:" in human.stdout and "→" in human.stdout

    again = stack.cli(stack.alice, "request", "--pilot", "p1", "--target", "bank",
                      "--effects", folder / "topup.json", "--executions", 1, "--max-rows", 5,
                      "--request-id", "cli-topup", "--json")
    assert again.returncode == 0 and again.json["id"] == request["id"], again

    approved = stack.cli(stack.bob, "approve", request["id"], "--reason", "two rows", "--json")
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved
    ran = stack.cli(stack.alice, "exec", "--request", request["id"], "--key",
                    stack.bank.holder_key, "--nonce", "n-1", "--json")
    assert ran.returncode == 0, ran
    assert ran.json["status"] == "applied" and ran.json["rows_affected"] == 2
    assert ran.json["result"]["effect_set"]["status"] == "applied"
    assert stack.bank.balances() == {1: 110, 2: 120, 3: 100}
    replay = stack.cli(stack.alice, "exec", "--request", "cli-topup", "--key",
                       stack.bank.holder_key, "--nonce", "n-1")
    assert replay.returncode == 0 and "set receipt sha256:" in replay.stdout, replay
    assert stack.bank.balances() == {1: 110, 2: 120, 3: 100}

    final = wait_for(stack, request["id"], lambda r: r["receipt"] is not None
                     and r["state"] == "verified")
    assert final["state"] == "verified" and final["receipt"]["row_states"] == {
        "topup": ["applied", "applied"]}
    shown = stack.cli(stack.alice, "requests", "show", request["id"])
    assert "set receipt sha256:" in shown.stdout and "topup: applied, applied" in shown.stdout


def test_request_refuses_effects_with_sql_and_a_bad_declaration_before_sending(
        stack: Stack) -> None:
    """`--effects` with `--sql` is a usage error; a declaration whose input has a duplicate
    key is refused locally with effect_duplicate_identity; neither reaches the Harbourmaster."""
    folder = stack.root / "cli-bad"
    folder.mkdir()
    (folder / "dup.json").write_text(json.dumps({
        "version": "marque-effect-set/0.1", "members": [
            {**DECLARATION["members"][0], "input": "dup.rows.json"}]}))
    (folder / "dup.rows.json").write_text('[{"id": 1, "balance": 1}, {"id": 1, "balance": 2}]')
    before = len(stack.call("GET", "/v1/requests", stack.alice).json()["requests"])
    both = stack.cli(stack.alice, "request", "--pilot", "p1", "--target", "bank", "--sql",
                     "SELECT 1", "--effects", folder / "dup.json", "--executions", 1,
                     "--max-rows", 1, "--json")
    assert both.returncode == 2 and both.json["error"]["code"] == "input_invalid", both
    dup = stack.cli(stack.alice, "request", "--pilot", "p1", "--target", "bank", "--effects",
                    folder / "dup.json", "--executions", 1, "--max-rows", 1, "--json")
    assert dup.returncode == 2, dup
    assert dup.json["error"]["code"] == "effect_duplicate_identity", dup
    assert len(stack.call("GET", "/v1/requests", stack.alice).json()["requests"]) == before


def test_a_set_whose_preview_the_pilot_refuses_is_stored_failed_with_its_id(
        stack: Stack) -> None:
    """An update of a row that does not exist: the Pilot's preview fails, the request is
    stored failed (preview_failed) and the answer names its id; no marque."""
    answer = stack.call("POST", "/v1/requests", stack.alice, json=effect_body(
        [{"id": 99, "balance": 1}], request_id=stack.fresh("missing")))
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert problem["code"] == "preview_failed", problem
    stored = stack.call("GET", f"/v1/requests/{problem['id']}", stack.alice).json()
    assert stored["state"] == "failed" and stored["failure"]["code"] == "preview_failed"
    assert stored["marque_id"] is None


def test_an_allowed_effect_set_is_previewed_and_issued_at_once(stack: Stack) -> None:
    """Under a config allowing every write, the set is previewed and prepared at once, its
    marque's approval the config CID; applying it leaves a receipt authorized by allow."""
    adopted = stack.harbour.set_routing("""\
version = "marque-routing/0.1"

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = "*"
outcome = "allow"
""")
    try:
        set_balances(stack, {1: 100, 2: 100, 3: 100})
        answer = stack.call("POST", "/v1/requests", stack.alice,
                            json=effect_body(ROWS[:1], request_id=stack.fresh("allow")))
        assert answer.status_code == 201, answer.text
        request = answer.json()
        assert request["state"] == "prepared" and request["checkpoint"] is None
        assert request["preview"]["members"][0]["item_count"] == 1
        handed = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()
        claims = unverified_claims(handed["marque"]) or {}
        assert claims["change"]["effect_preview_cid"] == request["preview"]["effect_preview_cid"]
        assert set(claims["approval"]) == {"config_cid"}
        assert execute(stack, handed["marque"], "n-1")["status"] == "applied"
        assert stack.bank.balances()[1] == 150
        final = wait_for(stack, request["id"], lambda r: r["receipt"] is not None)
        authorization = final["receipt"]["set_receipt"]["authorization"]
        assert authorization["kind"] == "allow"
        assert authorization["config_cid"] == claims["approval"]["config_cid"]
        assert adopted  # the config was adopted through the CLI
    finally:
        stack.harbour.set_routing(BOOTSTRAP_PROFILE_TOML)
