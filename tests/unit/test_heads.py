"""Signed logbook heads: what the issuer signed comes back; anything else is refused, typed."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from marque.errors import InvalidInput
from marque.logbook.chain import GENESIS
from marque.logbook.heads import (
    _HEAD_REGISTRY,
    HEAD_TYP,
    HeadInvalid,
    HeadSignatureInvalid,
    HeadUnknownKey,
    HeadWrongType,
    sign_head,
    verify_head,
)
from marque.token import ALG, TrustedKeys, new_key
from marque.token.jose import sign
from marque.token.keys import import_private
from marque.token.marques import MARQUE_REGISTRY

HEAD = {"seq": 42, "hash": "ab" * 32, "at": 1900000000.25}


def segment(value: dict[str, Any]) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(part: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return result


@pytest.fixture
def issuer() -> dict[str, Any]:
    return new_key()


@pytest.fixture
def trusted(issuer: dict[str, Any]) -> TrustedKeys:
    return TrustedKeys([issuer])


def test_a_signed_head_round_trips(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """verify_head returns exactly the {seq, hash, at} that was signed."""
    token = sign_head(HEAD, issuer)
    assert verify_head(token, trusted) == HEAD
    assert verify_head(token + "\n", trusted) == HEAD  # as read back from a saved file


def test_the_header_names_the_head_type_and_the_issuer_kid(issuer: dict[str, Any]) -> None:
    """The JWS header is {alg EdDSA, typ marque-logbook-head+jwt, kid of the issuer key};
    the payload is the head and nothing else."""
    header, payload, _ = sign_head(HEAD, issuer).split(".")
    assert decode(header) == {"alg": "EdDSA", "typ": HEAD_TYP, "kid": issuer["kid"]}
    assert decode(payload) == HEAD


def test_the_empty_chain_has_a_head(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """A logbook with no entries signs as seq 0 on the genesis hash."""
    empty = {"seq": 0, "hash": GENESIS, "at": 1900000000}
    assert verify_head(sign_head(empty, issuer), trusted) == empty


@pytest.mark.parametrize("changed", [
    {"seq": 43}, {"hash": "cd" * 32}, {"at": 1900000001.25},
])
def test_a_forged_head_is_refused(
    issuer: dict[str, Any], trusted: TrustedKeys, changed: dict[str, Any]
) -> None:
    """A head whose payload was altered after signing fails its signature."""
    header, _, signature = sign_head(HEAD, issuer).split(".")
    forged = f"{header}.{segment({**HEAD, **changed})}.{signature}"
    with pytest.raises(HeadSignatureInvalid):
        verify_head(forged, trusted)


def test_a_head_signed_by_an_untrusted_key_is_refused(trusted: TrustedKeys) -> None:
    """Another key's head names a kid nobody trusts: unknown key."""
    with pytest.raises(HeadUnknownKey):
        verify_head(sign_head(HEAD, new_key()), trusted)


def test_a_head_signed_by_a_wrong_key_under_a_trusted_kid_is_refused(
    issuer: dict[str, Any], trusted: TrustedKeys
) -> None:
    """Another key claiming the trusted kid: the signature does not verify."""
    impostor = {**new_key(), "kid": issuer["kid"]}
    with pytest.raises(HeadSignatureInvalid):
        verify_head(sign_head(HEAD, impostor), trusted)


def test_another_token_type_is_not_a_head(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """A JWS of another typ from the same trusted issuer (a marque, say) is refused by typ."""
    key = import_private(issuer, "issuer key")
    other = sign({"alg": ALG, "typ": "marque+jwt", "kid": issuer["kid"]}, HEAD, key,
                 MARQUE_REGISTRY)
    with pytest.raises(HeadWrongType):
        verify_head(other, trusted)
    untyped = sign({"alg": ALG, "kid": issuer["kid"]}, HEAD, key, MARQUE_REGISTRY)
    with pytest.raises(HeadWrongType):
        verify_head(untyped, trusted)


def test_an_unsigned_head_is_refused(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """alg none (or any alg but EdDSA) is refused before any key is consulted."""
    for alg in ("none", "HS256", "ES256"):
        header = segment({"alg": alg, "typ": HEAD_TYP, "kid": issuer["kid"]})
        with pytest.raises(HeadWrongType):
            verify_head(f"{header}.{segment(HEAD)}.c2ln", trusted)


def test_signed_claims_that_are_not_a_head_are_refused(
    issuer: dict[str, Any], trusted: TrustedKeys
) -> None:
    """A validly signed head-typed JWS whose claims are not {seq, hash, at} is refused."""
    key = import_private(issuer, "issuer key")
    header = {"alg": ALG, "typ": HEAD_TYP, "kid": issuer["kid"]}
    for claims in ({"seq": "42", "hash": HEAD["hash"], "at": 1}, {"seq": 42, "hash": "x", "at": 1},
                   {**HEAD, "extra": 1}, {"seq": 42, "hash": HEAD["hash"]}):
        with pytest.raises(HeadInvalid):
            verify_head(sign(header, claims, key, _HEAD_REGISTRY), trusted)


@pytest.mark.parametrize("token", ["", "a.b", "not a token", "a.b.c.d", 42, None])
def test_garbage_is_refused(trusted: TrustedKeys, token: Any) -> None:
    """Anything that is not a compact JWS is HeadInvalid, never a foreign exception."""
    with pytest.raises(HeadInvalid):
        verify_head(token, trusted)


@pytest.mark.parametrize("head", [
    {"seq": -1, "hash": HEAD["hash"], "at": 1}, {"seq": 1, "hash": "zz", "at": 1},
    {"seq": 1, "hash": HEAD["hash"]}, {**HEAD, "note": "x"}, {"seq": 0, "hash": "1" * 64, "at": 1},
])
def test_a_malformed_head_is_not_signed(issuer: dict[str, Any], head: dict[str, Any]) -> None:
    """sign_head refuses what verify_head would refuse: nothing malformed is ever signed."""
    with pytest.raises(InvalidInput):
        sign_head(head, issuer)


def test_refusals_carry_a_stable_code(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """Every head refusal is an input_invalid error (exit 2), never a bare exception."""
    with pytest.raises(HeadInvalid) as refused:
        verify_head(sign_head(HEAD, new_key()), trusted)
    assert refused.value.code == "input_invalid"
    assert refused.value.exit_status == 2
