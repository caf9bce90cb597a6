"""Ed25519 keys as JWKs: making them, reading them, their thumbprints, and the trusted set.

Marque signs and verifies with Ed25519 keys only (DESIGN §2). A key travels as
a JWK (RFC 8037 ``{kty OKP, crv Ed25519, x[, d]}``) and is named by its
``kid`` — its own, or its RFC 7638 thumbprint. :class:`TrustedKeys` is the one
place a verifier finds an issuer's key: by ``kid``, never from anything a
token carries. Keys are imported through joserfc; a key that cannot be read
is refused with the caller's :mod:`marque.errors` class.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Iterable
from typing import Any, Final

from joserfc.errors import JoseError
from joserfc.jwk import OKPKey
from joserfc.jwk import import_key as _import_jwk

from marque.errors import InvalidInput, MarqueError
from marque.token.jose import ALG

__all__ = [
    "TrustedKeys",
    "ed25519_public",
    "import_private",
    "import_public",
    "kid_of",
    "new_key",
    "public_jwk",
    "thumbprint",
    "thumbprint_of",
]

_CURVE: Final = "Ed25519"


def ed25519_public(jwk: Any, error: type[MarqueError], what: str) -> dict[str, Any]:
    """The ``{kty, crv, x}`` of an Ed25519 JWK, checked; ``error`` otherwise."""
    if not isinstance(jwk, dict):
        raise error(f"{what} must be a JWK object")
    if jwk.get("kty") != "OKP" or jwk.get("crv") != _CURVE:
        raise error(f"{what} must be an Ed25519 key (kty OKP, crv Ed25519)")
    x = jwk.get("x")
    if not isinstance(x, str) or not x:
        raise error(f"{what} has no public key member x")
    return {"kty": "OKP", "crv": _CURVE, "x": x}


def import_public(jwk: Any, error: type[MarqueError], what: str) -> OKPKey:
    """The public Ed25519 key of a JWK (its ``d``, if any, ignored); ``error`` otherwise."""
    members = ed25519_public(jwk, error, what)
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
def thumbprint_of(x: str) -> str:
    """The RFC 7638 thumbprint of the Ed25519 public key ``x``, computed once per key."""
    return _public_key(x).thumbprint()


def import_private(jwk: Any, what: str) -> OKPKey:
    """The private Ed25519 key of a JWK whose ``x`` is checked to be the public half of its
    ``d``; :class:`InvalidInput` otherwise."""
    members = ed25519_public(jwk, InvalidInput, what)
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


def kid_of(jwk: dict[str, Any], what: str) -> str:
    """The key's own ``kid``, or its RFC 7638 thumbprint if it has none; :class:`InvalidInput`
    for a ``kid`` that is not a non-empty string."""
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
    public: dict[str, Any] = dict(ed25519_public(jwk, InvalidInput, "key"))
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
        key = import_public(jwk, InvalidInput, "trusted key")
        alg = jwk.get("alg")
        if alg is not None and alg != ALG:
            raise InvalidInput(f"trusted key alg must be {ALG}, got {alg!r}")
        kid = kid_of(jwk, "trusted key")
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
