"""CSRF tokens for the console's forms (DESIGN §12): bound to one session, checked on every POST.

A session's token is ``HMAC-SHA256(csrf_secret, purpose ‖ session_hash)``,
base64url: the secret is the session's own (stored with it, never sent), so a
token taken from another session — or made up — does not verify, and the
comparison is constant-time. The cookie is ``SameSite=Strict`` as well; the
token is what makes a forged cross-site POST fail even where a browser sends
the cookie anyway.

Before a session exists (the login form) the same derivation binds the form to
a random value held in a short-lived cookie instead (the "double submit"
pattern): a login form posted from another site lacks that cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from marque.errors import Forbidden

__all__ = ["CsrfRefused", "check_token", "csrf_token"]

#: Tokens for the login form and for a session's forms can never stand for each other.
SESSION_PURPOSE = b"marque-console-csrf/0.1 session\x00"
LOGIN_PURPOSE = b"marque-console-csrf/0.1 login\x00"


class CsrfRefused(Forbidden):
    """A POST whose CSRF token is missing or not this session's (code ``forbidden``)."""


def csrf_token(secret: str, bound_to: str, *, purpose: bytes = SESSION_PURPOSE) -> str:
    """The token a form carries: ``secret`` keys an HMAC over ``purpose ‖ bound_to``."""
    mac = hmac.new(secret.encode("utf-8"), purpose + bound_to.encode("utf-8"), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode("ascii")


def check_token(secret: str, bound_to: str, given: str | None, *,
                purpose: bytes = SESSION_PURPOSE) -> None:
    """Refuse (:class:`CsrfRefused`) unless ``given`` is the token for ``secret`` and ``bound_to``.

    ``detail["csrf"]`` says ``missing`` or ``mismatch``, so a page can say which.
    """
    if not given:
        raise CsrfRefused("this form was posted without its CSRF token, so it was refused: "
                          "reload the page and send it again", detail={"csrf": "missing"})
    expected = csrf_token(secret, bound_to, purpose=purpose)
    if not hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace")):
        raise CsrfRefused("this form's CSRF token is not this session's, so it was refused: "
                          "reload the page and send it again", detail={"csrf": "mismatch"})
