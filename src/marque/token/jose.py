"""The JOSE plumbing every Marque token shares: the one algorithm, and reading a compact JWS.

Marques, proofs of possession, preview and query tokens and signed logbook
heads are all compact JWS signed with ``EdDSA`` over Ed25519. What they share
lives here: a joserfc registry that knows that one algorithm and nothing else,
the strict reading of a header or payload segment (base64url, then I-JSON with
duplicate members refused), and signing and verifying through joserfc. Which
key to use, and what a header and the claims must say, is each token's own
business (:mod:`marque.token.header`, :mod:`marque.token.claims`).

Every refusal is the caller's :mod:`marque.errors` class; foreign exceptions
never cross this boundary.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwa import EdDSAAlgorithm
from joserfc.jwk import OKPKey

from marque.errors import InvalidInput, MarqueError

__all__ = [
    "ALG",
    "Registry",
    "b64url_decode",
    "compact_header",
    "decode_header",
    "read_header",
    "sign",
    "verified_payload",
]

#: The one signature algorithm Marque signs with and accepts.
ALG = "EdDSA"

# Headers joserfc would act on (RFC 7797 unencoded payloads, critical extensions): never ours.
_FORBIDDEN_HEADERS = ("crit", "b64")
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


class _EdDSA(EdDSAAlgorithm):
    """joserfc's RFC 8037 EdDSA, without its per-call RFC 9864 deprecation warning.

    DESIGN §2 fixes ``alg: "EdDSA"`` on the wire; RFC 9864 only prefers the
    fully specified name ``Ed25519`` for the same signature. The curve is pinned
    separately: every key this package verifies with is checked to be Ed25519.
    """

    security_warning = None  # type: ignore[assignment]  # joserfc only tests truthiness


class Registry(jws.JWSRegistry):
    """A JWS registry that knows exactly one algorithm, so nothing else can be negotiated."""

    algorithms = {ALG: _EdDSA()}
    recommended: list[str] = []


def b64url_decode(segment: str) -> bytes:
    """The bytes of an unpadded base64url segment; ``ValueError`` for anything else."""
    if len(segment) % 4 == 1 or _B64URL.fullmatch(segment) is None:
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate member {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_object(raw: bytes, what: str, error: type[MarqueError]) -> dict[str, Any]:
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
        )
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON") from exc
    if not isinstance(value, dict):
        raise error(f"{what} must be a JSON object")
    if b"\\u" not in raw:
        # Strictly decoded UTF-8 holds no surrogate: only a \u escape can make one.
        return value
    try:
        # I-JSON (RFC 7493 §2.1): every string is Unicode text. An escaped unpaired
        # surrogate ("\ud800") parses in Python but is read differently elsewhere.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError) as exc:
        raise error(f"{what} holds a string that is not Unicode text (an unpaired "
                    "surrogate)") from exc
    return value


def read_header(
    token: Any, registry: jws.JWSRegistry, what: str, error: type[MarqueError]
) -> dict[str, Any]:
    """Parse a compact JWS's protected header without trusting anything in it."""
    return decode_header(compact_header(token, registry, what, error), what, error)


def compact_header(
    token: Any, registry: jws.JWSRegistry, what: str, error: type[MarqueError]
) -> str:
    """The header segment of a compact JWS, once its shape and lengths are checked."""
    if not isinstance(token, str):
        raise error(f"{what} must be a compact JWS string")
    limit = registry.max_header_length + registry.max_payload_length + 2 * 1024
    if len(token) > limit:
        raise error(f"{what} is longer than {limit} characters")
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        raise error(f"{what} is not a compact JWS (header.payload.signature)")
    if len(parts[0]) > registry.max_header_length:
        raise error(f"{what} header is too long")
    return parts[0]


def decode_header(segment: str, what: str, error: type[MarqueError]) -> dict[str, Any]:
    """A header segment read as a strict JSON object, refusing headers joserfc would act on."""
    try:
        raw = b64url_decode(segment)
    except (ValueError, binascii.Error) as exc:
        raise error(f"{what} header is not base64url") from exc
    header = _json_object(raw, f"{what} header", error)
    for name in _FORBIDDEN_HEADERS:
        if name in header:
            raise error(f"{what} header {name!r} is not supported")
    return header


def verified_payload(
    token: str, key: OKPKey, registry: jws.JWSRegistry, what: str, error: type[MarqueError]
) -> dict[str, Any]:
    """The payload of ``token`` as a strict JSON object, once joserfc has checked its
    signature under ``key``; ``error`` if the signature or the payload is bad."""
    try:
        obj = jws.deserialize_compact(token, key, registry=registry)
    except (JoseError, ValueError, TypeError, binascii.Error) as exc:
        raise error(f"{what} signature is not valid") from exc
    return _json_object(obj.payload, f"{what} payload", error)


def sign(
    header: dict[str, Any], claims: dict[str, Any], key: OKPKey, registry: jws.JWSRegistry
) -> str:
    """``claims`` signed under ``header`` with ``key``, as a compact JWS (ASCII JSON payload)."""
    payload = json.dumps(claims, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    try:
        return jws.serialize_compact(header, payload.encode("ascii"), key, registry=registry)
    except (JoseError, ValueError, TypeError) as exc:
        raise InvalidInput(f"cannot sign: {exc}") from exc
