"""Preview and query tokens (DESIGN §10): the short-lived asks of a trusted issuer.

A *preview token* asks a Pilot to run a change in a transaction that is always
rolled back and say what it would do; a *query token* asks for the evidence a
Pilot holds about one marque. Both are signed like marques (EdDSA only, a
trusted ``kid``), live at most five minutes, and are used once: their ``jti``
is recorded in the ledger, so a replayed one is refused. Neither can claim,
stamp or spend anything.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from marque.change import Change, is_json_int
from marque.cid import MAX_SAFE_INT
from marque.effects.request import EffectPreviewRequest
from marque.errors import (
    InvalidInput,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    PopReplayed,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.timefmt import iso_time, seconds
from marque.token.claims import int_claim, nonempty_str, object_claim
from marque.token.header import pin_header, trusted_signer
from marque.token.jose import ALG, read_header, sign, verified_payload
from marque.token.keys import TrustedKeys, import_private, kid_of
from marque.token.marques import MARQUE_REGISTRY
from marque.token.proofs import MAX_POP_JTI_LENGTH, REPLAY_MARGIN_SECONDS

__all__ = [
    "PREVIEW_TYP",
    "QUERY_TYP",
    "PreviewGrant",
    "PreviewToken",
    "QueryToken",
    "issue_preview_token",
    "issue_query_token",
    "verify_preview_token",
    "verify_query_token",
]

#: ``typ`` header of a preview token.
PREVIEW_TYP = "marque-preview+jwt"
#: ``typ`` header of a query token.
QUERY_TYP = "marque-query+jwt"
#: The longest a preview or query token may live (``exp - iat``).
MAX_SHORT_TOKEN_SECONDS = 300
#: Most sample rows a preview token may ask for per statement.
MAX_SAMPLE_ROWS = 1000

_PREVIEW_CLAIMS = frozenset(
    {"iss", "jti", "iat", "exp", "pilot", "target", "change", "sample_rows", "max_rows"}
)
_QUERY_CLAIMS = frozenset({"iss", "jti", "iat", "exp", "pilot", "marque_id"})


@dataclass(frozen=True, kw_only=True)
class PreviewGrant:
    """What a preview token asks of a Pilot: which ledger and target, what change, how many
    sample rows per statement and the row bound the preview is measured against.

    The one list of a preview's fields: the issuer signs it
    (:func:`issue_preview_token`), a Pilot reads it back as a :class:`PreviewToken`.
    """

    pilot_id: str
    incarnation: str
    target: str
    #: Statements to run and roll back, or an Effect Set to preview.
    change: Change | EffectPreviewRequest
    sample_rows: int = 10
    #: The change's budget bound (None: unbounded); the preview says if it stays within.
    max_rows: int | None = None

    def to_claims(self) -> dict[str, Any]:
        """The token's claims for this grant (the issuer's and the window's aside)."""
        return {"pilot": {"id": self.pilot_id, "incarnation": self.incarnation},
                "target": self.target, "change": self.change.to_claim(),
                "sample_rows": self.sample_rows, "max_rows": self.max_rows}


@dataclass(frozen=True, kw_only=True)
class PreviewToken(PreviewGrant):
    """A verified preview token: the grant it carries, who signed it, and its window."""

    jti: str
    issuer: str
    issued_at: int
    expires_at: int


@dataclass(frozen=True)
class QueryToken:
    """A verified query token: who may read the evidence of which marque."""

    jti: str
    issuer: str
    issued_at: int
    expires_at: int
    pilot_id: str
    marque_id: str


def _issue_short(
    issuer_key: dict[str, Any], typ: str, claims: dict[str, Any], ttl_seconds: int,
    now: float | None, jti: str | None,
) -> str:
    key = import_private(issuer_key, "issuer key")
    kid = kid_of(issuer_key, "issuer key")
    if not is_json_int(ttl_seconds) or not 0 < ttl_seconds <= MAX_SHORT_TOKEN_SECONDS:
        raise InvalidInput(f"ttl_seconds must be 1..{MAX_SHORT_TOKEN_SECONDS}")
    moment = math.floor(time.time() if now is None else now)
    token_jti = secrets.token_urlsafe(24) if jti is None else jti
    nonempty_str(token_jti, "jti", InvalidInput)
    if len(token_jti) > MAX_POP_JTI_LENGTH:
        raise InvalidInput(f"jti is longer than {MAX_POP_JTI_LENGTH} characters")
    full = {"jti": token_jti, "iat": moment, "exp": moment + ttl_seconds, **claims}
    return sign({"alg": ALG, "typ": typ, "kid": kid}, full, key, MARQUE_REGISTRY)


def issue_preview_token(
    issuer_key: dict[str, Any],
    grant: PreviewGrant,
    *,
    ttl_seconds: int = MAX_SHORT_TOKEN_SECONDS,
    issuer: str = "marque-local",
    now: float | None = None,
    jti: str | None = None,
) -> str:
    """Sign a preview token (``typ`` marque-preview+jwt) asking a Pilot to preview the
    grant's change (statements, or an Effect Set's
    :class:`~marque.effects.request.EffectPreviewRequest`)."""
    if not isinstance(grant, PreviewGrant):
        raise InvalidInput("grant must be a PreviewGrant")
    for name, value in (("pilot_id", grant.pilot_id), ("incarnation", grant.incarnation),
                        ("target", grant.target), ("issuer", issuer)):
        nonempty_str(value, name, InvalidInput)
    if not isinstance(grant.change, Change | EffectPreviewRequest):
        raise InvalidInput("change must be a Change or an EffectPreviewRequest")
    sample_rows, max_rows = grant.sample_rows, grant.max_rows
    if not is_json_int(sample_rows) or not 0 <= sample_rows <= MAX_SAMPLE_ROWS:
        raise InvalidInput(f"sample_rows must be 0..{MAX_SAMPLE_ROWS}")
    if max_rows is not None and (not is_json_int(max_rows) or max_rows < 0):
        raise InvalidInput("max_rows must be a non-negative integer or None")
    claims = {"iss": issuer, **grant.to_claims()}
    return _issue_short(issuer_key, PREVIEW_TYP, claims, ttl_seconds, now, jti)


def issue_query_token(
    issuer_key: dict[str, Any],
    *,
    pilot_id: str,
    marque_id: str,
    ttl_seconds: int = MAX_SHORT_TOKEN_SECONDS,
    issuer: str = "marque-local",
    now: float | None = None,
    jti: str | None = None,
) -> str:
    """Sign a query token (``typ`` marque-query+jwt) for the evidence of one marque."""
    for name, value in (("pilot_id", pilot_id), ("marque_id", marque_id), ("issuer", issuer)):
        nonempty_str(value, name, InvalidInput)
    claims = {"iss": issuer, "pilot": {"id": pilot_id}, "marque_id": marque_id}
    return _issue_short(issuer_key, QUERY_TYP, claims, ttl_seconds, now, jti)


def _read_short(
    token: Any, trusted: TrustedKeys, typ: str, what: str, required: frozenset[str]
) -> dict[str, Any]:
    """Header, trusted kid, signature and claim shape of a preview or query token."""
    if isinstance(token, str):
        token = token.strip()
    header = read_header(token, MARQUE_REGISTRY, what, MarqueInvalid)
    pin_header(header, typ=typ, what=what, error=MarqueInvalid,
               offered=lambda got: f", got {str(got)[:64]!r}")
    _, key = trusted_signer(header, trusted, what=what, error=MarqueInvalid,
                            unknown=f"{what}: unknown kid {{kid}}: no trusted issuer key has it")
    claims = verified_payload(token, key, MARQUE_REGISTRY, what, MarqueInvalid)
    missing = sorted(required - claims.keys())
    if missing:
        raise MarqueInvalid(f"{what} lacks claim(s) {', '.join(missing)}")
    nonempty_str(claims["iss"], f"{what} claim iss", MarqueInvalid)
    jti = nonempty_str(claims["jti"], f"{what} claim jti", MarqueInvalid)
    if len(jti) > MAX_POP_JTI_LENGTH:
        raise MarqueInvalid(f"{what} jti is longer than {MAX_POP_JTI_LENGTH} characters")
    iat = int_claim(claims["iat"], f"{what} claim iat", MarqueInvalid)
    exp = int_claim(claims["exp"], f"{what} claim exp", MarqueInvalid)
    if not iat < exp <= iat + MAX_SHORT_TOKEN_SECONDS:
        raise MarqueInvalid(f"{what} exp must be after iat and at most "
                            f"{MAX_SHORT_TOKEN_SECONDS} s after it")
    return claims


def _check_short(
    what: str, jti: str, iat: int, exp: int, *, now: float | None, skew_seconds: float,
    remember_jti: Callable[[str, float], bool] | None,
) -> None:
    """The window, then (last, so a refused token never burns it) the jti."""
    moment = time.time() if now is None else now
    if moment > exp + skew_seconds:
        raise MarqueExpired(
            f"{what} {jti[:64]} expired at {iso_time(exp)}; this Pilot allows "
            f"{seconds(skew_seconds)} of clock skew and its clock reads {iso_time(moment)}: "
            "ask the issuer for a new one",
            detail={"expires_at": exp, "skew_seconds": skew_seconds, "now": moment})
    if moment < iat - skew_seconds:
        raise MarqueNotYetValid(
            f"{what} {jti[:64]} was issued at {iso_time(iat)}, in the future of this Pilot's "
            f"clock ({iso_time(moment)}, {seconds(skew_seconds)} of skew allowed): check the "
            "issuer's and this host's clocks",
            detail={"issued_at": iat, "skew_seconds": skew_seconds, "now": moment})
    if remember_jti is not None and not remember_jti(
        f"{what}:{jti}", exp + skew_seconds + REPLAY_MARGIN_SECONDS
    ):
        raise PopReplayed(f"this {what} (jti {jti[:64]}) has been used before; "
                          "ask the issuer for a new one")


def verify_preview_token(
    token: str,
    trusted: TrustedKeys,
    *,
    pilot_id: str,
    incarnation: str,
    targets: Collection[str],
    remember_jti: Callable[[str, float], bool] | None,
    now: float | None = None,
    skew_seconds: float = 60,
) -> PreviewToken:
    """Decide whether this Pilot may run the preview ``token`` asks for, and return it read.

    Refusals as for a marque (:class:`MarqueInvalid`, :class:`MarqueExpired`,
    :class:`MarqueNotYetValid`, :class:`WrongPilot`, :class:`WrongIncarnation`,
    :class:`UnknownTarget`), then :class:`PopReplayed` when ``remember_jti``
    (called last) says the ``jti`` was seen.
    """
    what = "preview token"
    claims = _read_short(token, trusted, PREVIEW_TYP, what, _PREVIEW_CLAIMS)
    pilot = object_claim(claims["pilot"], "pilot", ("id", "incarnation"))
    target = nonempty_str(claims["target"], f"{what} claim target", MarqueInvalid)
    raw_change = claims["change"]
    change: Change | EffectPreviewRequest = (
        EffectPreviewRequest.from_claim(raw_change)
        if isinstance(raw_change, dict) and "effect_set" in raw_change
        else Change.from_claim(raw_change))
    sample_rows = claims["sample_rows"]
    if not is_json_int(sample_rows) or not 0 <= sample_rows <= MAX_SAMPLE_ROWS:
        raise MarqueInvalid(f"{what} claim sample_rows must be 0..{MAX_SAMPLE_ROWS}")
    max_rows = claims["max_rows"]
    if max_rows is not None and (not is_json_int(max_rows) or not 0 <= max_rows <= MAX_SAFE_INT):
        raise MarqueInvalid(f"{what} claim max_rows must be a non-negative integer or null")
    read = PreviewToken(
        jti=claims["jti"], issuer=claims["iss"], issued_at=claims["iat"],
        expires_at=claims["exp"], pilot_id=pilot["id"], incarnation=pilot["incarnation"],
        target=target, change=change, sample_rows=int(sample_rows),
        max_rows=None if max_rows is None else int(max_rows),
    )
    _check_short(what, read.jti, read.issued_at, read.expires_at, now=now,
                 skew_seconds=skew_seconds, remember_jti=None)
    if read.pilot_id != pilot_id:
        raise WrongPilot(f"{what} is for Pilot {read.pilot_id}; this is Pilot {pilot_id}")
    if read.incarnation != incarnation:
        raise WrongIncarnation(f"{what} is for ledger incarnation {read.incarnation}; this "
                               f"ledger is {incarnation}: ask for a preview on this ledger")
    if read.target not in targets:
        raise UnknownTarget(f"{what} names target {read.target}, which this Pilot does not "
                            "serve (see `marque pilot target list`)")
    _check_short(what, read.jti, read.issued_at, read.expires_at, now=now,
                 skew_seconds=skew_seconds, remember_jti=remember_jti)
    return read


def verify_query_token(
    token: str,
    trusted: TrustedKeys,
    *,
    pilot_id: str,
    remember_jti: Callable[[str, float], bool] | None,
    now: float | None = None,
    skew_seconds: float = 60,
) -> QueryToken:
    """Decide whether ``token`` lets its bearer read this Pilot's evidence of one marque."""
    what = "query token"
    claims = _read_short(token, trusted, QUERY_TYP, what, _QUERY_CLAIMS)
    pilot = object_claim(claims["pilot"], "pilot", ("id",))
    marque_id = nonempty_str(claims["marque_id"], f"{what} claim marque_id", MarqueInvalid)
    read = QueryToken(jti=claims["jti"], issuer=claims["iss"], issued_at=claims["iat"],
                      expires_at=claims["exp"], pilot_id=pilot["id"], marque_id=marque_id)
    _check_short(what, read.jti, read.issued_at, read.expires_at, now=now,
                 skew_seconds=skew_seconds, remember_jti=None)
    if read.pilot_id != pilot_id:
        raise WrongPilot(f"{what} is for Pilot {read.pilot_id}; this is Pilot {pilot_id}")
    _check_short(what, read.jti, read.issued_at, read.expires_at, now=now,
                 skew_seconds=skew_seconds, remember_jti=remember_jti)
    return read
