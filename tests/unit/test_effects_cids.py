"""Effect Set preimages (seed 002, DESIGN §8): CID vectors for every one of them.

Expected CIDs are computed here by a second, minimal RFC 8785 encoder
(strings, integers, booleans, null, arrays and objects), independent of
``marque.cid``, over the preimages exactly as docs/effects.md writes them —
and, for the preview, by building the whole expected preview object by hand
in the seed's order: row CIDs, member CIDs, the set CID, then the keys.
"""

from __future__ import annotations

from typing import Any

from jcs_reference import jcs, jcs_string, reference_cid

from marque.cid import canonicalize
from marque.effects import cids
from marque.effects.declare import bind, capture_input, parse_declaration
from marque.effects.preview import Strength, build_preview
from marque.harbour.identity import NO_INPUT_INTENT

# The second JCS encoder: tests/unit/jcs_reference.py.
_jcs, _jcs_string, _cid = jcs, jcs_string, reference_cid


SCOPE = _cid({"version": "actql-logical-request/0.1", "authority_scope_cid": _cid({"a": 1}),
              "caller_request_id": "fix 42"})
RUN = _cid({"version": "test-run", "n": 1})


def test_test_encoder_agrees_with_marque_cid_on_a_tricky_object() -> None:
    """The test's encoder matches RFC 8785 where it matters: UTF-16 key order, escapes."""
    tricky = {"\ue000": 1, "😀": [None, True, "a\u001fb\"\\\n"], "b": {"é": -7}, "a": []}
    assert _jcs(tricky).encode("utf-8") == canonicalize(tricky)


# -- single preimages --------------------------------------------------------------------


def test_content_row_cid_vector() -> None:
    """content_cid is CID({version: "actql-effect-content-row/0.1", value: after})."""
    row = {"msg": "café ✓", "n": 7, "ok": None}
    assert cids.content_cid(row) == _cid({"version": "actql-effect-content-row/0.1",
                                          "value": row})


def test_command_payload_cid_vector() -> None:
    """A command's payload CID is CID({version: "marque-effect-command-payload/0.1", value})."""
    payload = {"job": "reindex", "shard": 3}
    assert cids.command_payload_cid(payload) == _cid(
        {"version": "marque-effect-command-payload/0.1", "value": payload})


def test_row_version_cid_vector_for_present_empty_and_absent_rows() -> None:
    """A row's content version is CID({version: "marque-effect-row-version/0.1", row: state})."""
    for state in ({"state": "present", "value": {"id": 1, "email": "a@x"}},
                  {"state": "present", "value": {}}, {"state": "absent"}):
        assert cids.row_version_cid(state) == _cid(
            {"version": "marque-effect-row-version/0.1", "row": state})
    assert cids.row_content_guard({"state": "absent"}) == {
        "kind": "row_content",
        "cid": _cid({"version": "marque-effect-row-version/0.1", "row": {"state": "absent"}})}


def test_row_preview_cid_vector() -> None:
    """row_preview_cid is Marque's marque-effect-row-preview/0.1 preimage, field for field."""
    fields = {
        "effect_id": "fix", "kind": "update", "table": "public.customers",
        "row_or_item_key": {"id": 7},
        "before": {"state": "present", "value": {"id": 7, "email": "old"}},
        "after": {"state": "present", "value": {"id": 7, "email": "new"}},
        "intended_changes": {"values": {"email": "new"}},
        "target_version": {"kind": "row_content", "cid": _cid({"x": 1})},
    }
    assert cids.row_preview_cid(**fields) == _cid(
        {"version": "marque-effect-row-preview/0.1", **fields})


def test_row_idempotency_key_vector() -> None:
    """The row key is CID({version: "actql-row-idempotency-key/0.1", logical_request_scope_cid,
    effect_preview_cid, row_or_item_key})."""
    preview = _cid({"p": 1})
    item = {"content_cid": _cid({"c": 1}), "occurrence": 1}
    assert cids.row_idempotency_key(SCOPE, preview, item) == _cid({
        "version": "actql-row-idempotency-key/0.1", "logical_request_scope_cid": SCOPE,
        "effect_preview_cid": preview, "row_or_item_key": item})


def test_effect_apply_key_vector() -> None:
    """The apply key is CID({version: "actql-effect-apply-idempotency-key/0.1", …})."""
    preview, member = _cid({"p": 1}), _cid({"m": 1})
    assert cids.effect_apply_key(SCOPE, preview, "fix", member) == _cid({
        "version": "actql-effect-apply-idempotency-key/0.1", "logical_request_scope_cid": SCOPE,
        "effect_preview_cid": preview, "effect_id": "fix", "effect_member_preview_cid": member})


def test_input_and_caller_input_intent_vectors() -> None:
    """A captured relation's CID and the request's caller_input_intent_cid, as documented."""
    relation = capture_input(b"id,email\r\n10,b\r\n2,a\r\n", "csv")
    rows = [{"email": "a", "id": "2"}, {"email": "b", "id": "10"}]  # by canonical bytes
    expected_input = _cid({"version": "marque-effect-input/0.1", "columns": ["email", "id"],
                           "rows": rows})
    assert relation.input_cid == expected_input
    assert cids.caller_input_intent_cid({"fix": expected_input}) == _cid({
        "version": "marque-caller-input-intent/0.1", "selection": "effect_inputs",
        "inputs": {"fix": expected_input}})


def test_an_explicit_empty_input_is_not_no_input() -> None:
    """An explicitly selected empty relation has an identity other than NoInputIntent."""
    empty = capture_input(b"[]", "json")
    assert cids.caller_input_intent_cid({"fix": empty.input_cid}) != NO_INPUT_INTENT


# -- the whole preview, built by hand in the seed's order ---------------------------------


def _declaration() -> Any:
    return parse_declaration({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "fix", "kind": "update", "table": "public.customers", "key": ["id"],
         "max_items": 5},
        {"effect_id": "log", "kind": "create", "table": "audit", "failure_policy": "continue",
         "max_items": 5},
        {"effect_id": "jobs", "kind": "command", "table": "queue", "command": "enqueue",
         "max_items": 5},
    ]})


def _inputs() -> dict[str, Any]:
    return {"fix": capture_input(b'[{"id": 10, "email": "b@x"}, {"id": 2, "email": "a@x"}]',
                                 "json"),
            "log": capture_input(b"msg\nsame\nsame\n", "csv"),
            "jobs": capture_input(b'[{"job": "reindex"}]', "json")}


READS = {"fix": {'{"id":2}': {"state": "present", "value": {"id": 2, "email": "old2"}},
                 '{"id":10}': {"state": "present", "value": {"id": 10, "email": "old10"}}}}


def _expected_preview(strength: str) -> dict[str, Any]:
    """The preview of _declaration() over _inputs() and READS, computed independently."""
    guard = {"kind": "not_applicable"}

    def row(member: dict[str, Any], key: dict[str, Any], before: dict[str, Any],
            after: dict[str, Any], values: dict[str, Any], version: dict[str, Any]
            ) -> dict[str, Any]:
        change = {"row_or_item_key": key, "before": before, "after": after,
                  "intended_changes": {"values": values}, "target_version": version}
        change["row_preview_cid"] = _cid({
            "version": "marque-effect-row-preview/0.1", "effect_id": member["effect_id"],
            "kind": member["kind"], "table": member["table"], **change})
        return change

    targeted = strength == "targeted"
    unavailable = {"state": "unavailable"}
    fix = {"effect_id": "fix", "kind": "update", "table": "public.customers", "key": ["id"],
           "command": None, "failure_policy": "halt", "max_items": 5, "strength": strength,
           "item_count": 2}
    fix_rows = []
    for ident in (2, 10):  # numeric key order: 2 before 10
        before = READS["fix"][f'{{"id":{ident}}}']
        version = {"kind": "row_content",
                   "cid": _cid({"version": "marque-effect-row-version/0.1", "row": before})}
        email = "a@x" if ident == 2 else "b@x"
        after = {"state": "present", "value": {"id": ident, "email": email}}
        fix_rows.append(row(fix, {"id": ident}, unavailable if targeted else before,
                            unavailable if targeted else after, {"email": email}, version))
    fix["changes"] = fix_rows
    log = {"effect_id": "log", "kind": "create", "table": "audit", "key": [], "command": None,
           "failure_policy": "continue", "max_items": 5, "strength": strength, "item_count": 2}
    content = _cid({"version": "actql-effect-content-row/0.1", "value": {"msg": "same"}})
    log["changes"] = [
        row(log, {"content_cid": content, "occurrence": n},
            unavailable if targeted else {"state": "absent"},
            unavailable if targeted else {"state": "present", "value": {"msg": "same"}},
            {"msg": "same"}, guard)
        for n in (0, 1)]
    jobs = {"effect_id": "jobs", "kind": "command", "table": "queue", "key": [],
            "command": "enqueue", "failure_policy": "halt", "max_items": 5,
            "strength": strength, "item_count": 1}
    payload = _cid({"version": "marque-effect-command-payload/0.1", "value": {"job": "reindex"}})
    na = {"state": "not_applicable"}
    jobs["changes"] = [row(jobs, {"command": "enqueue", "target": "queue",
                                  "payload_cid": payload}, na, na, {"job": "reindex"}, guard)]
    members = [fix, log, jobs]
    for member in members:  # step 2: member CIDs, over members without keys
        member["effect_member_preview_cid"] = _cid({
            "version": "actql-effect-member-preview/0.1", "member": dict(member)})
    inputs = {name: rel.input_cid for name, rel in _inputs().items()}
    intent = _cid({"version": "marque-caller-input-intent/0.1", "selection": "effect_inputs",
                   "inputs": inputs})
    body = {"version": "actql-effect-preview/0.1", "pilot_id": "pilot-a", "target": "main",
            "caller_input_intent_cid": intent, "members": members, "executed": False}
    set_cid = _cid(body)  # step 3: the set CID, over the body without keys and Run/context
    for member in members:  # step 4: only now the keys
        for change in member["changes"]:
            change["row_idempotency_key"] = _cid({
                "version": "actql-row-idempotency-key/0.1", "logical_request_scope_cid": SCOPE,
                "effect_preview_cid": set_cid, "row_or_item_key": change["row_or_item_key"]})
    return {**body, "effect_preview_cid": set_cid, "run_identity_cid": RUN,
            "authoring_context": {"logical_request_scope": SCOPE, "previewed_at": None}}


def _built(strength: Strength) -> Any:
    return build_preview(bind(_declaration(), _inputs()), READS, pilot_id="pilot-a",
                         target="main", logical_request_scope=SCOPE, run_identity_cid=RUN,
                         strength=strength)


def test_full_diff_preview_vector_matches_the_hand_built_preview() -> None:
    """A full_diff preview is exactly the hand-built object: every row CID, member CID,
    the set CID and every row key."""
    assert _built(Strength.FULL_DIFF).to_json() == _expected_preview("full_diff")


def test_targeted_preview_vector_matches_the_hand_built_preview() -> None:
    """A targeted preview: before (and after, unless deleting) unavailable; guards kept."""
    assert _built(Strength.TARGETED).to_json() == _expected_preview("targeted")


def test_apply_key_vectors_of_a_built_preview() -> None:
    """Each member's apply key binds scope, set CID, effect_id and its member CID."""
    preview = _built(Strength.FULL_DIFF)
    for member in preview.members:
        assert member.effect_apply_key == _cid({
            "version": "actql-effect-apply-idempotency-key/0.1",
            "logical_request_scope_cid": SCOPE, "effect_preview_cid": preview.effect_preview_cid,
            "effect_id": member.effect_id,
            "effect_member_preview_cid": member.effect_member_preview_cid})


def test_set_cid_ignores_run_context_and_keys_but_nothing_else() -> None:
    """Another Run, scope or preview time leaves effect_preview_cid alone; a row value moves it."""
    base = _built(Strength.FULL_DIFF)
    other = build_preview(bind(_declaration(), _inputs()), READS, pilot_id="pilot-a",
                          target="main", logical_request_scope=_cid({"other": 1}),
                          run_identity_cid=_cid({"run": 2}), previewed_at="2025-01-01T00:00:00Z")
    assert other.effect_preview_cid == base.effect_preview_cid
    assert [r.row_idempotency_key for _, r in other.rows()] != [
        r.row_idempotency_key for _, r in base.rows()]
    changed = {"fix": {**READS["fix"], '{"id":2}': {"state": "present",
                                                    "value": {"id": 2, "email": "old3"}}}}
    moved = build_preview(bind(_declaration(), _inputs()), changed, pilot_id="pilot-a",
                          target="main", logical_request_scope=SCOPE, run_identity_cid=RUN)
    assert moved.effect_preview_cid != base.effect_preview_cid
