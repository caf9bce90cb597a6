"""Effect Set requests at the Harbourmaster, pure parts: identity preimages, routing per
member, reading a stored change, checking a Pilot's preview, the console's row tones."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from marque.change import Budget, EffectSetChange
from marque.effects.declare import capture_input, parse_declaration
from marque.effects.preview import Strength
from marque.effects.request import EffectSetSubmission
from marque.errors import EffectDuplicateIdentity, InvalidInput, MarqueInvalid
from marque.harbour.console.views import ROW_STATES, _effect_preview, tone_of
from marque.harbour.effect_requests import EffectSetRequest
from marque.harbour.identity import (
    NO_INPUT_INTENT,
    effect_request_identity,
    request_identity,
)
from marque.harbour.request_change import marque_change, stored_change
from marque.harbour.routing import BOOTSTRAP_PROFILE, evaluate_effects, parse_config
from marque.harbour.routing.classify import table_resource

DECLARATION = {"version": "marque-effect-set/0.1", "members": [
    {"effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
     "failure_policy": "halt", "max_items": 10}]}


def _cid(obj: Any) -> str:
    """A second minimal JCS (ASCII keys and values only, as used here)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _submission(rows: list[dict[str, Any]], strength: dict[str, Strength] | None = None
                ) -> EffectSetSubmission:
    relation = capture_input(json.dumps(rows).encode(), "json")
    return EffectSetSubmission(parse_declaration(DECLARATION), {"topup": relation},
                               strength or {})


ROWS = [{"id": 1, "balance": 150}, {"id": 2, "balance": 250}]


def test_the_effect_request_preimages_are_the_documented_ones() -> None:
    """program, parameters, input intent and fingerprint recomputed by hand match."""
    sub = _submission(ROWS)
    got = effect_request_identity("h1", "alice", "r-1", sub, Budget(1, 10), 600, "p1", "bank")
    declaration_cid = _cid({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
         "command": None, "failure_policy": "halt", "max_items": 10}]})
    program = _cid({"version": "marque-effect-request-program/0.1", "pilot_id": "p1",
                    "target": "bank", "declaration_cid": declaration_cid, "strength": {},
                    "budget": {"executions": 1, "max_rows": 10, "attempts_per_nonce": 3},
                    "ttl_seconds": 600})
    parameters = _cid({"version": "marque-request-parameters/0.1", "params": []})
    input_cid = _cid({"version": "marque-effect-input/0.1", "columns": ["balance", "id"],
                      "rows": sorted(ROWS, key=lambda r: json.dumps(r, sort_keys=True,
                                                                   separators=(",", ":")))})
    intent = _cid({"version": "marque-caller-input-intent/0.1", "selection": "effect_inputs",
                   "inputs": {"topup": input_cid}})
    assert (got.program_definition_cid, got.parameter_values_cid,
            got.caller_input_intent_cid) == (program, parameters, intent)
    assert got.caller_input_intent_cid != NO_INPUT_INTENT
    assert got.intent_fingerprint == _cid({
        "version": "actql-logical-request-intent/0.1", "caller_input_intent_cid": intent,
        "parameter_values_cid": parameters, "program_definition_cid": program})


def test_row_order_does_not_change_the_intent_but_a_value_or_strength_does() -> None:
    """Same relation in another order → same fingerprint; a value or a strength → another."""
    def fingerprint(sub: EffectSetSubmission) -> str:
        return effect_request_identity("h1", "alice", "r-1", sub, Budget(1, 10), 600, "p1",
                                       "bank").intent_fingerprint

    same = fingerprint(_submission(ROWS))
    assert fingerprint(_submission(list(reversed(ROWS)))) == same
    assert fingerprint(_submission([ROWS[0], {"id": 2, "balance": 251}])) != same
    assert fingerprint(_submission(ROWS, {"topup": Strength.TARGETED})) != same


def test_a_statement_request_keeps_no_input_intent() -> None:
    """The statement identity is unchanged by Effect Sets: NoInputIntent."""
    from marque.change import Change, Statement

    change = Change((Statement("SELECT 1"),))
    got = request_identity("h1", "alice", "r-1", change, Budget(1, 1), 60, "p1", "bank")
    assert got.caller_input_intent_cid == NO_INPUT_INTENT


def test_a_submission_round_trips_through_its_stored_claim_and_refuses_a_wrong_cid() -> None:
    """to_claim → stored_change gives the same submission; an edited claim is refused."""
    sub = _submission(ROWS)
    claim = sub.to_claim()
    back = stored_change(claim)
    assert isinstance(back, EffectSetRequest) and back.change_cid == sub.change_cid
    claim["effect_set"]["inputs"]["topup"]["rows"][0]["balance"] = 1
    with pytest.raises(MarqueInvalid):
        stored_change(claim)


def test_a_submission_is_bound_when_read_so_a_duplicate_key_is_refused() -> None:
    """A relation with one key twice is effect_duplicate_identity before anything is stored."""
    body = {"declaration": DECLARATION, "inputs": {"topup": {
        "version": "marque-effect-input/0.1", "columns": ["balance", "id"],
        "rows": [{"id": 1, "balance": 1}, {"id": 1, "balance": 2}]}}}
    with pytest.raises(EffectDuplicateIdentity):
        EffectSetSubmission.from_json(body, InvalidInput)
    with pytest.raises(InvalidInput):
        EffectSetSubmission.from_json({**body, "extra": 1}, InvalidInput)


def test_the_marque_change_of_an_effect_set_names_its_stored_preview() -> None:
    """marque_change gives EffectSetChange(effect_preview_cid); no preview is refused."""
    claim = _submission(ROWS).to_claim()
    cid = "sha256:" + "ab" * 32
    assert marque_change(claim, {"effect_preview_cid": cid}) == EffectSetChange(cid)
    with pytest.raises(InvalidInput):
        marque_change(claim, None)


@pytest.mark.parametrize("table,dialect,resource", [
    ("accounts", "sqlite", "main.accounts"), ("Main.Accounts", "sqlite", "main.accounts"),
    ("accounts", "postgres", "public.accounts"), ("ops.Orders", "postgres", "ops.Orders"),
])
def test_a_members_table_is_named_as_the_classifier_names_a_quoted_identifier(
        table: str, dialect: str, resource: str) -> None:
    """Default schema per dialect; lower-case on SQLite, exact on PostgreSQL."""
    assert table_resource(table, dialect) == resource


def test_routing_combines_members_and_a_command_is_other() -> None:
    """Bootstrap: writes delegate; a config denying one table denies the whole set; a command
    member is routed as operation other."""
    members = [("update", "accounts"), ("command", "accounts")]
    decision = evaluate_effects(BOOTSTRAP_PROFILE, "alice", "bank", members, "sqlite")
    assert decision.outcome == "delegate" and not decision.all_read
    assert [(t.operation, t.resource) for t in decision.tuples] == [
        ("write", "main.accounts"), ("other", "main.accounts")]
    config = parse_config('''version = "marque-routing/0.1"

[[entry]]
principal = "*"
target = "*"
resource = ["main.notes"]
operation = "*"
outcome = "deny"
''')
    denied = evaluate_effects(config, "alice", "bank",
                              [("update", "accounts"), ("create", "notes")], "sqlite")
    assert (denied.outcome, denied.code) == ("deny", "account_denied")


def test_an_unknown_row_is_shown_as_needing_a_human_never_in_the_failure_tone() -> None:
    """The console tones unknown rows and an unknown_outcome receipt `unknown`, not `bad`."""
    assert tone_of("unknown", ROW_STATES).tone == "unknown"
    assert tone_of("unknown_outcome", ROW_STATES).tone == "unknown"
    assert tone_of("needs_reconciliation", ROW_STATES).tone == "unknown"
    preview = {"effect_preview_cid": "sha256:" + "0" * 64, "members": [{
        "effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
        "item_count": 1, "changes": [{
            "row_or_item_key": {"id": 1},
            "before": {"state": "present", "value": {"id": 1, "balance": 100}},
            "after": {"state": "present", "value": {"id": 1, "balance": 150}}}]}]}
    shown = _effect_preview(preview, {"row_states": {"topup": ["unknown"]}})
    assert shown is not None
    [row] = shown["members"][0]["rows"]
    assert row["state"]["tone"].tone == "unknown"
    assert row["cells"] == [{"column": "balance", "before": 100, "after": 150,
                             "changed": True}]
