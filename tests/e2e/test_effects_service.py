"""Effect Sets through a real `marque pilot serve` process: preview token, marque, apply.

``POST /v1/previews`` with a preview token whose ``change`` is an Effect Set
answers the Effect preview and stores it by CID (nothing claimed or changed);
a marque naming that CID applies over ``POST /v1/executions``, streaming one
event per row, then the outcome with the set receipt's summary.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from e2e_support import Service, World

from marque.change import Budget, EffectSetChange
from marque.effects.declare import capture_input, parse_declaration
from marque.effects.request import EffectPreviewRequest, run_identity_cid
from marque.harbour.identity import authority_scope_cid, logical_request_scope
from marque.token import issue_marque, make_proof, public_jwk
from marque.token.service_tokens import PreviewGrant, issue_preview_token


def _request() -> EffectPreviewRequest:
    declaration = parse_declaration({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
         "failure_policy": "halt", "max_items": 5}]})
    relation = capture_input(json.dumps([{"id": 1, "balance": 150},
                                         {"id": 2, "balance": 250}]).encode(), "json")
    scope = logical_request_scope(authority_scope_cid("harbour-test", "alice"), "topup-1")
    draft = EffectPreviewRequest(declaration, {"topup": relation}, scope, "sha256:" + "0" * 64,
                                 {})
    return EffectPreviewRequest(declaration, {"topup": relation}, scope,
                                run_identity_cid(scope, draft.bound()), {})


def test_an_effect_set_previews_and_applies_over_http(world: World, service: Service) -> None:
    """The preview token's Effect Set is previewed (stored, nothing changed); its marque then
    applies row by row over the execution stream; a statement preview is unaffected."""
    issuer: dict[str, Any] = json.loads(world.issuer_key.read_text())
    holder: dict[str, Any] = json.loads(world.holder_key.read_text())
    token = issue_preview_token(issuer, PreviewGrant(
        pilot_id=world.pilot_id, incarnation=world.incarnation, target="bank",
        change=_request()))
    response = httpx.post(f"{service.url}/v1/previews", json={"preview": token}, timeout=30)
    assert response.status_code == 200, response.text
    preview = response.json()
    assert preview["version"] == "actql-effect-preview/0.1" and preview["executed"] is False
    before = [c["before"]["value"]["balance"] for c in preview["members"][0]["changes"]]
    assert before == [100, 100]
    assert world.balances() == {1: 100, 2: 100}
    assert world.ledger_count("claims") == 0

    marque = issue_marque(issuer, pilot_id=world.pilot_id, incarnation=world.incarnation,
                          target="bank", holder_jwk=public_jwk(holder),
                          change=EffectSetChange(preview["effect_preview_cid"]),
                          budget=Budget(1, 10), ttl_seconds=600)
    proof = make_proof(holder, marque, nonce="n-1", pilot_id=world.pilot_id)
    with httpx.stream("POST", f"{service.url}/v1/executions", timeout=60,
                      json={"marque": marque, "nonce": "n-1", "proof": proof}) as streamed:
        assert streamed.status_code == 200
        events = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
    kinds = [e["event"] for e in events]
    assert kinds.count("row_applied") == 2 and "receipts_sealed" in kinds
    outcome = events[-1]["outcome"]
    assert outcome["status"] == "applied" and outcome["rows_affected"] == 2
    assert outcome["result"]["effect_set"]["status"] == "applied"
    assert world.balances() == {1: 150, 2: 250}
