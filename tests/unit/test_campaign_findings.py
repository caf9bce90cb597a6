"""Regressions for what the reliability campaign (issue 13, rows 13 and 14) found in the product.

Each test replays one finding with a token hand-assembled the way the
campaign's forgery row builds it (``tests/soak/scenarios/_forge.py``).
"""

from __future__ import annotations

import json

import pytest
from soak.scenarios._forge import _signed_raw, parts

from marque.change import Budget, Change, Statement
from marque.errors import MarqueInvalid
from marque.token import (
    TrustedKeys,
    issue_marque,
    new_key,
    public_jwk,
    unverified_claims,
    verify_marque,
)
from marque.token.service_tokens import issue_query_token, verify_query_token


@pytest.fixture(scope="module")
def keys() -> dict[str, dict]:
    return {"issuer": new_key(), "holder": new_key()}


def _marque(keys: dict[str, dict]) -> str:
    return issue_marque(keys["issuer"], pilot_id="p1", incarnation="i1", target="bank",
                        holder_jwk=public_jwk(keys["holder"]),
                        change=Change(statements=(Statement("SELECT 1"),)),
                        budget=Budget(1, 1), ttl_seconds=600)


def test_unverified_claims_of_a_deeply_nested_payload_is_none(keys: dict[str, dict]) -> None:
    """A payload nested past the parser's depth has no label (it was a 500 from the service)."""
    header, _, _ = parts(_marque(keys))
    deep = _signed_raw(json.dumps(header), b"[" * 100_000 + b"]" * 100_000, keys["issuer"])
    assert unverified_claims(deep) is None
    with pytest.raises(MarqueInvalid):
        verify_marque(deep, TrustedKeys([public_jwk(keys["issuer"])]), pilot_id="p1",
                      incarnation="i1", targets={"bank"})


def test_a_claim_with_an_unpaired_surrogate_is_refused(keys: dict[str, dict]) -> None:
    """Claims must be I-JSON: an escaped lone surrogate is marque_invalid, even when signed."""
    header, claims, _ = parts(_marque(keys))
    text = json.dumps(claims, separators=(",", ":"))[:-1] + ',"note":"\\ud800"}'
    token = _signed_raw(json.dumps(header), text, keys["issuer"])
    with pytest.raises(MarqueInvalid, match="not Unicode text"):
        verify_marque(token, TrustedKeys([public_jwk(keys["issuer"])]), pilot_id="p1",
                      incarnation="i1", targets={"bank"})
    query = issue_query_token(keys["issuer"], pilot_id="p1", marque_id="mq_1")
    q_header, q_claims, _ = parts(query)
    q_text = json.dumps({**q_claims, "iss": "x"}, separators=(",", ":")).replace(
        '"iss":"x"', '"iss":"\\udfff"')
    with pytest.raises(MarqueInvalid, match="not Unicode text"):
        verify_query_token(_signed_raw(json.dumps(q_header), q_text, keys["issuer"]),
                           TrustedKeys([public_jwk(keys["issuer"])]), pilot_id="p1",
                           remember_jti=None)
