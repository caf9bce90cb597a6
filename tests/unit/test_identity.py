"""Logical request identity (DESIGN §11.1): caller-id rules and the closed CID preimages.

Expected CIDs are computed here by a second, minimal RFC 8785 encoder (enough
for strings, integers, booleans, null, arrays and objects), independent of
``marque.cid``, over the preimages exactly as §11.1 writes them.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

import pytest
from jcs_reference import jcs, jcs_string, reference_cid

from marque import request_ids
from marque.change import Budget, Change, Guard, Statement
from marque.cid import canonicalize
from marque.errors import RequestIdInvalid
from marque.harbour.identity import (
    NO_INPUT_INTENT,
    authority_scope_cid,
    intent_fingerprint,
    logical_request_scope,
    parameter_values_cid,
    program_definition_cid,
    request_identity,
)
from marque.request_ids import (
    check_request_id,
    format_idempotency_key,
    parse_idempotency_key,
    resolve_request_id,
)

# The second JCS encoder: tests/unit/jcs_reference.py.
_jcs, _jcs_string, _cid = jcs, jcs_string, reference_cid


def test_test_encoder_agrees_with_marque_cid_on_a_tricky_object() -> None:
    """The test's encoder matches RFC 8785 where it matters: UTF-16 key order, escapes."""
    tricky = {"\ue000": 1, "😀": [None, True, "a\u001fb\"\\\n"], "b": {"é": -7}, "a": []}
    assert _jcs(tricky).encode("utf-8") == canonicalize(tricky)
    # U+1F600 sorts after U+E000 by code point but before it by UTF-16 code units (0xD83D).
    assert _jcs(tricky).index("😀") < _jcs(tricky).index("\ue000")


# -- fixed inputs ---------------------------------------------------------------------

HARBOUR = "hb_7f3a"
PRINCIPAL = "zoë"  # NFC
REQUEST_ID = "release 42 — café ✓"
SQL = ['UPDATE accounts SET note = $1\n  WHERE id = $2', "DELETE FROM \"T\tab\" WHERE k = $1"]
PARAMS: list[list[Any]] = [['h\u00e9llo 😀\t"q"', 7], [None]]
GUARD = Guard("SELECT count(*) = $1 FROM accounts", (3,), True, "both")
BUDGET = Budget(executions=2, max_rows=10, attempts_per_nonce=4)


def _change() -> Change:
    return Change(
        statements=tuple(Statement(sql, tuple(p)) for sql, p in zip(SQL, PARAMS, strict=True)),
        guards=(GUARD,),
        isolation="serializable",
        statement_timeout_ms=5000,
    )


def _expected_program(**overrides: Any) -> dict[str, Any]:
    preimage = {
        "version": "marque-request-program/0.1",
        "pilot_id": "pilot-a",
        "target": "main",
        "statements": SQL,
        "guards": [{"sql": GUARD.sql, "params": [3], "expect": True, "when": "both"}],
        "isolation": "serializable",
        "statement_timeout_ms": 5000,
        "budget": {"executions": 2, "max_rows": 10, "attempts_per_nonce": 4},
        "ttl_seconds": 900,
    }
    preimage.update(overrides)
    return preimage


def test_authority_scope_cid_vector() -> None:
    """authority_scope_cid is the CID of exactly §11.1's object."""
    expected = _cid({"version": "marque-authority-scope/0.1", "harbour_id": HARBOUR,
                     "principal": PRINCIPAL})
    assert authority_scope_cid(HARBOUR, PRINCIPAL) == expected


def test_logical_request_scope_vector() -> None:
    """logical_request_scope is the CID of exactly §11.1's object."""
    authority = _cid({"version": "marque-authority-scope/0.1", "harbour_id": HARBOUR,
                      "principal": PRINCIPAL})
    expected = _cid({"version": "actql-logical-request/0.1", "authority_scope_cid": authority,
                     "caller_request_id": REQUEST_ID})
    assert logical_request_scope(authority, REQUEST_ID) == expected


def test_program_definition_cid_vector() -> None:
    """program_definition_cid: SQL texts, full guard claims, budget object, null timeout."""
    got = program_definition_cid("pilot-a", "main", SQL, [GUARD], "serializable", 5000, BUDGET,
                                 900)
    assert got == _cid(_expected_program())
    got_null = program_definition_cid("pilot-a", "main", SQL, [GUARD], "serializable", None,
                                      BUDGET, 900)
    assert got_null == _cid(_expected_program(statement_timeout_ms=None))
    assert got_null != got


def test_parameter_values_cid_vector() -> None:
    """parameter_values_cid: one list per statement, values as JSON scalars."""
    expected = _cid({"version": "marque-request-parameters/0.1", "params": PARAMS})
    assert parameter_values_cid(PARAMS) == expected
    assert parameter_values_cid([tuple(p) for p in PARAMS]) == expected


def test_no_input_intent_vector() -> None:
    """NO_INPUT_INTENT is the seed's NoInputIntent, pinned."""
    expected = _cid({"version": "actql-caller-input-intent/0.1", "selection": "none"})
    assert NO_INPUT_INTENT == expected
    assert NO_INPUT_INTENT == (
        "sha256:" + hashlib.sha256(
            b'{"selection":"none","version":"actql-caller-input-intent/0.1"}').hexdigest()
    )


def test_intent_fingerprint_vector() -> None:
    """intent_fingerprint is the CID of exactly §11.1's object."""
    params = _cid({"version": "marque-request-parameters/0.1", "params": PARAMS})
    program = _cid(_expected_program())
    expected = _cid({"version": "actql-logical-request-intent/0.1",
                     "caller_input_intent_cid": NO_INPUT_INTENT,
                     "parameter_values_cid": params, "program_definition_cid": program})
    assert intent_fingerprint(NO_INPUT_INTENT, params, program) == expected


def test_request_identity_composes_every_preimage() -> None:
    """request_identity builds each CID from a Change as the vectors above do."""
    ident = request_identity(HARBOUR, PRINCIPAL, REQUEST_ID, _change(), BUDGET, 900,
                             "pilot-a", "main")
    authority = _cid({"version": "marque-authority-scope/0.1", "harbour_id": HARBOUR,
                      "principal": PRINCIPAL})
    params = _cid({"version": "marque-request-parameters/0.1", "params": PARAMS})
    program = _cid(_expected_program())
    assert ident.caller_request_id == REQUEST_ID
    assert ident.authority_scope_cid == authority
    assert ident.logical_request_scope == _cid({"version": "actql-logical-request/0.1",
                                                "authority_scope_cid": authority,
                                                "caller_request_id": REQUEST_ID})
    assert ident.program_definition_cid == program
    assert ident.parameter_values_cid == params
    assert ident.caller_input_intent_cid == NO_INPUT_INTENT
    assert ident.intent_fingerprint == _cid({"version": "actql-logical-request-intent/0.1",
                                             "caller_input_intent_cid": NO_INPUT_INTENT,
                                             "parameter_values_cid": params,
                                             "program_definition_cid": program})


def test_scope_and_intent_move_independently() -> None:
    """Another principal or id is another scope with the same intent; any change of the
    work is another intent in the same scope; reason is not an input at all."""
    base = request_identity(HARBOUR, PRINCIPAL, REQUEST_ID, _change(), BUDGET, 900,
                            "pilot-a", "main")
    other_principal = request_identity(HARBOUR, "zoe", REQUEST_ID, _change(), BUDGET, 900,
                                       "pilot-a", "main")
    other_id = request_identity(HARBOUR, PRINCIPAL, REQUEST_ID + "!", _change(), BUDGET, 900,
                                "pilot-a", "main")
    for other in (other_principal, other_id):
        assert other.logical_request_scope != base.logical_request_scope
        assert other.intent_fingerprint == base.intent_fingerprint

    def with_change(**kw: Any) -> Change:
        fields = {"statements": _change().statements, "guards": (GUARD,),
                  "isolation": "serializable", "statement_timeout_ms": 5000}
        fields.update(kw)
        return Change(**fields)

    variants = [
        (with_change(statements=(Statement(SQL[0], ("other", 7)), Statement(SQL[1], (None,)))),
         BUDGET, 900, "pilot-a", "main"),
        (with_change(guards=(Guard(GUARD.sql, (4,), True, "both"),)), BUDGET, 900, "pilot-a",
         "main"),
        (with_change(isolation="repeatable_read"), BUDGET, 900, "pilot-a", "main"),
        (_change(), Budget(2, 11, 4), 900, "pilot-a", "main"),
        (_change(), BUDGET, 901, "pilot-a", "main"),
        (_change(), BUDGET, 900, "pilot-b", "main"),
        (_change(), BUDGET, 900, "pilot-a", "other"),
    ]
    for change, budget, ttl, pilot, target in variants:
        other = request_identity(HARBOUR, PRINCIPAL, REQUEST_ID, change, budget, ttl, pilot,
                                 target)
        assert other.logical_request_scope == base.logical_request_scope
        assert other.intent_fingerprint != base.intent_fingerprint
    assert "reason" not in inspect.signature(request_identity).parameters
    assert "reason" not in inspect.signature(program_definition_cid).parameters


# -- caller request ids ---------------------------------------------------------------

REFUSED_IDS = [
    pytest.param("", "empty", id="empty"),
    pytest.param("cafe\u0301", "nfc", id="nfd"),
    pytest.param("a\nb", "c0", id="c0-lf"),
    pytest.param("a\x00", "c0", id="c0-nul"),
    pytest.param("tab\there", "c0", id="c0-tab"),
    pytest.param("a\x85b", "c1", id="c1-nel"),
    pytest.param("\x9f", "c1", id="c1-last"),
    pytest.param("a\x7fb", "del", id="del"),
    pytest.param("a" * 257, "length", id="257-ascii"),
    pytest.param("é" * 128 + "a", "length", id="257-bytes-2-byte-chars"),
    pytest.param("a\ud800", "surrogate", id="lone-surrogate"),
    pytest.param(42, "type", id="not-a-string"),
]


@pytest.mark.parametrize(("value", "rule"), REFUSED_IDS)
def test_caller_id_rule_violations_are_refused(value: Any, rule: str) -> None:
    """Each §11.1 rule, broken once, is request_id_invalid naming that rule."""
    with pytest.raises(RequestIdInvalid) as caught:
        check_request_id(value)
    assert caught.value.code == "request_id_invalid"
    assert caught.value.detail["rule"] == rule
    if isinstance(value, str) and value:
        with pytest.raises(RequestIdInvalid):
            logical_request_scope(authority_scope_cid(HARBOUR, PRINCIPAL), value)


@pytest.mark.parametrize(
    "value",
    ["a" * 256, "é" * 128, "😀" * 64, "café", "x", " spaced ", "\u00a0nbsp", "\ufeff"],
)
def test_valid_caller_ids_are_accepted_unchanged(value: str) -> None:
    """Up to 256 UTF-8 bytes of NFC text without controls is accepted exactly as given."""
    assert check_request_id(value) == value


def test_error_messages_name_the_rule() -> None:
    """A refused id's message says which rule it broke."""
    messages = {}
    for value in ("", "e\u0301", "\n", "\x85", "\x7f", "a" * 257):
        with pytest.raises(RequestIdInvalid) as caught:
            check_request_id(value)
        messages[value] = caught.value.message
    assert "empty" in messages[""]
    assert "NFC" in messages["e\u0301"]
    assert "C0" in messages["\n"] and "U+000A" in messages["\n"]
    assert "C1" in messages["\x85"]
    assert "DEL" in messages["\x7f"]
    assert "256" in messages["a" * 257] and "257" in messages["a" * 257]


# -- Idempotency-Key ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [('"abc"', "abc"), ('  "abc"  ', "abc"), ('"a\\"b"', 'a"b'), ('"a\\\\b"', "a\\b"),
     ('"with space"', "with space")],
)
def test_idempotency_key_parses_an_sf_string(header: str, expected: str) -> None:
    """An RFC 8941 String is unquoted and unescaped."""
    assert parse_idempotency_key(header) == expected


@pytest.mark.parametrize(
    "header",
    ["abc", '"abc', '"a\\nb"', '"abc";p=1', '"abc" "d"', '"é"', '""', '"a\tb"', "",
     '"a\x7fb"'],
)
def test_idempotency_key_refuses_anything_else(header: str) -> None:
    """Tokens, bad escapes, parameters, non-ASCII and empty strings are request_id_invalid."""
    with pytest.raises(RequestIdInvalid):
        parse_idempotency_key(header)


def test_idempotency_key_round_trips_and_refuses_non_ascii() -> None:
    """format_idempotency_key inverts parse; a non-ASCII id must travel in the body."""
    for value in ['plain', 'q"uote', "back\\slash", "~ !#"]:
        assert parse_idempotency_key(format_idempotency_key(value)) == value
    with pytest.raises(RequestIdInvalid):
        format_idempotency_key("café")


def test_body_and_header_ids_must_be_equal() -> None:
    """Either source alone is used; both must agree; neither is None."""
    assert resolve_request_id("r-1", None) == "r-1"
    assert resolve_request_id(None, '"r-1"') == "r-1"
    assert resolve_request_id("r-1", '"r-1"') == "r-1"
    assert resolve_request_id(None, None) is None
    with pytest.raises(RequestIdInvalid) as caught:
        resolve_request_id("r-1", '"r-2"')
    assert caught.value.detail["rule"] == "body_header_mismatch"
    with pytest.raises(RequestIdInvalid):
        resolve_request_id("bad\n", None)


def test_new_request_ids_are_valid_and_distinct() -> None:
    """A generated id passes the rules and is not reused."""
    first, second = request_ids.new_request_id(), request_ids.new_request_id()
    assert check_request_id(first) == first and first != second
