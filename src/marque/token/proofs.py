"""Proofs of possession: the per-request signature of the key a marque is bound to.

Each execution request carries an RFC 9449-style proof signed by the holder
key the marque names (``cnf.jkt``): it names the marque (``ath``), the
execution ``nonce`` and the Pilot, and carries the holder's public key in its
``jwk`` header. :func:`verify_proof` checks it and consults the caller's
replay cache last, so a refused proof never burns a ``jti``; the ``jti`` is
remembered for as long as the proof could still be accepted
(:func:`jti_forget_after`).

This is the hot path of every execution: a holder signs every proof with the
same header, so the header and its key are read once per distinct header.
"""

from __future__ import annotations

import functools
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

from joserfc.jwk import OKPKey

from marque.errors import (
    InvalidInput,
    PopInvalid,
    PopKeyMismatch,
    PopMissing,
    PopReplayed,
)
from marque.token.claims import int_claim, nonempty_str
from marque.token.header import pin_header
from marque.token.jose import ALG, Registry, compact_header, decode_header, sign, verified_payload
from marque.token.keys import ed25519_public, import_private, import_public, thumbprint_of
from marque.token.marques import Marque, ath_of

__all__ = [
    "MAX_POP_JTI_LENGTH",
    "POP_TYP",
    "REPLAY_MARGIN_SECONDS",
    "jti_forget_after",
    "make_proof",
    "verify_proof",
]

#: ``typ`` header of a proof of possession.
POP_TYP = "marque-pop+jwt"
#: Largest accepted proof ``jti``: it is stored in the Pilot's replay cache.
MAX_POP_JTI_LENGTH = 256
#: A proof's ``jti`` is remembered this long beyond the last moment it could be accepted.
REPLAY_MARGIN_SECONDS = 60.0

_POP_REGISTRY = Registry(algorithms=[ALG])


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
    key = import_private(holder_key, "holder key")
    if isinstance(marque_token, str):
        marque_token = marque_token.strip()  # as read_marque does: ath covers the token alone
    if not isinstance(marque_token, str) or not marque_token.isascii() or not marque_token:
        raise InvalidInput("marque_token must be a compact JWS string")
    nonempty_str(nonce, "nonce", InvalidInput)
    nonempty_str(pilot_id, "pilot_id", InvalidInput)
    proof_jti = secrets.token_urlsafe(24) if jti is None else jti
    nonempty_str(proof_jti, "jti", InvalidInput)
    if len(proof_jti) > MAX_POP_JTI_LENGTH:
        raise InvalidInput(f"jti is longer than {MAX_POP_JTI_LENGTH} characters")
    moment = time.time() if now is None else now
    header = {
        "typ": POP_TYP,
        "alg": ALG,
        "jwk": ed25519_public(holder_key, InvalidInput, "holder key"),
    }
    claims = {
        "jti": proof_jti,
        "iat": math.floor(moment),
        "ath": ath_of(marque_token),
        "nonce": nonce,
        "pilot": pilot_id,
    }
    return sign(header, claims, key, _POP_REGISTRY)


@functools.lru_cache(maxsize=1024)
def _proof_holder(segment: str) -> tuple[OKPKey, str]:
    """The holder key a proof's header segment carries, and its thumbprint.

    A holder signs every proof with the same header, so it is read once per
    distinct header text; a header that fails a check raises, and is never cached.
    """
    header = decode_header(segment, "proof", PopInvalid)
    pin_header(header, typ=POP_TYP, what="proof", error=PopInvalid, typ_first=True)
    jwk = header.get("jwk")
    if not isinstance(jwk, dict):
        raise PopInvalid("proof header carries no jwk")
    if "d" in jwk:
        raise PopInvalid("proof jwk contains a private key")
    key = import_public(jwk, PopInvalid, "proof jwk")
    return key, thumbprint_of(jwk["x"])


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
    segment = compact_header(proof, _POP_REGISTRY, "proof", PopInvalid)
    key, thumbprint = _proof_holder(segment)
    if thumbprint != marque.jkt:
        raise PopKeyMismatch("the proof is signed by a key other than the one the marque names")
    claims = verified_payload(proof, key, _POP_REGISTRY, "proof", PopInvalid)

    jti = nonempty_str(claims.get("jti"), "proof jti", PopInvalid)
    if len(jti) > MAX_POP_JTI_LENGTH:
        raise PopInvalid(f"proof jti is longer than {MAX_POP_JTI_LENGTH} characters")
    issued_at = int_claim(claims.get("iat"), "proof iat", PopInvalid)
    ath = nonempty_str(claims.get("ath"), "proof ath", PopInvalid)
    proof_nonce = nonempty_str(claims.get("nonce"), "proof nonce", PopInvalid)
    proof_pilot = nonempty_str(claims.get("pilot"), "proof pilot", PopInvalid)

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
        jti, issued_at + window_seconds + REPLAY_MARGIN_SECONDS
    ):
        raise PopReplayed("this proof has been used before")
    return jti


def jti_forget_after(now: float, window_seconds: float) -> float:
    """A time after which an accepted proof's ``jti`` can be forgotten, whatever its ``iat``.

    An accepted ``iat`` is at most ``window_seconds`` ahead of ``now``, and the
    proof stays acceptable for ``window_seconds`` after its ``iat``.
    """
    return now + 2 * window_seconds + REPLAY_MARGIN_SECONDS
