"""Marques and their proofs of possession: issuing them and deciding whether to honour them.

A marque (DESIGN §2) is the only thing that lets a Pilot touch a target
database, so this module is where a forged, stale, misdirected or stolen one
must be stopped. It turns the approved work (:class:`Change`, :class:`Budget`,
defined in :mod:`marque.change` and re-exported here) into a signed compact
JWS, and turns a received token back into a :class:`Marque` only after every
rule of DESIGN §2 and RFC 8725 has held:

* only ``EdDSA`` over Ed25519 is accepted — an allow-list, never the token's own
  ``alg`` — and ``typ`` must say what the token is (``marque+jwt``);
* the verifying key is found by ``kid`` in :class:`TrustedKeys` and nowhere
  else: ``jku``, ``x5u``, ``x5c`` and an embedded ``jwk`` never confer trust;
* the claims are checked for shape before any of them is believed, and the
  change must hash to the ``change_cid`` it claims (the CID approval signed);
* the validity window, Pilot identity, ledger incarnation and target are then
  checked, each refusal with its own stable code.

Each execution request also carries an RFC 9449-style proof of possession
signed by the holder key the marque is bound to (``cnf.jkt``); :func:`verify_proof`
checks it and consults the caller's replay cache last, so a refused proof never
burns a ``jti``.

Signatures are made and checked by joserfc; this module only decides *which*
key and algorithm to allow and what the claims must say. Every refusal is a
:mod:`marque.errors` class; foreign exceptions never cross this boundary.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwa import EdDSAAlgorithm
from joserfc.jwk import OKPKey
from joserfc.jwk import import_key as _import_jwk

from marque.change import (
    GUARD_WHEN,
    ISOLATION_LEVELS,
    AnyChange,
    Budget,
    Change,
    EffectSetChange,
    Guard,
    Statement,
    change_from_claim,
    is_json_int,
)
from marque.cid import MAX_SAFE_INT, canonicalize
from marque.errors import (
    InvalidInput,
    MarqueError,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    PopInvalid,
    PopKeyMismatch,
    PopMissing,
    PopReplayed,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.timefmt import iso_time, seconds

__all__ = [
    "ALG",
    "MARQUE_TYP",
    "POP_TYP",
    "ISOLATION_LEVELS",
    "GUARD_WHEN",
    "Budget",
    "Statement",
    "Guard",
    "Change",
    "Marque",
    "TrustedKeys",
    "new_key",
    "public_jwk",
    "thumbprint",
    "issue_marque",
    "verify_marque",
    "make_proof",
    "verify_proof",
]

#: The one signature algorithm Marque signs with and accepts.
ALG = "EdDSA"
#: ``typ`` header of a marque.
MARQUE_TYP = "marque+jwt"
#: ``typ`` header of a proof of possession.
POP_TYP = "marque-pop+jwt"

_CURVE: Final = "Ed25519"
#: Largest accepted proof ``jti``: it is stored in the Pilot's replay cache.
_MAX_POP_JTI_LENGTH = 256
#: A proof's ``jti`` is remembered this long beyond the last moment it could be accepted.
_REPLAY_MARGIN_SECONDS = 60.0
#: Largest marque payload segment (base64url characters). Changes can carry long SQL.
_MAX_MARQUE_PAYLOAD = 1_000_000

_MARQUE_CLAIMS = frozenset(
    {"iss", "sub", "jti", "iat", "nbf", "exp", "pilot", "target", "cnf", "budget", "change"}
)
# Headers joserfc would act on (RFC 7797 unencoded payloads, critical extensions): never ours.
_FORBIDDEN_HEADERS = ("crit", "b64")
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


# -- joserfc wiring ---------------------------------------------------------------


class _EdDSA(EdDSAAlgorithm):
    """joserfc's RFC 8037 EdDSA, without its per-call RFC 9864 deprecation warning.

    DESIGN §2 fixes ``alg: "EdDSA"`` on the wire; RFC 9864 only prefers the
    fully specified name ``Ed25519`` for the same signature. The curve is pinned
    separately: every key this module verifies with is checked to be Ed25519.
    """

    security_warning = None  # type: ignore[assignment]  # joserfc only tests truthiness


class _Registry(jws.JWSRegistry):
    """A JWS registry that knows exactly one algorithm, so nothing else can be negotiated."""

    algorithms = {ALG: _EdDSA()}
    recommended: list[str] = []


_MARQUE_REGISTRY = _Registry(algorithms=[ALG])
_MARQUE_REGISTRY.max_payload_length = _MAX_MARQUE_PAYLOAD
_POP_REGISTRY = _Registry(algorithms=[ALG])


# -- the verified marque ----------------------------------------------------------------


def _token_hash(token: str) -> str:
    digest = hashlib.sha256(token.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Marque:
    """A marque whose signature, claims, window, Pilot and target have all been checked."""

    token: str = field(repr=False)
    marque_id: str
    issuer: str
    subject: str
    issued_at: int
    not_before: int
    expires_at: int
    pilot_id: str
    incarnation: str
    target: str
    jkt: str
    budget: Budget
    change: AnyChange
    kid: str

    @functools.cached_property
    def token_hash(self) -> str:
        """base64url(SHA-256(token)) without padding: the ``ath`` a proof must carry.

        Computed once per marque (a Pilot caches its marques), not on every proof."""
        return _token_hash(self.token)

    def claims(self) -> dict[str, Any]:
        """The marque's claims as a JSON object (DESIGN §2 names)."""
        return {
            "iss": self.issuer,
            "sub": self.subject,
            "jti": self.marque_id,
            "iat": self.issued_at,
            "nbf": self.not_before,
            "exp": self.expires_at,
            "pilot": {"id": self.pilot_id, "incarnation": self.incarnation},
            "target": self.target,
            "cnf": {"jkt": self.jkt},
            "budget": self.budget.to_claim(),
            "change": self.change.to_claim(),
        }


# -- keys -------------------------------------------------------------------------------


def _ed25519_public(jwk: Any, error: type[MarqueError], what: str) -> dict[str, Any]:
    """The ``{kty, crv, x}`` of an Ed25519 JWK, checked; ``error`` otherwise."""
    if not isinstance(jwk, dict):
        raise error(f"{what} must be a JWK object")
    if jwk.get("kty") != "OKP" or jwk.get("crv") != _CURVE:
        raise error(f"{what} must be an Ed25519 key (kty OKP, crv Ed25519)")
    x = jwk.get("x")
    if not isinstance(x, str) or not x:
        raise error(f"{what} has no public key member x")
    return {"kty": "OKP", "crv": _CURVE, "x": x}


def _import_public(jwk: Any, error: type[MarqueError], what: str) -> OKPKey:
    members = _ed25519_public(jwk, error, what)
    try:
        return _public_key(members["x"])
    except (JoseError, ValueError, TypeError, binascii.Error) as exc:
        raise error(f"{what} is not a usable Ed25519 public key") from exc


@functools.lru_cache(maxsize=1024)
def _public_key(x: str) -> OKPKey:
    # A holder proves with the same key on every call: import it once. Failures
    # raise, so they are never cached.
    return OKPKey.import_key({"kty": "OKP", "crv": _CURVE, "x": x})


@functools.lru_cache(maxsize=1024)
def _thumbprint_of(x: str) -> str:
    return _public_key(x).thumbprint()


def _import_private(jwk: Any, what: str) -> OKPKey:
    members = _ed25519_public(jwk, InvalidInput, what)
    d = jwk.get("d")
    if not isinstance(d, str) or not d:
        raise InvalidInput(f"{what} is not a private key (no d)")
    try:
        private: dict[str, Any] = {**members, "d": d}
        key = OKPKey.import_key(private)
        # Derived from d itself: the dict form would just echo the x we were given.
        derived = OKPKey.import_key(key.public_key).as_dict(private=False)
    except (JoseError, ValueError, TypeError, binascii.Error) as exc:
        raise InvalidInput(f"{what} is not a usable Ed25519 private key") from exc
    if derived.get("x") != members["x"]:
        raise InvalidInput(f"{what}: x is not the public half of d")
    return key


def _kid_of(jwk: dict[str, Any], what: str) -> str:
    kid = jwk.get("kid")
    if kid is None:
        return thumbprint(jwk)
    if not isinstance(kid, str) or not kid:
        raise InvalidInput(f"{what}: kid must be a non-empty string")
    return kid


def new_key() -> dict[str, Any]:
    """A fresh Ed25519 private JWK, with ``kid`` (its RFC 7638 thumbprint) and ``alg``."""
    key = OKPKey.generate_key(_CURVE, private=True)
    jwk: dict[str, Any] = dict(key.as_dict(private=True))
    jwk["kid"] = key.thumbprint()
    jwk["alg"] = ALG
    return jwk


def public_jwk(jwk: dict[str, Any]) -> dict[str, Any]:
    """The public members of an Ed25519 JWK (``kty, crv, x``, and ``kid``/``alg`` if present).

    Never includes ``d``. Raises :class:`InvalidInput` for anything but an Ed25519 key.
    """
    public: dict[str, Any] = dict(_ed25519_public(jwk, InvalidInput, "key"))
    for member in ("kid", "alg"):
        if member in jwk:
            public[member] = jwk[member]
    return public


def thumbprint(jwk: dict[str, Any]) -> str:
    """The RFC 7638 SHA-256 thumbprint of a JWK (base64url, no padding), via joserfc.

    Only the key's required public members count, so a private JWK and its
    public half have the same thumbprint. Raises :class:`InvalidInput` if the
    JWK cannot be read.
    """
    if not isinstance(jwk, dict):
        raise InvalidInput("a JWK must be a JSON object")
    try:
        return _import_jwk(jwk).thumbprint()
    except (JoseError, ValueError, TypeError, KeyError, binascii.Error) as exc:
        raise InvalidInput(f"cannot compute the thumbprint of this JWK: {exc}") from exc


class TrustedKeys:
    """Issuer public keys a Pilot trusts, looked up by kid only."""

    def __init__(self, jwks: Iterable[dict[str, Any]] = ()) -> None:
        self._keys: dict[str, OKPKey] = {}
        self._jwks: dict[str, dict[str, Any]] = {}
        for jwk in jwks:
            self.add(jwk)

    def add(self, jwk: dict[str, Any]) -> str:
        """Trust the public part of an Ed25519 key and return its ``kid``.

        The ``kid`` is the JWK's own, or its RFC 7638 thumbprint if it has none.
        A private JWK is accepted but only its public part is kept. Raises
        :class:`InvalidInput` for non-Ed25519 keys, an ``alg`` other than
        ``EdDSA``, or a ``kid`` already trusted for a different key.
        """
        key = _import_public(jwk, InvalidInput, "trusted key")
        alg = jwk.get("alg")
        if alg is not None and alg != ALG:
            raise InvalidInput(f"trusted key alg must be {ALG}, got {alg!r}")
        kid = _kid_of(jwk, "trusted key")
        public = public_jwk(jwk)
        public["kid"] = kid
        known = self._keys.get(kid)
        if known is not None and known.thumbprint() != key.thumbprint():
            raise InvalidInput(f"kid {kid!r} is already trusted for a different key")
        self._keys[kid] = key
        self._jwks[kid] = public
        return kid

    def get(self, kid: str) -> OKPKey | None:
        """The trusted key with this ``kid``, or ``None``."""
        if not isinstance(kid, str):
            return None
        return self._keys.get(kid)

    def to_jwks(self) -> dict[str, Any]:
        """The trusted keys as a JWKS: ``{"keys": [public JWKs]}``."""
        return {"keys": [dict(jwk) for jwk in self._jwks.values()]}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, kid: object) -> bool:
        return isinstance(kid, str) and kid in self._keys


# -- wire helpers -------------------------------------------------------------------------


def _b64url_decode(segment: str) -> bytes:
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


def _read_header(
    token: Any, registry: jws.JWSRegistry, what: str, error: type[MarqueError]
) -> dict[str, Any]:
    """Parse a compact JWS's protected header without trusting anything in it."""
    return _decode_header(_compact_header(token, registry, what, error), what, error)


def _compact_header(
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


def _decode_header(segment: str, what: str, error: type[MarqueError]) -> dict[str, Any]:
    try:
        raw = _b64url_decode(segment)
    except (ValueError, binascii.Error) as exc:
        raise error(f"{what} header is not base64url") from exc
    header = _json_object(raw, f"{what} header", error)
    for name in _FORBIDDEN_HEADERS:
        if name in header:
            raise error(f"{what} header {name!r} is not supported")
    return header


@functools.lru_cache(maxsize=1024)
def _proof_holder(segment: str) -> tuple[OKPKey, str]:
    """The holder key a proof's header segment carries, and its thumbprint.

    A holder signs every proof with the same header, so it is read once per
    distinct header text; a header that fails a check raises, and is never cached.
    """
    header = _decode_header(segment, "proof", PopInvalid)
    if header.get("typ") != POP_TYP:
        raise PopInvalid(f"proof typ must be {POP_TYP}")
    if header.get("alg") != ALG:
        raise PopInvalid(f"proof alg must be {ALG}")
    jwk = header.get("jwk")
    if not isinstance(jwk, dict):
        raise PopInvalid("proof header carries no jwk")
    if "d" in jwk:
        raise PopInvalid("proof jwk contains a private key")
    key = _import_public(jwk, PopInvalid, "proof jwk")
    return key, _thumbprint_of(jwk["x"])


def _verified_payload(
    token: str, key: OKPKey, registry: jws.JWSRegistry, what: str, error: type[MarqueError]
) -> dict[str, Any]:
    try:
        obj = jws.deserialize_compact(token, key, registry=registry)
    except (JoseError, ValueError, TypeError, binascii.Error) as exc:
        raise error(f"{what} signature is not valid") from exc
    return _json_object(obj.payload, f"{what} payload", error)


def _sign(
    header: dict[str, Any], claims: dict[str, Any], key: OKPKey, registry: jws.JWSRegistry
) -> str:
    payload = json.dumps(claims, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    try:
        return jws.serialize_compact(header, payload.encode("ascii"), key, registry=registry)
    except (JoseError, ValueError, TypeError) as exc:
        raise InvalidInput(f"cannot sign: {exc}") from exc


def _nonempty_str(value: Any, name: str, error: type[MarqueError]) -> str:
    if not isinstance(value, str) or not value:
        raise error(f"{name} must be a non-empty string")
    return value


def _int_claim(value: Any, name: str, error: type[MarqueError]) -> int:
    if not is_json_int(value):
        raise error(f"{name} must be an integer number of seconds")
    if abs(value) > MAX_SAFE_INT:
        raise error(f"{name} is out of range")
    return int(value)


def _object_claim(value: Any, name: str, members: Iterable[str]) -> dict[str, str]:
    if not isinstance(value, dict):
        raise MarqueInvalid(f"claim {name} must be a JSON object")
    return {m: _nonempty_str(value.get(m), f"claim {name}.{m}", MarqueInvalid) for m in members}


def _new_marque_id() -> str:
    return "mq_" + base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


# -- marques ----------------------------------------------------------------------------


def unverified_claims(token: str) -> dict[str, Any] | None:
    """The claims of a compact JWS *without verifying it*, or None if it has none.

    Only for labelling (the marque id of a refusal, the id and expiry ``issue``
    prints); nothing read here is ever trusted.
    """
    try:
        payload = _b64url_decode(token.strip().split(".")[1])
        claims = json.loads(payload)
    except (IndexError, ValueError, RecursionError):
        # RecursionError: a payload nested deeper than the parser goes. Found by the
        # reliability campaign (row 13): it escaped as a 500 from POST /v1/executions.
        return None
    return claims if isinstance(claims, dict) else None



def issue_marque(
    issuer_key: dict[str, Any],
    *,
    pilot_id: str,
    incarnation: str,
    target: str,
    holder_jwk: dict[str, Any],
    change: AnyChange,
    budget: Budget,
    ttl_seconds: int,
    subject: str = "local",
    issuer: str = "marque-local",
    now: float | None = None,
    not_before: float | None = None,
    marque_id: str | None = None,
    request_scope: str | None = None,
    approval: dict[str, Any] | None = None,
) -> str:
    """Sign a marque for ``change`` and return it as a compact JWS.

    The marque is bound to one Pilot ledger (``pilot_id`` + ``incarnation``),
    one ``target``, and the holder key whose thumbprint becomes ``cnf.jkt``.
    It is valid from ``not_before`` (default: now) until now + ``ttl_seconds``.
    A Harbourmaster also names the logical request (``request_scope``, claim
    ``req``) and what permitted it (``approval``, DESIGN §11.4); a local
    ``marque issue`` has neither, and the claims are then absent. Raises
    :class:`InvalidInput` for a bad key or argument.
    """
    key = _import_private(issuer_key, "issuer key")
    kid = _kid_of(issuer_key, "issuer key")
    holder = _import_public(holder_jwk, InvalidInput, "holder key")
    for name, value in (
        ("pilot_id", pilot_id),
        ("incarnation", incarnation),
        ("target", target),
        ("subject", subject),
        ("issuer", issuer),
    ):
        _nonempty_str(value, name, InvalidInput)
    if not isinstance(change, Change | EffectSetChange):
        raise InvalidInput("change must be a Change or an EffectSetChange")
    if not isinstance(budget, Budget):
        raise InvalidInput("budget must be a Budget")
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidInput("ttl_seconds must be a number of seconds")
    if not ttl_seconds > 0:
        raise InvalidInput("ttl_seconds must be greater than zero")
    moment = time.time() if now is None else now
    issued_at = math.floor(moment)
    starts = issued_at if not_before is None else math.floor(not_before)
    expires = math.floor(moment + ttl_seconds)
    if expires <= starts:
        raise InvalidInput("the marque would expire before it becomes valid")
    jti = _new_marque_id() if marque_id is None else marque_id
    _nonempty_str(jti, "marque_id", InvalidInput)
    if request_scope is not None:
        _nonempty_str(request_scope, "request_scope", InvalidInput)
    if approval is not None:
        if not isinstance(approval, dict) or not approval:
            raise InvalidInput("approval must be a non-empty JSON object")
        canonicalize(approval)  # refuses anything that is not plain JSON, naming where

    header = {"alg": ALG, "typ": MARQUE_TYP, "kid": kid}
    claims: dict[str, Any] = {
        "iss": issuer,
        "sub": subject,
        "jti": jti,
        "iat": issued_at,
        "nbf": starts,
        "exp": expires,
        "pilot": {"id": pilot_id, "incarnation": incarnation},
        "target": target,
        "cnf": {"jkt": holder.thumbprint()},
        "budget": budget.to_claim(),
        "change": change.to_claim(),
    }
    if request_scope is not None:
        claims["req"] = request_scope
    if approval is not None:
        claims["approval"] = approval
    token = _sign(header, claims, key, _MARQUE_REGISTRY)
    header_segment, payload_segment, _ = token.split(".")
    if len(header_segment) > _MARQUE_REGISTRY.max_header_length:
        raise InvalidInput("the issuer key's kid is too long for a marque header")
    if len(payload_segment) > _MARQUE_REGISTRY.max_payload_length:
        raise InvalidInput("the change is too large to fit in a marque")
    return token


def verify_marque(
    token: str,
    trusted: TrustedKeys,
    *,
    pilot_id: str,
    incarnation: str,
    targets: Collection[str],
    now: float | None = None,
    skew_seconds: float = 60,
) -> Marque:
    """Decide whether this Pilot may honour ``token``, and return it read.

    Checks, in order: header (``alg`` EdDSA, ``typ`` marque+jwt, ``kid``
    trusted), signature, claims and change CID (all :class:`MarqueInvalid`);
    then the window (:class:`MarqueExpired`, :class:`MarqueNotYetValid`, with
    ``skew_seconds`` of tolerance); then :class:`WrongPilot`,
    :class:`WrongIncarnation` and :class:`UnknownTarget`.
    """
    marque = read_marque(token, trusted)
    check_marque(marque, pilot_id=pilot_id, incarnation=incarnation, targets=targets, now=now,
                 skew_seconds=skew_seconds)
    return marque


def read_marque(token: str, trusted: TrustedKeys) -> Marque:
    """Verify the signature and read the claims; the time-independent half of verification.

    Its result depends only on ``token`` and ``trusted``, so a Pilot may cache it
    by token; :func:`check_marque` must still run on every use. Whitespace around
    the token (a file's trailing newline) is not part of it.
    """
    if isinstance(token, str):
        token = token.strip()
    header = _read_header(token, _MARQUE_REGISTRY, "marque", MarqueInvalid)
    if header.get("alg") != ALG:
        raise MarqueInvalid(f"marque alg must be {ALG}")
    if header.get("typ") != MARQUE_TYP:
        raise MarqueInvalid(f"marque typ must be {MARQUE_TYP}")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise MarqueInvalid("marque header has no kid")
    key = trusted.get(kid)
    if key is None:
        raise MarqueInvalid(f"unknown kid {kid[:64]!r}: no trusted issuer key has it")
    claims = _verified_payload(token, key, _MARQUE_REGISTRY, "marque", MarqueInvalid)

    missing = sorted(_MARQUE_CLAIMS - claims.keys())
    if missing:
        raise MarqueInvalid(f"marque lacks claim(s) {', '.join(missing)}")
    issuer = _nonempty_str(claims["iss"], "claim iss", MarqueInvalid)
    subject = _nonempty_str(claims["sub"], "claim sub", MarqueInvalid)
    marque_id = _nonempty_str(claims["jti"], "claim jti", MarqueInvalid)
    issued_at = _int_claim(claims["iat"], "claim iat", MarqueInvalid)
    not_before = _int_claim(claims["nbf"], "claim nbf", MarqueInvalid)
    expires_at = _int_claim(claims["exp"], "claim exp", MarqueInvalid)
    if expires_at <= not_before:
        raise MarqueInvalid("claim exp must be after nbf")
    pilot = _object_claim(claims["pilot"], "pilot", ("id", "incarnation"))
    target = _nonempty_str(claims["target"], "claim target", MarqueInvalid)
    jkt = _object_claim(claims["cnf"], "cnf", ("jkt",))["jkt"]
    budget = Budget.from_claim(claims["budget"])
    change = change_from_claim(claims["change"])

    return Marque(
        token=token,
        marque_id=marque_id,
        issuer=issuer,
        subject=subject,
        issued_at=issued_at,
        not_before=not_before,
        expires_at=expires_at,
        pilot_id=pilot["id"],
        incarnation=pilot["incarnation"],
        target=target,
        jkt=jkt,
        budget=budget,
        change=change,
        kid=kid,
    )


def check_marque(
    marque: Marque,
    *,
    pilot_id: str,
    incarnation: str,
    targets: Collection[str],
    now: float | None = None,
    skew_seconds: float = 60,
) -> Marque:
    """The per-use half of verification: the window, then the Pilot, incarnation and target."""
    moment = time.time() if now is None else now
    marque_id = marque.marque_id
    # The window is [nbf - skew, exp + skew]: the messages name both the bound and the
    # allowance, so a marque refused (or accepted) near its edge explains itself.
    if moment > marque.expires_at + skew_seconds:
        raise MarqueExpired(
            f"marque {marque_id} expired at {iso_time(marque.expires_at)}; this Pilot allows "
            f"{seconds(skew_seconds)} of clock skew past expiry (settings.skew_seconds) and its "
            f"clock reads {iso_time(moment)}: ask for a new marque",
            detail={"expires_at": marque.expires_at, "skew_seconds": skew_seconds,
                    "now": moment},
        )
    if moment < marque.not_before - skew_seconds:
        raise MarqueNotYetValid(
            f"marque {marque_id} is not valid before {iso_time(marque.not_before)}; this Pilot "
            f"allows {seconds(skew_seconds)} of clock skew (settings.skew_seconds) and its "
            f"clock reads {iso_time(moment)}: wait, or check the issuer's and this host's clocks",
            detail={"not_before": marque.not_before, "skew_seconds": skew_seconds,
                    "now": moment},
        )
    if marque.pilot_id != pilot_id:
        raise WrongPilot(f"marque {marque_id} is for Pilot {marque.pilot_id}; this is Pilot "
                         f"{pilot_id}")
    if marque.incarnation != incarnation:
        raise WrongIncarnation(
            f"marque {marque_id} is for ledger incarnation {marque.incarnation}; this "
            f"ledger is {incarnation} (a marque runs only on the ledger it names: ask for "
            "one for this ledger)"
        )
    if marque.target not in targets:
        raise UnknownTarget(f"this Pilot serves no target named {marque.target} "
                            "(see `marque pilot target list`)")
    return marque


# -- proofs of possession -------------------------------------------------------------


def make_proof(
    holder_key: dict[str, Any],
    marque_token: str,
    *,
    nonce: str,
    pilot_id: str,
    now: float | None = None,
    jti: str | None = None,
) -> str:
    """Sign a proof that the caller holds the key ``marque_token`` is bound to.

    The proof names the marque (``ath``), the execution ``nonce`` and the
    Pilot, and carries the holder's public key in its ``jwk`` header.
    Raises :class:`InvalidInput` for a bad key or argument.
    """
    key = _import_private(holder_key, "holder key")
    if isinstance(marque_token, str):
        marque_token = marque_token.strip()  # as read_marque does: ath covers the token alone
    if not isinstance(marque_token, str) or not marque_token.isascii() or not marque_token:
        raise InvalidInput("marque_token must be a compact JWS string")
    _nonempty_str(nonce, "nonce", InvalidInput)
    _nonempty_str(pilot_id, "pilot_id", InvalidInput)
    proof_jti = secrets.token_urlsafe(24) if jti is None else jti
    _nonempty_str(proof_jti, "jti", InvalidInput)
    if len(proof_jti) > _MAX_POP_JTI_LENGTH:
        raise InvalidInput(f"jti is longer than {_MAX_POP_JTI_LENGTH} characters")
    moment = time.time() if now is None else now
    header = {
        "typ": POP_TYP,
        "alg": ALG,
        "jwk": _ed25519_public(holder_key, InvalidInput, "holder key"),
    }
    claims = {
        "jti": proof_jti,
        "iat": math.floor(moment),
        "ath": _token_hash(marque_token),
        "nonce": nonce,
        "pilot": pilot_id,
    }
    return _sign(header, claims, key, _POP_REGISTRY)


def verify_proof(
    proof: str | None,
    marque: Marque,
    *,
    nonce: str,
    pilot_id: str,
    remember_jti: Callable[[str, float], bool] | None,
    now: float | None = None,
    window_seconds: float = 120,
) -> str:
    """Check a proof of possession for ``marque`` and this request; return its ``jti``.

    Refuses with :class:`PopMissing` (no proof), :class:`PopKeyMismatch` (signed
    by a key other than ``cnf.jkt``), :class:`PopInvalid` (malformed, bad
    signature, ``iat`` outside ``window_seconds``, or ``ath``/``nonce``/``pilot``
    not this request's) or :class:`PopReplayed`. ``remember_jti(jti,
    forget_after)`` is called last, only once everything else has held, and
    must return False if the ``jti`` was already seen. A caller passing None
    takes that duty on itself (a Pilot records the ``jti`` in its claim
    transaction; see :func:`jti_forget_after`).
    """
    if proof is None or proof == "":
        raise PopMissing("the request carries no proof of possession")
    segment = _compact_header(proof, _POP_REGISTRY, "proof", PopInvalid)
    key, thumbprint = _proof_holder(segment)
    if thumbprint != marque.jkt:
        raise PopKeyMismatch("the proof is signed by a key other than the one the marque names")
    claims = _verified_payload(proof, key, _POP_REGISTRY, "proof", PopInvalid)

    jti = _nonempty_str(claims.get("jti"), "proof jti", PopInvalid)
    if len(jti) > _MAX_POP_JTI_LENGTH:
        raise PopInvalid(f"proof jti is longer than {_MAX_POP_JTI_LENGTH} characters")
    issued_at = _int_claim(claims.get("iat"), "proof iat", PopInvalid)
    ath = _nonempty_str(claims.get("ath"), "proof ath", PopInvalid)
    proof_nonce = _nonempty_str(claims.get("nonce"), "proof nonce", PopInvalid)
    proof_pilot = _nonempty_str(claims.get("pilot"), "proof pilot", PopInvalid)

    moment = time.time() if now is None else now
    if abs(moment - issued_at) > window_seconds:
        raise PopInvalid("proof iat is outside the accepted window (stale or from the future)")
    if ath != marque.token_hash:
        raise PopInvalid("proof ath does not match this marque")
    if proof_nonce != nonce:
        raise PopInvalid("proof nonce does not match the request")
    if proof_pilot != pilot_id:
        raise PopInvalid("proof is for another pilot")
    if remember_jti is not None and not remember_jti(
        jti, issued_at + window_seconds + _REPLAY_MARGIN_SECONDS
    ):
        raise PopReplayed("this proof has been used before")
    return jti


def jti_forget_after(now: float, window_seconds: float) -> float:
    """A time after which an accepted proof's ``jti`` can be forgotten, whatever its ``iat``.

    An accepted ``iat`` is at most ``window_seconds`` ahead of ``now``, and the
    proof stays acceptable for ``window_seconds`` after its ``iat``.
    """
    return now + 2 * window_seconds + _REPLAY_MARGIN_SECONDS

