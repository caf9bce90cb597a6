"""The header rules every token reader shares: alg and typ pinned, the signer found by kid."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from joserfc.jwk import OKPKey

from marque.errors import MarqueInvalid, PopInvalid
from marque.logbook.heads import HeadUnknownKey, HeadWrongType, sign_head, verify_head
from marque.token import (
    Budget,
    Change,
    Statement,
    TrustedKeys,
    issue_marque,
    make_proof,
    new_key,
    public_jwk,
    read_marque,
    verify_proof,
)
from marque.token.header import pin_header, trusted_signer
from marque.token.service_tokens import PreviewGrant, issue_preview_token, verify_preview_token

NOW = 1_800_000_000
CHANGE = Change((Statement("UPDATE t SET x = 1"),))


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def header_of(token: str) -> dict[str, Any]:
    part = token.split(".")[0]
    result: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return result


def resigned(token: str, header: dict[str, Any], key: dict[str, Any]) -> str:
    """``token``'s payload under ``header``, really signed by ``key`` (Ed25519)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{token.split('.')[1]}"
    signature = OKPKey.import_key(key).private_key.sign(signing_input.encode())
    return f"{signing_input}.{b64(signature)}"


def test_pin_header_refuses_another_alg_or_typ_with_the_readers_class() -> None:
    """alg must be EdDSA and typ the reader's own; each refusal is the class it is given."""
    ok = {"alg": "EdDSA", "typ": "a+jwt"}
    pin_header(ok, typ="a+jwt", what="thing", error=PopInvalid)
    with pytest.raises(PopInvalid, match=r"^thing alg must be EdDSA$"):
        pin_header({**ok, "alg": "HS256"}, typ="a+jwt", what="thing", error=PopInvalid)
    with pytest.raises(MarqueInvalid, match=r"^thing typ must be a\+jwt, saw 'b'$"):
        pin_header({**ok, "typ": "b"}, typ="a+jwt", what="thing", error=MarqueInvalid,
                   offered=lambda got: f", saw {got!r}")


def test_pin_header_checks_alg_first_unless_told_typ_first() -> None:
    """A header wrong in both is refused for its alg, or for its typ with typ_first."""
    both = {"alg": "none", "typ": "b"}
    with pytest.raises(MarqueInvalid, match="alg"):
        pin_header(both, typ="a+jwt", what="thing", error=MarqueInvalid)
    with pytest.raises(MarqueInvalid, match="typ"):
        pin_header(both, typ="a+jwt", what="thing", error=MarqueInvalid, typ_first=True)


def test_trusted_signer_finds_the_key_by_kid_only() -> None:
    """A trusted kid gives its key; a missing, non-string or unknown kid is refused."""
    issuer = {**new_key(), "kid": "k1"}
    trusted = TrustedKeys([issuer])
    kid, key = trusted_signer({"kid": "k1"}, trusted, what="thing", error=MarqueInvalid,
                              unknown="unknown kid {kid}")
    assert (kid, key.thumbprint()) == ("k1", trusted.get("k1").thumbprint())  # type: ignore[union-attr]
    for header in ({}, {"kid": 7}):
        with pytest.raises(MarqueInvalid, match=r"^thing header has no kid$"):
            trusted_signer(header, trusted, what="thing", error=MarqueInvalid, unknown="-")
    with pytest.raises(MarqueInvalid, match=r"^unknown kid 'x{64}'$"):
        trusted_signer({"kid": "x" * 100}, trusted, what="thing", error=MarqueInvalid,
                       unknown="unknown kid {kid}")
    with pytest.raises(MarqueInvalid, match=r"^unknown kid ''$"):
        trusted_signer({"kid": ""}, trusted, what="thing", error=MarqueInvalid,
                       unknown="unknown kid {kid}")
    with pytest.raises(MarqueInvalid, match=r"^thing header has no kid$"):
        trusted_signer({"kid": ""}, trusted, what="thing", error=MarqueInvalid,
                       unknown="unknown kid {kid}", empty_is_missing=True)


def test_each_reader_keeps_its_own_order_class_and_words() -> None:
    """Through the real readers: a header wrong in alg and typ is refused for alg by a marque
    and a preview token, for typ by a proof and a logbook head; an empty kid is an unknown kid
    to a marque and a missing one to a head."""
    issuer, holder = new_key(), new_key()
    trusted = TrustedKeys([issuer])
    marque = issue_marque(issuer, pilot_id="p", incarnation="i", target="t",
                          holder_jwk=public_jwk(holder), change=CHANGE, budget=Budget(1, 1),
                          ttl_seconds=60, now=NOW)
    preview = issue_preview_token(
        issuer, PreviewGrant(pilot_id="p", incarnation="i", target="t", change=CHANGE), now=NOW)
    proof = make_proof(holder, marque, nonce="n", pilot_id="p", now=NOW)
    head = sign_head({"seq": 1, "hash": "ab" * 32, "at": NOW}, issuer)

    def broken(token: str, key: dict[str, Any], **members: Any) -> str:
        return resigned(token, {**header_of(token), **members}, key)

    with pytest.raises(MarqueInvalid, match=r"^marque alg must be EdDSA$"):
        read_marque(broken(marque, issuer, alg="HS256", typ="JWT"), trusted)
    with pytest.raises(MarqueInvalid, match=r"^preview token alg must be EdDSA$"):
        verify_preview_token(broken(preview, issuer, alg="HS256", typ="JWT"), trusted,
                             pilot_id="p", incarnation="i", targets={"t"}, remember_jti=None,
                             now=NOW)
    with pytest.raises(MarqueInvalid, match=r"^preview token typ must be marque-preview\+jwt, "
                                            r"got 'JWT'$"):
        verify_preview_token(broken(preview, issuer, typ="JWT"), trusted, pilot_id="p",
                             incarnation="i", targets={"t"}, remember_jti=None, now=NOW)
    with pytest.raises(PopInvalid, match=r"^proof typ must be marque-pop\+jwt$"):
        verify_proof(broken(proof, holder, alg="HS256", typ="JWT"), read_marque(marque, trusted),
                     nonce="n", pilot_id="p", remember_jti=None, now=NOW)
    with pytest.raises(HeadWrongType, match=r"^logbook head typ must be "
                                           r"marque-logbook-head\+jwt, not 'JWT'$"):
        verify_head(broken(head, issuer, alg="HS256", typ="JWT"), trusted)
    with pytest.raises(MarqueInvalid, match=r"^unknown kid '': no trusted issuer key has it$"):
        read_marque(broken(marque, issuer, kid=""), trusted)
    with pytest.raises(HeadUnknownKey, match=r"^logbook head header has no kid$"):
        verify_head(broken(head, issuer, kid=""), trusted)
