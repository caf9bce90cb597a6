"""Signed logbook heads (DESIGN §11.6): a Harbourmaster's word for where its chain ended.

A head ``{seq, hash, at}`` names the last entry of the logbook at a moment.
The chain alone cannot show that entries were cut from its end, or that its
tail was rewritten with every hash recomputed; a head saved earlier can (see
:func:`marque.logbook.chain.verify_against_head`). So that a saved head
cannot itself be forged to match a tampered logbook, the Harbourmaster signs
it with its issuer key, as a compact JWS of ``typ`` ``marque-logbook-head+jwt``:
``GET /v1/logbook/head`` answers one and ``marque logbook verify --head FILE``
reads one back.

Signing and checking reuse :mod:`marque.token`'s wiring — EdDSA over Ed25519
only, the key found by ``kid`` in :class:`TrustedKeys` and nowhere else, a
header that is parsed before anything in it is believed — so a head is
trusted exactly as far as a marque from the same issuer.

Refusals are :class:`HeadInvalid` and its subclasses. They carry the stable
code ``input_invalid`` of their base: a head is something a caller hands in,
and a bad one is bad input, not an execution refusal.
"""

from __future__ import annotations

from typing import Any

from marque.errors import InvalidInput
from marque.logbook.chain import check_head
from marque.token.header import pin_header, trusted_signer
from marque.token.jose import ALG, Registry, read_header, sign, verified_payload
from marque.token.keys import TrustedKeys, import_private, kid_of

__all__ = [
    "HEAD_TYP",
    "HeadInvalid",
    "HeadSignatureInvalid",
    "HeadUnknownKey",
    "HeadWrongType",
    "sign_head",
    "verify_head",
]

#: ``typ`` header of a signed logbook head.
HEAD_TYP = "marque-logbook-head+jwt"

_HEAD_CLAIMS = frozenset({"seq", "hash", "at"})
_HEAD_REGISTRY = Registry(algorithms=[ALG])


class HeadInvalid(InvalidInput):
    """A signed logbook head that cannot be believed: malformed, or its claims are not a head."""


class HeadSignatureInvalid(HeadInvalid):
    """The head's signature does not verify under the key its ``kid`` names."""


class HeadUnknownKey(HeadInvalid):
    """The head names (by ``kid``) no key this verifier trusts."""


class HeadWrongType(HeadInvalid):
    """The JWS is not a logbook head (its ``typ`` or ``alg`` is another's)."""


def sign_head(head: dict[str, Any], issuer_key: dict[str, Any]) -> str:
    """Sign ``head`` ``{seq, hash, at}`` with ``issuer_key`` (a private Ed25519 JWK).

    Returns a compact JWS whose header is ``{alg: EdDSA, typ:
    marque-logbook-head+jwt, kid}`` (the key's ``kid``, or its thumbprint) and
    whose payload is exactly ``{seq, hash, at}``. Raises :class:`InvalidInput`
    for a malformed head (``at`` is required here: a head says when) or an
    unusable key.
    """
    checked = check_head(head)
    if "at" not in checked:
        raise InvalidInput("a logbook head to sign must say when it was taken (at)")
    extra = sorted(set(head) - _HEAD_CLAIMS)
    if extra:
        raise InvalidInput(f"a logbook head holds only seq, hash and at, not {', '.join(extra)}")
    key = import_private(issuer_key, "issuer key")
    kid = kid_of(issuer_key, "issuer key")
    return sign({"alg": ALG, "typ": HEAD_TYP, "kid": kid}, checked, key, _HEAD_REGISTRY)


def verify_head(token: str, trusted: TrustedKeys) -> dict[str, Any]:
    """Check a signed head against the trusted issuer keys; returns ``{seq, hash, at}``.

    Refuses with :class:`HeadWrongType` (``typ`` or ``alg`` not a head's),
    :class:`HeadUnknownKey` (its ``kid`` is not trusted),
    :class:`HeadSignatureInvalid` (the signature does not verify — a forged or
    altered head) or :class:`HeadInvalid` (not a compact JWS, or claims that
    are not a head). Whitespace around the token (a file's trailing newline)
    is not part of it.
    """
    if isinstance(token, str):
        token = token.strip()
    header = read_header(token, _HEAD_REGISTRY, "logbook head", HeadInvalid)
    pin_header(header, typ=HEAD_TYP, what="logbook head", error=HeadWrongType, typ_first=True,
               offered=lambda got: f", not {got!r}")
    _, key = trusted_signer(header, trusted, what="logbook head", error=HeadUnknownKey,
                            unknown="unknown kid {kid}: no trusted issuer key signed this head",
                            empty_is_missing=True)
    claims = verified_payload(token, key, _HEAD_REGISTRY, "logbook head", HeadSignatureInvalid)
    if set(claims) != _HEAD_CLAIMS:
        raise HeadInvalid("a logbook head's claims must be exactly seq, hash and at")
    try:
        return check_head(claims)
    except InvalidInput as exc:
        raise HeadInvalid(exc.message) from exc
