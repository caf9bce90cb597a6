"""Signed execution reports: a Pilot's own word for an outcome it delivers.

A Pilot's bearer token at the Harbourmaster says who is calling; it does not
say that the Pilot itself vouches for what is sent. So a joined Pilot signs
every report it delivers with its **report key** (an Ed25519 key kept in its
home, whose public half it registers), and the Harbourmaster writes an
outcome into its logbook only once the signature verifies under the key it
holds for the Pilot the marque was issued to. A stolen token alone then
writes nothing.

A report signature is a compact JWS, header ``{alg: EdDSA, typ:
marque-report+jwt, kid}`` (``kid`` the key's RFC 7638 thumbprint). Its claims
are exactly the report it travels with — ``marque_id, nonce, attempt, status,
rows_affected, error, pilot: {id, incarnation}, cause`` and, for an Effect Set
attempt, ``effect_set`` — plus ``iat``, when the Pilot signed it. The
verifier compares the claims (without ``iat``) with the report member by
member, so a signature cannot be lifted onto another report.

Refusals are :class:`~marque.errors.ReportSignatureInvalid`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from marque.errors import ReportSignatureInvalid
from marque.token.claims import int_claim
from marque.token.header import pin_header
from marque.token.jose import ALG, Registry, read_header, sign, verified_payload
from marque.token.keys import import_private, import_public, thumbprint

__all__ = ["REPORT_TYP", "sign_report", "verify_report"]

#: ``typ`` header of a signed execution report.
REPORT_TYP = "marque-report+jwt"

class _ReportRegistry(Registry):
    """An Effect Set attempt's report carries its set receipt and row states: room for them
    (a delivery's whole size is bounded by the service, not here)."""

    max_payload_length = 16 * 1024 * 1024


_REPORT_REGISTRY = _ReportRegistry(algorithms=[ALG])


def sign_report(report: dict[str, Any], key: dict[str, Any], *,
                now: float | None = None) -> str:
    """Sign ``report`` (an outbox payload, without ``signature``) with a private Ed25519 JWK.

    ``InvalidInput`` for an unusable key or a report holding ``iat`` or
    ``signature`` (members the signature itself adds or carries).
    """
    from marque.errors import InvalidInput

    if "signature" in report or "iat" in report:
        raise InvalidInput("a report to sign must not hold signature or iat")
    private = import_private(key, "report key")
    moment = time.time() if now is None else now
    claims = {**report, "iat": math.floor(moment)}
    header = {"alg": ALG, "typ": REPORT_TYP, "kid": thumbprint(key)}
    return sign(header, claims, private, _REPORT_REGISTRY)


def verify_report(signature: Any, report: dict[str, Any], public_key: dict[str, Any]) -> int:
    """Check that ``signature`` is ``public_key``'s signature of ``report``; returns its ``iat``.

    ``report`` is the report as delivered, without its ``signature`` member.
    :class:`ReportSignatureInvalid` for anything else: not a compact JWS, a
    ``typ`` or ``alg`` not a report's, a ``kid`` that is not this key's
    thumbprint, a signature that does not verify, or claims that are not
    exactly this report.
    """
    header = read_header(signature, _REPORT_REGISTRY, "report signature",
                         ReportSignatureInvalid)
    pin_header(header, typ=REPORT_TYP, what="report signature", error=ReportSignatureInvalid,
               typ_first=True, offered=lambda got: f", not {str(got)[:64]!r}")
    expected = thumbprint(public_key)
    if header.get("kid") != expected:
        raise ReportSignatureInvalid(
            "the report is signed by a key other than the one registered for its Pilot",
            detail={"kid": str(header.get("kid"))[:64], "registered": expected})
    key = import_public(public_key, ReportSignatureInvalid, "registered report key")
    claims = verified_payload(signature, key, _REPORT_REGISTRY, "report signature",
                              ReportSignatureInvalid)
    issued_at = int_claim(claims.pop("iat", None), "report signature iat",
                          ReportSignatureInvalid)
    if claims != report:
        differ = sorted(name for name in set(claims) | set(report)
                        if claims.get(name) != report.get(name))
        raise ReportSignatureInvalid(
            "the report signature's claims are not this report (they differ in "
            f"{', '.join(differ)})", detail={"differs": differ})
    return issued_at
