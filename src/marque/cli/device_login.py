"""``marque login --oidc``: sign in at the identity provider with the device authorization
grant (RFC 8628), for a terminal that may have no browser (an SSH session).

1. ``GET {harbour}/v1/oidc`` names the provider's device and token endpoints and the
   command line's public client id (no secret: a command line cannot keep one).
2. The device authorization endpoint answers a user code and a verification URL, which
   are printed (to stderr); the user opens the URL anywhere, signs in and confirms.
3. The token endpoint is polled at the interval the provider asks (``slow_down`` adds
   five seconds, as the RFC says) until it answers tokens, or says the code expired or
   was denied.
4. The ID token (and the access token, for claims the ID token lacks) is posted to
   ``{harbour}/v1/oidc/exchange``, which answers a bearer token of that Harbourmaster
   lasting its recheck interval (an hour at most). That token is what is stored, with —
   when the provider offers ``offline_access`` — the provider's refresh token, so that a
   command run after that signs in again by itself (:func:`refresh_sign_in`): a fresh ID
   token from the refresh grant, exchanged the same way (naming the token it renews),
   where the Harbourmaster maps its claims again (the sign-in's check). The provider's
   ID and access tokens are never stored.
5. ``marque logout`` ends the Harbourmaster's token on the server (``POST
   /v1/oidc/logout``, :func:`end_sign_in`) and revokes that refresh token at the provider
   (RFC 7009, :func:`revoke_sign_in`), at the revocation endpoint ``GET /v1/oidc`` names,
   each with a short timeout: the local sign-out has happened already and must not wait
   on them.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from marque.cli.common import err, literal
from marque.errors import (
    HarbourUnavailable,
    MarqueError,
    NotFound,
    OidcLoginRefused,
    OidcProviderUnavailable,
    lookup,
)

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
TIMEOUT = httpx.Timeout(15.0)
#: Each call of a logout's revocation waits no longer than this (the Harbourmaster's
#: settings, then the provider): an unreachable one must not hold a logout up.
REVOKE_TIMEOUT = httpx.Timeout(4.0)


def _problem(response: httpx.Response) -> MarqueError:
    """The Harbourmaster's problem document as the error it names."""
    try:
        body = response.json()
        cls = lookup(str(body.get("code")))
        return cls(str(body.get("detail") or body.get("title")),
                   detail={k: v for k, v in body.items() if k not in ("type", "title",
                                                                        "status", "detail",
                                                                        "code")})
    except (ValueError, KeyError, AttributeError):
        return HarbourUnavailable(f"the Harbourmaster answered HTTP {response.status_code}")


def _harbour(method: str, url: str, *, timeout: httpx.Timeout = TIMEOUT,
             **kwargs: Any) -> dict[str, Any]:
    try:
        response = httpx.request(method, url, timeout=timeout, **kwargs)
    except httpx.HTTPError as exc:
        raise HarbourUnavailable(f"cannot reach the Harbourmaster at {url}: "
                                 f"{type(exc).__name__}") from None
    if response.status_code != 200:
        raise _problem(response)
    try:
        found: dict[str, Any] = response.json()
    except ValueError:
        raise HarbourUnavailable(f"the Harbourmaster at {url} did not answer JSON") from None
    return found


def _provider(url: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    try:
        response = httpx.post(url, data=form, timeout=TIMEOUT,
                              headers={"Accept": "application/json"})
        body = response.json()
    except httpx.HTTPError as exc:
        raise OidcProviderUnavailable(f"cannot reach the identity provider at {url}: "
                                      f"{type(exc).__name__}") from None
    except ValueError:
        raise OidcProviderUnavailable(f"the identity provider at {url} did not answer "
                                      "JSON") from None
    if not isinstance(body, dict):
        raise OidcProviderUnavailable(f"the identity provider at {url} answered nonsense")
    return response.status_code, body


def device_sign_in(harbour_url: str, *, sleep: Any = time.sleep) -> dict[str, Any]:
    """Run the device flow against the Harbourmaster's provider; the exchange's answer
    ``{token, expires_at, principal, roles}``."""
    base = harbour_url.rstrip("/")
    settings = _harbour("GET", f"{base}/v1/oidc")
    client_id = str(settings["client_id"])
    scopes = list(settings["scopes"]) + (["offline_access"] if settings.get("refresh") else [])
    status, grant = _provider(settings["device_authorization_endpoint"],
                              {"client_id": client_id, "scope": " ".join(scopes)})
    if status != 200 or "device_code" not in grant:
        raise OidcLoginRefused(f"the identity provider would not start a device sign-in "
                               f"({str(grant.get('error', status))[:80]})",
                               detail={"check": "provider"})
    shown = grant.get("verification_uri_complete") or grant["verification_uri"]
    err.say(f"To sign in, open {literal(shown)} and confirm the code "
            f"{literal(grant['user_code'])}")
    interval = float(grant.get("interval", 5))
    deadline = time.monotonic() + float(grant.get("expires_in", 600))
    while True:
        if time.monotonic() > deadline:
            raise OidcLoginRefused("the device code expired before the sign-in was confirmed: "
                                   "run `marque login --oidc` again",
                                   detail={"check": "expired"})
        sleep(interval)
        status, tokens = _provider(settings["token_endpoint"], {
            "grant_type": DEVICE_GRANT, "device_code": grant["device_code"],
            "client_id": client_id})
        error = tokens.get("error")
        if status == 200 and isinstance(tokens.get("id_token"), str):
            break
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval += 5
            continue
        raise OidcLoginRefused(f"the identity provider did not sign you in "
                               f"({str(error or status)[:80]})", detail={"check": "provider"})
    return _exchange(base, tokens)


def _exchange(base: str, tokens: dict[str, Any], renews: str | None = None) -> dict[str, Any]:
    """The provider's tokens exchanged at the Harbourmaster (a renewal naming the token it
    replaces); its answer, with the provider's refresh token (if any) to keep."""
    body = {"id_token": tokens["id_token"]}
    if isinstance(tokens.get("access_token"), str):
        body["access_token"] = tokens["access_token"]
    if renews:
        body["renews"] = renews
    answer = _harbour("POST", f"{base}/v1/oidc/exchange", json=body)
    refresh = tokens.get("refresh_token")
    return {**answer, "refresh_token": refresh if isinstance(refresh, str) else None}


def refresh_sign_in(harbour_url: str, refresh_token: str,
                    renews: str | None = None) -> dict[str, Any]:
    """Sign in again without a person: the refresh grant at the provider for a new ID token,
    exchanged at the Harbourmaster with ``renews``, the Harbourmaster's token it replaces
    (a refresh within the second of the last one may answer the same ID token, which the
    Harbourmaster accepts again only from that sign-in). A refusal is ``OidcLoginRefused``
    (sign in again)."""
    base = harbour_url.rstrip("/")
    settings = _harbour("GET", f"{base}/v1/oidc")
    status, tokens = _provider(settings["token_endpoint"], {
        "grant_type": "refresh_token", "refresh_token": refresh_token,
        "client_id": str(settings["client_id"])})
    if status != 200 or not isinstance(tokens.get("id_token"), str):
        raise OidcLoginRefused("the identity provider would not renew your sign-in "
                               f"({str(tokens.get('error', status))[:80]}): run "
                               "`marque login --oidc` again", detail={"check": "refresh"})
    if not isinstance(tokens.get("refresh_token"), str):
        tokens["refresh_token"] = refresh_token  # a provider that does not rotate it
    return _exchange(base, tokens, renews)


def end_sign_in(harbour_url: str, token: str) -> bool:
    """End the Harbourmaster's own session of a sign-in (``POST /v1/oidc/logout``,
    authenticated by that ``mqs_…`` token), waiting :data:`REVOKE_TIMEOUT` at most: True
    when it ended it, False when it had already ended (or expired). The Harbourmaster's
    refusal is the error it names; one that cannot be reached, ``HarbourUnavailable``."""
    base = harbour_url.rstrip("/")
    answer = _harbour("POST", f"{base}/v1/oidc/logout", timeout=REVOKE_TIMEOUT,
                      headers={"Authorization": f"Bearer {token}"})
    return isinstance(answer, dict) and answer.get("ended") is True


def revoke_sign_in(harbour_url: str, refresh_token: str) -> None:
    """Revoke the provider's refresh token a sign-in kept (RFC 7009 §2.1, as the public
    command-line client: ``client_id`` in the body, ``token_type_hint=refresh_token``) at
    the revocation endpoint the Harbourmaster's ``GET /v1/oidc`` names; each call waits
    :data:`REVOKE_TIMEOUT` at most. ``NotFound`` when it names none; the Harbourmaster's
    refusal as the error it names; a provider that cannot be reached, or answers anything
    but 200 (which it answers for a token it no longer knows, too), is
    ``OidcProviderUnavailable``."""
    base = harbour_url.rstrip("/")
    settings = _harbour("GET", f"{base}/v1/oidc", timeout=REVOKE_TIMEOUT)
    endpoint = settings.get("revocation_endpoint") if isinstance(settings, dict) else None
    client_id = settings.get("client_id") if isinstance(settings, dict) else None
    if not isinstance(endpoint, str) or not endpoint.startswith("http") \
            or not isinstance(client_id, str):
        raise NotFound("the Harbourmaster names no revocation endpoint of its identity "
                       "provider (the provider offers none, or this Harbourmaster is older)")
    from marque.harbour.oidc.provider import revoke_token

    revoke_token(endpoint, refresh_token, "refresh_token", client_id=client_id,
                 timeout=REVOKE_TIMEOUT)
