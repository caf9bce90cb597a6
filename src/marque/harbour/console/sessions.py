"""Console sessions (DESIGN §12): a random id in an HttpOnly cookie, the session in the store.

Logging in with a principal's token mints a session id (256 random bits); the
browser keeps it in the cookie :data:`SESSION_COOKIE` and the store keeps its
SHA-256 with the principal, an absolute expiry and the session's CSRF secret
(:mod:`marque.harbour.store.session_sql`). Every page looks the session up in
the store, so a logout, an expiry or a revoked principal takes effect in every
``harbour serve`` process at once. The token itself is used once, at login,
and never stored in the browser.

The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other
site's page sends it), ``Path=/``, ``Secure`` when the console is served over
TLS, and carries ``Max-Age`` equal to the session's remaining life.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from marque.errors import Forbidden
from marque.harbour.principals import Principal, Role
from marque.harbour.store.base import ConsoleSession, HarbourStore

__all__ = ["SESSION_COOKIE", "SESSION_SECONDS", "Viewer", "Sessions"]

SESSION_COOKIE = "marque_session"
#: The login form's double-submit cookie (see :mod:`.csrf`).
LOGIN_COOKIE = "marque_login"
#: A session's life from login: a working day. There is no sliding renewal.
SESSION_SECONDS = 8 * 3600
#: How long a login form stays usable.
LOGIN_FORM_SECONDS = 3600
#: Expired sessions are deleted at a later login once they are this old.
PURGE_AFTER_SECONDS = 7 * 86_400
_ID_BYTES = 32


def new_secret() -> str:
    """256 random bits, URL-safe: a session id or a CSRF secret."""
    return secrets.token_urlsafe(_ID_BYTES)


def session_hash(session_id: str) -> str:
    """The SHA-256 (hex) a session id is stored and looked up as."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def expiry(now: float, seconds: float = SESSION_SECONDS) -> float:
    """When a session started at ``now`` ends."""
    if seconds <= 0:
        raise ValueError("a session must last a positive number of seconds")
    return now + seconds


def is_secure(request: Request) -> bool:
    """Whether the console is being served over TLS (the cookie is then ``Secure``)."""
    return request.url.scheme == "https"


def set_cookie(response: Response, name: str, value: str, *, max_age: int,
               secure: bool) -> None:
    """Set one of the console's cookies with its fixed attributes."""
    response.set_cookie(name, value, max_age=max(0, max_age), path="/", httponly=True,
                        samesite="strict", secure=secure)


def clear_cookie(response: Response, name: str, *, secure: bool) -> None:
    """Tell the browser to drop a cookie (same attributes, so it matches)."""
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=secure)


@dataclass(frozen=True)
class Viewer:
    """Who is looking at a page: the session's principal, and the session itself."""

    principal: Principal
    session: ConsoleSession

    @property
    def name(self) -> str:
        """The principal's name."""
        return self.principal.name


class Sessions:
    """Sessions in one Harbourmaster's store. Blocking: call from a worker thread."""

    def __init__(self, store: HarbourStore, *, seconds: float = SESSION_SECONDS) -> None:
        self.store = store
        self.seconds = seconds

    def start(self, principal: Principal, now: float) -> tuple[str, ConsoleSession]:
        """A new session for an authenticated principal: ``(session id, stored session)``.

        An agent never gets one (``forbidden``): the console is where humans decide, and
        an agent's token is refused there however it signs in (docs/agents.md)."""
        if principal.has(Role.AGENT):
            raise Forbidden(f"{principal.name} is an agent: agents cannot sign in to the "
                            "console; a human approver signs in with their own token",
                            detail={"principal": principal.name})
        self.store.purge_sessions(before=now - PURGE_AFTER_SECONDS)
        session_id = new_secret()
        stored = self.store.create_session(session_hash(session_id), principal.name,
                                           csrf_secret=new_secret(),
                                           expires_at=expiry(now, self.seconds), now=now)
        return session_id, stored

    def find(self, session_id: str, now: float) -> Viewer:
        """The viewer of a live session; ``Unauthenticated`` (with its reason) otherwise."""
        session, principal = self.store.get_session(session_hash(session_id), now=now)
        return Viewer(principal, session)

    def end(self, session_id: str, now: float) -> bool:
        """Log out: the session stops working everywhere."""
        return self.store.revoke_session(session_hash(session_id), now=now)
