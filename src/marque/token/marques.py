"""Marques: issuing them, and deciding whether to honour one.

A marque (DESIGN §2) is the only thing that lets a Pilot touch a target
database, so this module is where a forged, stale or misdirected one must be
stopped. :func:`issue_marque` turns the approved work (:class:`Change`,
:class:`Budget`, from :mod:`marque.change`) into a signed compact JWS;
:func:`read_marque` turns a received token back into a :class:`Marque` only
after its header (:mod:`marque.token.header`), signature and claims have held,
and :func:`check_marque` then checks, on every use, the validity window, Pilot
identity, ledger incarnation and target, each refusal with its own stable code.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from joserfc.jwk import OKPKey

from marque.change import AnyChange, Budget, Change, EffectSetChange, change_from_claim
from marque.cid import canonicalize
from marque.errors import (
    InvalidInput,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.timefmt import iso_time, seconds
from marque.token.claims import int_claim, nonempty_str, object_claim
from marque.token.header import pin_header, trusted_signer
from marque.token.jose import ALG, Registry, b64url_decode, read_header, sign, verified_payload
from marque.token.keys import TrustedKeys, import_private, import_public, kid_of

__all__ = [
    "MARQUE_REGISTRY",
    "MARQUE_TYP",
    "Marque",
    "ath_of",
    "check_marque",
    "issue_marque",
    "read_marque",
    "unverified_claims",
    "verify_marque",
]

#: ``typ`` header of a marque.
MARQUE_TYP = "marque+jwt"
#: Largest marque payload segment (base64url characters). Changes can carry long SQL.
_MAX_MARQUE_PAYLOAD = 1_000_000

#: The registry marques are signed and read with (preview and query tokens share it).
MARQUE_REGISTRY = Registry(algorithms=[ALG])
MARQUE_REGISTRY.max_payload_length = _MAX_MARQUE_PAYLOAD

_MARQUE_CLAIMS = frozenset(
    {"iss", "sub", "jti", "iat", "nbf", "exp", "pilot", "target", "cnf", "budget", "change"}
)


def ath_of(token: str) -> str:
    """base64url(SHA-256(token)) without padding: what a proof's ``ath`` must be."""
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
        return ath_of(self.token)

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


def _new_marque_id() -> str:
    return "mq_" + base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


def unverified_claims(token: str) -> dict[str, Any] | None:
    """The claims of a compact JWS *without verifying it*, or None if it has none.

    Only for labelling (the marque id of a refusal, the id and expiry ``issue``
    prints); nothing read here is ever trusted.
    """
    try:
        payload = b64url_decode(token.strip().split(".")[1])
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
    key = import_private(issuer_key, "issuer key")
    kid = kid_of(issuer_key, "issuer key")
    holder = import_public(holder_jwk, InvalidInput, "holder key")
    _check_binding(pilot_id=pilot_id, incarnation=incarnation, target=target,
                   subject=subject, issuer=issuer, change=change, budget=budget)
    issued_at, starts, expires = _validity(ttl_seconds, now, not_before)
    jti = _new_marque_id() if marque_id is None else marque_id
    nonempty_str(jti, "marque_id", InvalidInput)
    _check_request_claims(request_scope, approval)
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
    return _signed_marque({"alg": ALG, "typ": MARQUE_TYP, "kid": kid}, claims, key)


def _check_binding(*, pilot_id: str, incarnation: str, target: str, subject: str,
                   issuer: str, change: AnyChange, budget: Budget) -> None:
    """Refuse (:class:`InvalidInput`) a marque bound to no Pilot, target or change."""
    for name, value in (
        ("pilot_id", pilot_id),
        ("incarnation", incarnation),
        ("target", target),
        ("subject", subject),
        ("issuer", issuer),
    ):
        nonempty_str(value, name, InvalidInput)
    if not isinstance(change, Change | EffectSetChange):
        raise InvalidInput("change must be a Change or an EffectSetChange")
    if not isinstance(budget, Budget):
        raise InvalidInput("budget must be a Budget")


def _validity(ttl_seconds: int, now: float | None, not_before: float | None
              ) -> tuple[int, int, int]:
    """The marque's ``iat``, ``nbf`` and ``exp`` (whole seconds), checked."""
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
    return issued_at, starts, expires


def _check_request_claims(request_scope: str | None, approval: dict[str, Any] | None) -> None:
    """Refuse an empty ``req`` claim, or an ``approval`` that is not plain, non-empty JSON."""
    if request_scope is not None:
        nonempty_str(request_scope, "request_scope", InvalidInput)
    if approval is not None:
        if not isinstance(approval, dict) or not approval:
            raise InvalidInput("approval must be a non-empty JSON object")
        canonicalize(approval)  # refuses anything that is not plain JSON, naming where


def _signed_marque(header: dict[str, Any], claims: dict[str, Any], key: OKPKey) -> str:
    """The compact JWS of ``claims``, refused when it is larger than a verifier accepts."""
    token = sign(header, claims, key, MARQUE_REGISTRY)
    header_segment, payload_segment, _ = token.split(".")
    if len(header_segment) > MARQUE_REGISTRY.max_header_length:
        raise InvalidInput("the issuer key's kid is too long for a marque header")
    if len(payload_segment) > MARQUE_REGISTRY.max_payload_length:
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
    header = read_header(token, MARQUE_REGISTRY, "marque", MarqueInvalid)
    pin_header(header, typ=MARQUE_TYP, what="marque", error=MarqueInvalid)
    kid, key = trusted_signer(header, trusted, what="marque", error=MarqueInvalid,
                              unknown="unknown kid {kid}: no trusted issuer key has it")
    claims = verified_payload(token, key, MARQUE_REGISTRY, "marque", MarqueInvalid)

    missing = sorted(_MARQUE_CLAIMS - claims.keys())
    if missing:
        raise MarqueInvalid(f"marque lacks claim(s) {', '.join(missing)}")
    issuer = nonempty_str(claims["iss"], "claim iss", MarqueInvalid)
    subject = nonempty_str(claims["sub"], "claim sub", MarqueInvalid)
    marque_id = nonempty_str(claims["jti"], "claim jti", MarqueInvalid)
    issued_at = int_claim(claims["iat"], "claim iat", MarqueInvalid)
    not_before = int_claim(claims["nbf"], "claim nbf", MarqueInvalid)
    expires_at = int_claim(claims["exp"], "claim exp", MarqueInvalid)
    if expires_at <= not_before:
        raise MarqueInvalid("claim exp must be after nbf")
    pilot = object_claim(claims["pilot"], "pilot", ("id", "incarnation"))
    target = nonempty_str(claims["target"], "claim target", MarqueInvalid)
    jkt = object_claim(claims["cnf"], "cnf", ("jkt",))["jkt"]
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
