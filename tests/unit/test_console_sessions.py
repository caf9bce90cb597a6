"""Console session plumbing: ids, their hashes, expiry and the cookie's attributes."""

from __future__ import annotations

import hashlib

import pytest
from starlette.requests import Request
from starlette.responses import Response

from marque.harbour.console.sessions import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    clear_cookie,
    expiry,
    is_secure,
    new_secret,
    session_hash,
    set_cookie,
)


def request_for(scheme: str) -> Request:
    return Request({"type": "http", "scheme": scheme, "method": "GET", "path": "/",
                    "query_string": b"", "headers": [(b"host", b"harbour.example")],
                    "server": ("harbour.example", 443 if scheme == "https" else 80)})


def test_session_ids_are_random_and_stored_as_their_sha256() -> None:
    """Ids carry 256 bits and never repeat; the stored form is their SHA-256 in hex."""
    ids = {new_secret() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) >= 43 for i in ids)
    one = next(iter(ids))
    assert session_hash(one) == hashlib.sha256(one.encode()).hexdigest()
    assert len(session_hash(one)) == 64 and one not in session_hash(one)


def test_a_session_expires_a_fixed_time_after_login() -> None:
    """expiry(now) is now plus the session's life (8 h by default); a non-positive life is
    refused."""
    assert expiry(1000.0) == 1000.0 + SESSION_SECONDS == 1000.0 + 8 * 3600
    assert expiry(1000.0, 60) == 1060.0
    with pytest.raises(ValueError):
        expiry(1000.0, 0)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_cookie_is_httponly_strict_and_secure_under_tls(scheme: str) -> None:
    """The session cookie is HttpOnly, SameSite=Strict, Path=/, with Max-Age; Secure exactly
    when the console is served over TLS."""
    response = Response()
    secure = is_secure(request_for(scheme))
    assert secure is (scheme == "https")
    set_cookie(response, SESSION_COOKIE, "the-id", max_age=600, secure=secure)
    header = response.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in header.split(";")}
    assert header.startswith(f"{SESSION_COOKIE}=the-id;")
    assert {"httponly", "max-age", "path", "samesite"} <= attributes
    assert "samesite=strict" in header.lower() and "max-age=600" in header.lower()
    assert ("secure" in attributes) is secure


def test_clearing_the_cookie_expires_it_with_the_same_attributes() -> None:
    """Logout's cookie has Max-Age=0 and the same Path/SameSite, so the browser drops it."""
    response = Response()
    clear_cookie(response, SESSION_COOKIE, secure=False)
    header = response.headers["set-cookie"].lower()
    assert "max-age=0" in header and "samesite=strict" in header and "path=/" in header
