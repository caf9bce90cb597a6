"""The console's CSRF tokens: bound to one session's secret and hash, compared in constant time."""

from __future__ import annotations

import pytest

from marque.harbour.console.csrf import (
    LOGIN_PURPOSE,
    CsrfRefused,
    check_token,
    csrf_token,
)

SECRET = "s" * 43
BOUND = "a" * 64


def test_the_token_of_a_session_verifies() -> None:
    """A session's own token is accepted, and is the same every time (one per session)."""
    token = csrf_token(SECRET, BOUND)
    assert token == csrf_token(SECRET, BOUND)
    check_token(SECRET, BOUND, token)


@pytest.mark.parametrize("given", [None, ""])
def test_a_missing_token_is_refused_as_missing(given: str | None) -> None:
    """No token at all is CsrfRefused (code forbidden) with detail csrf=missing."""
    with pytest.raises(CsrfRefused) as excinfo:
        check_token(SECRET, BOUND, given)
    assert excinfo.value.code == "forbidden" and excinfo.value.http_status == 403
    assert excinfo.value.detail == {"csrf": "missing"}


def test_another_sessions_token_is_refused_as_mismatch() -> None:
    """A token made with another session's secret, or for another session hash, or for the
    login form, or altered by one character, is csrf=mismatch."""
    others = [csrf_token("t" * 43, BOUND), csrf_token(SECRET, "b" * 64),
              csrf_token(SECRET, BOUND, purpose=LOGIN_PURPOSE),
              csrf_token(SECRET, BOUND)[:-1] + "x", "ü" * 43]
    for other in others:
        with pytest.raises(CsrfRefused) as excinfo:
            check_token(SECRET, BOUND, other)
        assert excinfo.value.detail == {"csrf": "mismatch"}
