"""Principals and their tokens (DESIGN §11.7).

A principal is a unique name with roles. Its bearer token is random (256 bits
from :mod:`secrets`), shown once when minted, and stored only as its SHA-256:
a leaked store yields no usable token. Comparisons of hashes are constant-time,
so answering "who is this?" does not leak how much of a guess was right.

A principal's identity for approvals is its **key** as much as its name: the
store keeps the RFC 7638 thumbprint of each principal's public key
(:func:`key_thumbprint`) and refuses a second unrevoked principal holding the
same one, and an approval whose approver holds the requester's key is
self-approval whatever the approver's name (docs/harbour.md, "Principals").
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from marque.errors import InvalidInput

#: A token's prefix: lets secret scanners and people recognise a leaked one.
TOKEN_PREFIX = "mqh_"
#: Random bytes in a token (DESIGN §11.7: at least 256 bits).
TOKEN_BYTES = 32


class Role(enum.StrEnum):
    """What a principal may do (DESIGN §11.7)."""

    REQUESTER = "requester"
    APPROVER = "approver"
    AUDITOR = "auditor"
    ADMIN = "admin"
    PILOT = "pilot"
    #: An AI agent acting as a requester (docs/agents.md): it may request, read its own
    #: requests and execute its own marques, and nothing else — never approve, reject,
    #: expire, manage principals or routing, nor sign in to the console.
    AGENT = "agent"


@dataclass(frozen=True)
class Principal:
    """A principal as the store holds it (never its token)."""

    name: str
    roles: frozenset[Role]
    public_jwk: dict[str, Any] | None = None
    revoked_at: float | None = None
    created_at: float = 0.0
    #: The row's own id (``pr_…``): a revoked name added again is another principal.
    id: str = ""
    #: The RFC 7638 thumbprint of ``public_jwk`` (None without a key).
    key_thumbprint: str | None = None

    @property
    def revoked(self) -> bool:
        """Whether the principal's token no longer authenticates."""
        return self.revoked_at is not None

    def has(self, role: Role) -> bool:
        """Whether the principal holds ``role``."""
        return role in self.roles

    def to_dict(self) -> dict[str, Any]:
        """The principal as JSON (roles sorted), without any secret."""
        return {
            "id": self.id,
            "name": self.name,
            "roles": sorted(r.value for r in self.roles),
            "public_jwk": self.public_jwk,
            "key_thumbprint": self.key_thumbprint,
            "revoked_at": self.revoked_at,
            "created_at": self.created_at,
        }


def parse_roles(roles: Iterable[str | Role]) -> frozenset[Role]:
    """Roles from names; an unknown or missing role is ``InvalidInput``."""
    parsed: set[Role] = set()
    for role in roles:
        try:
            parsed.add(Role(role))
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise InvalidInput(f"unknown role {str(role)[:40]!r}: the roles are {known}",
                               detail={"role": str(role)[:40]}) from None
    if not parsed:
        raise InvalidInput("a principal needs at least one role")
    if Role.AGENT in parsed and len(parsed) > 1:
        # An agent that could also approve could approve its own change: the role stands alone.
        raise InvalidInput("the role agent cannot be combined with another role: an agent "
                           "is a principal of its own (docs/agents.md)",
                           detail={"roles": sorted(r.value for r in parsed)})
    return frozenset(parsed)


def key_thumbprint(public_jwk: dict[str, Any] | None) -> str | None:
    """The RFC 7638 thumbprint a principal's key is known by (None for no key).

    A JWK whose thumbprint cannot be computed is ``InvalidInput``: a key that
    cannot be told apart from another is never registered.
    """
    if public_jwk is None:
        return None
    if not isinstance(public_jwk, dict):
        raise InvalidInput("a principal's public key must be a JWK object")
    from marque.token.keys import thumbprint

    return thumbprint(public_jwk)


def mint_token() -> str:
    """A fresh bearer token: the prefix and 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    """The SHA-256 (hex) a token is stored and looked up as."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def hashes_equal(a: str, b: str) -> bool:
    """Compare two token hashes in constant time."""
    return hmac.compare_digest(a.encode("ascii", "replace"), b.encode("ascii", "replace"))
