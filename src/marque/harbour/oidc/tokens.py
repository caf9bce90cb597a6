"""Checking an ID token the provider issued (OpenID Connect Core §3.1.3.7).

The token is a compact JWS: its header's ``alg`` must be an asymmetric algorithm the
provider says it signs with (never ``none``, never an HMAC keyed by a client secret
someone else may hold), its ``kid`` a key the provider publishes; the signature is
checked by joserfc. Then the claims, each a separate, named refusal
(``detail["check"]``): ``iss`` is the configured issuer exactly; ``aud`` contains this
client id (and, with several audiences, ``azp`` is this client); ``exp`` is in the future
and ``iat`` not in it (``LEEWAY_SECONDS`` of clock skew either way); ``nonce`` is the one
this sign-in stored, compared in constant time, when one was sent. A token that passes
is the claims, and nothing else of it is trusted.
"""

from __future__ import annotations

import base64
import hmac
import json
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from marque.errors import OidcLoginRefused
from marque.harbour.oidc.provider import Provider

#: Algorithms an ID token may be signed with (asymmetric only).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA", "Ed25519")
LEEWAY_SECONDS = 60
_MAX_TOKEN = 16 * 1024


def refuse(check: str, message: str) -> OidcLoginRefused:
    """The refusal of one check."""
    return OidcLoginRefused(f"the identity provider's ID token was refused: {message}",
                            detail={"check": check})


def _header(token: str) -> dict[str, Any]:
    if not isinstance(token, str) or len(token) > _MAX_TOKEN or token.count(".") != 2:
        raise refuse("malformed", "it is not a compact JWS")
    part = token.split(".", 1)[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (ValueError, UnicodeDecodeError):
        raise refuse("malformed", "its header is not JSON") from None
    if not isinstance(header, dict):
        raise refuse("malformed", "its header is not a JSON object")
    return header


def verify_id_token(token: str, provider: Provider, *, client_id: str, now: float,
                    nonce: str | None) -> dict[str, Any]:
    """The claims of ``token`` once every check holds; ``OidcLoginRefused`` naming the first
    that does not."""
    claims = _signed_claims(token, provider)
    _check_claims(claims, provider.issuer, client_id, now, nonce)
    return claims


BACKCHANNEL_EVENT = "http://schemas.openid.net/event/backchannel-logout"


def verify_logout_token(token: str, provider: Provider, *, client_id: str,
                        now: float) -> dict[str, Any]:
    """A back-channel logout token's claims (OpenID Connect Back-Channel Logout §2.6): signed
    by the provider, for this client, recent, carrying the logout event and a ``sid`` or
    ``sub``, and no ``nonce`` (so an ID token cannot pass for one)."""
    claims = _signed_claims(token, provider)
    if claims.get("iss") != provider.issuer:
        raise refuse("issuer", "the logout token was issued by another issuer")
    aud = claims.get("aud")
    if client_id not in ([aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []):
        raise refuse("audience", "the logout token is not for this client")
    iat = claims.get("iat")
    if not isinstance(iat, int | float) or abs(now - iat) > 5 * LEEWAY_SECONDS:
        raise refuse("issued_at", "the logout token is not recent")
    events = claims.get("events")
    if not isinstance(events, dict) or BACKCHANNEL_EVENT not in events or "nonce" in claims:
        raise refuse("malformed", "it is not a back-channel logout token")
    if not isinstance(claims.get("sid"), str) and not isinstance(claims.get("sub"), str):
        raise refuse("malformed", "the logout token names neither a session nor a subject")
    return claims


def _signed_claims(token: str, provider: Provider) -> dict[str, Any]:
    header = _header(token)
    alg, kid = header.get("alg"), header.get("kid")
    allowed = [a for a in ALGORITHMS if a in provider.discovery().signing_algs] or ["RS256"]
    if alg not in allowed:
        raise refuse("algorithm", f"it is signed with {str(alg)[:20]!r}, not one of "
                                  f"{', '.join(allowed)}")
    if not isinstance(kid, str) or not kid:
        raise refuse("unknown_key", "its header names no key (kid)")
    keys = KeySet.import_key_set({"keys": [provider.key(kid)]})
    try:
        claims = jwt.decode(token, keys, algorithms=[str(alg)]).claims
    except (JoseError, ValueError) as exc:
        raise refuse("signature", f"its signature does not verify ({type(exc).__name__})") \
            from None
    if not isinstance(claims, dict):
        raise refuse("malformed", "its claims are not a JSON object")
    return claims


def _check_claims(claims: dict[str, Any], issuer: str, client_id: str, now: float,
                  nonce: str | None) -> None:
    if claims.get("iss") != issuer:
        raise refuse("issuer", f"it was issued by {str(claims.get('iss'))[:200]!r}, not {issuer}")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if client_id not in audiences:
        raise refuse("audience", f"it was issued for {str(aud)[:200]!r}, not for this "
                                 f"Harbourmaster's client {client_id!r}")
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise refuse("audience", "it names several audiences and was not issued to this client")
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise refuse("expired", "it has no expiry")
    if now >= exp + LEEWAY_SECONDS:
        raise refuse("expired", "it has expired")
    if not isinstance(iat, int | float) or isinstance(iat, bool) or iat > now + LEEWAY_SECONDS:
        raise refuse("issued_at", "it says it was issued in the future")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise refuse("subject", "it names no subject")
    if nonce is not None:
        given = claims.get("nonce")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), nonce.encode()):
            raise refuse("nonce", "its nonce is not this sign-in's")
