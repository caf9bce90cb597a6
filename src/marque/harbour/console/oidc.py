"""The console's sign-in through the identity provider (docs/console.md, "Signing in with
OIDC"): ``GET /login/oidc`` → the provider → ``GET /oidc/callback`` → a session.

The browser is bound to its sign-in by a random secret in the cookie
:data:`OIDC_COOKIE` (the store keeps its SHA-256 with the ``state``). That cookie is
``SameSite=Lax``, not ``Strict``: the provider's redirect back is a navigation from
another site, and a ``Strict`` cookie would not come with it. For the same reason the
callback does not redirect: the session cookie (``Strict``, as every session's) is set
on a small page that then moves on by itself (``<meta http-equiv=refresh>``, and a
link), a navigation from this site, with which a ``Strict`` cookie is sent.

A refused sign-in shows the login page with what was refused, and no session is made.
``POST /oidc/backchannel-logout`` takes the provider's logout token and ends the
sessions opened for that provider session (or subject) at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from marque.errors import InvalidInput, MarqueError, NotFound, OidcConfigInvalid, Unauthenticated
from marque.harbour.console.sessions import (
    SESSION_COOKIE,
    Sessions,
    Viewer,
    expiry,
    is_secure,
    new_secret,
    session_hash,
    set_cookie,
)
from marque.harbour.oidc.provider import Providers
from marque.harbour.oidc.recheck import Rechecks
from marque.harbour.oidc.signin import (
    CLI_TOKEN_PREFIX,
    CLI_TOKEN_SECONDS,
    LOGIN_SECONDS,
    Identity,
    SignIn,
)
from marque.harbour.oidc.tokens import verify_logout_token
from marque.harbour.store.base import HarbourStore
from marque.httpcommon import bearer_token, json_body

__all__ = ["ConsoleHost", "ConsoleOidc", "OIDC_COOKIE", "OIDC_WHY"]

log = logging.getLogger(__name__)
OIDC_COOKIE = "marque_oidc"
CALLBACK_PATH = "/oidc/callback"
#: What the login page says of a session its check at the provider ended (``?why=``).
OIDC_WHY = {
    "provider_refused": "The identity provider no longer vouches for your sign-in (it was "
                        "revoked or ended there): sign in again.",
    "provider_unreachable": "Your sign-in is checked again with the identity provider every "
                            "few minutes, and the provider could not be reached, so your "
                            "session ended. Sign in again once the provider is back.",
    "no_refresh_token": "The identity provider gave your sign-in no refresh token, so it "
                        "could not be checked again and has ended: sign in again.",
    "groups_changed": "Your groups at the identity provider no longer grant the role you "
                      "signed in with: sign in again.",
    "oidc_cleared": "The console no longer signs in through an identity provider.",
    "check_failed": "Your sign-in could not be checked again with the identity provider "
                    "(the Harbourmaster's settings for it may be wrong): sign in again, or "
                    "ask an admin.",
}


def safe_next(target: str | None) -> str:
    """A path on this site to go on to after signing in (never another host: browsers drop
    tabs and newlines from URLs, so ``/\t/evil.example`` would be ``//evil.example``;
    a path with any control character or space in it is refused)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target \
            or not all(c.isprintable() and not c.isspace() for c in target) \
            or len(target) > 2000:
        return "/"
    return target


class _Harbour(Protocol):
    @property
    def store(self) -> HarbourStore: ...


class ConsoleHost(Protocol):
    """What these routes use of the console (``console/app.py``'s ``Console``), named here
    so this module need not import the one that mounts it."""

    sessions: Sessions
    headers: dict[str, str]
    _run: Callable[..., Awaitable[Any]]

    @property
    def hm(self) -> _Harbour: ...

    def _now(self) -> float: ...

    def render(self, request: Request, name: str, status: int = 200, *,
               viewer: Viewer | None = None, **context: Any) -> HTMLResponse: ...

    async def login_refused(self, request: Request, exc: MarqueError) -> Response: ...


class ConsoleOidc:
    """The console's OIDC routes; ``providers`` keeps each issuer's keys for this process."""

    def __init__(self, console: ConsoleHost) -> None:
        self.console = console
        self.providers = Providers()
        self.signin = SignIn(console.hm.store, self.providers)
        self.rechecks = Rechecks(self.signin)
        self.routes: list[BaseRoute] = [
            Route("/login/oidc", self.start, methods=["GET"]),
            Route(CALLBACK_PATH, self.callback, methods=["GET"]),
            Route("/oidc/backchannel-logout", self.backchannel_logout, methods=["POST"]),
        ]
        #: The command line's sign-in, under ``/v1/`` (its errors are problem documents).
        self.api_routes: list[BaseRoute] = [
            Route("/v1/oidc", self.api_settings, methods=["GET"]),
            Route("/v1/oidc/exchange", self.api_exchange, methods=["POST"]),
            Route("/v1/oidc/logout", self.api_logout, methods=["POST"]),
        ]

    async def offer(self) -> dict[str, Any] | None:
        """What the login page offers: None (tokens only), or ``{require, error}``. Stored
        settings that cannot be read turn token login off too (fail closed)."""
        try:
            config = await self.console._run(self.signin.config)
        except OidcConfigInvalid as exc:
            return {"require": True, "error": exc.message}
        if config is None:
            return None
        return {"require": config.require, "error": None}

    async def provider_logout_url(self, request: Request) -> str | None:
        """Where to sign out at the provider too, after logging out of the console (its
        end-session endpoint, coming back to the login page); None if it has none, or
        cannot be reached now — the console's own logout has happened either way."""
        try:
            config = await self.console._run(self.signin.config)
            if config is None:
                return None
            discovery = await self.console._run(self.providers.get(config.issuer).discovery)
        except MarqueError:
            return None
        if discovery.end_session_endpoint is None:
            return None
        back = str(request.base_url).rstrip("/") + "/login"
        query = urlencode({"client_id": config.client_id, "post_logout_redirect_uri": back})
        separator = "&" if "?" in discovery.end_session_endpoint else "?"
        return f"{discovery.end_session_endpoint}{separator}{query}"

    def _redirect_uri(self, request: Request) -> str:
        return str(request.base_url).rstrip("/") + CALLBACK_PATH

    async def start(self, request: Request) -> Response:
        """``GET /login/oidc[?next=PATH]``: a new sign-in, and off to the provider."""
        console = self.console
        browser = request.cookies.get(OIDC_COOKIE) or new_secret()
        next_path = safe_next(request.query_params.get("next"))
        try:
            url = await console._run(self.signin.begin, browser, next_path,
                                     self._redirect_uri(request), console._now())
        except MarqueError as exc:
            return await console.login_refused(request, exc)
        response = Response(status_code=303, headers={**console.headers, "Location": url})
        response.set_cookie(OIDC_COOKIE, browser, max_age=LOGIN_SECONDS, path="/",
                            httponly=True, samesite="lax", secure=is_secure(request))
        return response

    async def callback(self, request: Request) -> Response:
        """``GET /oidc/callback?state&code`` (or ``error``): who signed in becomes a session."""
        console = self.console
        params = request.query_params
        try:
            identity: Identity = await console._run(
                self.signin.finish, params.get("state", ""), params.get("code"),
                params.get("error"), request.cookies.get(OIDC_COOKIE) or "",
                self._redirect_uri(request), console._now())
            session_id = await console._run(self._open, identity)
        except MarqueError as exc:
            log.info("console sign-in through the identity provider refused: %s (%s)",
                     exc.code, exc.detail.get("check") or exc.detail.get("subject", ""))
            return await console.login_refused(request, exc)
        log.info("console sign-in for %s through the identity provider (roles %s from the %s)",
                 identity.principal.name, ",".join(identity.roles), identity.roles_from)
        response = console.render(request, "signed_in.html", next=identity.next_path,
                                  who=identity.principal.name)
        set_cookie(response, SESSION_COOKIE, session_id, max_age=int(console.sessions.seconds),
                   secure=is_secure(request))
        response.delete_cookie(OIDC_COOKIE, path="/", httponly=True, samesite="lax",
                               secure=is_secure(request))
        return response

    def _open(self, identity: Identity, via: str = "oidc", expires_at: float | None = None,
              session_id: str | None = None, replaces: str | None = None) -> str:
        """A session for a signed-in identity (with id ``session_id``, else a new one); its
        id. A console session's first check at the provider is due ``recheck_seconds``
        from now (:mod:`marque.harbour.oidc.recheck`). A command line's renewal names the
        SHA-256 of the sign-in it ``replaces``, which the store ends as this one opens."""
        now = self.console._now()
        session_id = session_id or new_secret()
        store = self.console.hm.store
        hashed = session_hash(session_id)
        store.create_session(
            hashed, identity.principal.name, csrf_secret=new_secret(),
            expires_at=expires_at or expiry(now, self.console.sessions.seconds), now=now,
            via=via,
            roles=identity.roles, roles_from=identity.roles_from,
            oidc_subject=identity.subject, oidc_sid=identity.sid, replaces=replaces)
        if via == "oidc":
            store.note_oidc_check(hashed, refresh_token=identity.refresh_token, checked_at=now)
        return session_id

    async def recheck(self, viewer: Viewer) -> None:
        """Check a session opened through the provider again, when it is due; it ends
        (``Unauthenticated`` with the reason) if the provider no longer vouches for it."""
        if viewer.session.via == "oidc":
            await self.console._run(self.rechecks.check, viewer.session, self.console._now())

    async def logged_out(self, viewer: Viewer) -> None:
        """After a logout (the session already ended here): revoke the refresh token a
        session opened through the provider kept, at the provider. A failure is logged;
        the user is signed out of the console either way."""
        if viewer.session.via != "oidc":
            return
        try:
            await self.console._run(self.signin.revoke_refresh_token,
                                    viewer.session.session_hash)
        except MarqueError as exc:
            log.warning("logout of %s: the identity provider's refresh token was not revoked "
                        "(%s: %s); the console session has ended", viewer.name, exc.code,
                        exc.message)

    # -- the command line ------------------------------------------------------------

    async def api_settings(self, request: Request) -> Response:
        """``GET /v1/oidc``: what ``marque login --oidc`` needs to sign in at the provider,
        and ``marque logout`` to revoke its refresh token there (public, like the JWKS: it
        holds no secret)."""
        found = await self.console._run(self._cli_settings)
        return JSONResponse(found, headers={"Cache-Control": "no-store"})

    def _cli_settings(self) -> dict[str, Any]:
        config = self.signin.required()
        if config.cli_client_id is None:
            raise NotFound("this Harbourmaster does not let the command line sign in through "
                           "its identity provider (`harbour oidc set --cli-client-id`)")
        discovery = self.providers.get(config.issuer).discovery()
        if discovery.device_authorization_endpoint is None:
            raise NotFound("the identity provider offers no device authorization grant")
        return {"issuer": config.issuer, "client_id": config.cli_client_id,
                "scopes": list(config.scopes),
                "refresh": "offline_access" in discovery.scopes_supported,
                "device_authorization_endpoint": discovery.device_authorization_endpoint,
                "token_endpoint": discovery.token_endpoint,
                # Where `marque logout` revokes the refresh token it kept (RFC 7009); null
                # when the provider names none.
                "revocation_endpoint": discovery.revocation_endpoint}

    async def api_exchange(self, request: Request) -> Response:
        """``POST /v1/oidc/exchange`` ``{id_token, access_token?, renews?}``: the command
        line's ID token (for its own client, fresh, never exchanged before — or, when
        ``renews`` is the live bearer token the renewal replaces, the one that token was
        opened with) for a short-lived bearer token of this Harbourmaster:
        ``{token, expires_at, principal, roles}``. The token ``renews`` names ends as the
        new one opens, when it is a live command line's sign-in of the same principal."""
        body = json_body(await request.body(), "{id_token, access_token?, renews?}")
        if not isinstance(body, dict) or not isinstance(body.get("id_token"), str):
            raise InvalidInput("the body must be a JSON object {id_token, access_token?, "
                               "renews?}")
        access, renews = body.get("access_token"), body.get("renews")
        found = await self.console._run(self._exchange, body["id_token"],
                                        access if isinstance(access, str) else None,
                                        renews if isinstance(renews, str) and renews else None)
        return JSONResponse(found, headers={"Cache-Control": "no-store"})

    def _exchange(self, id_token: str, access_token: str | None,
                  renews: str | None = None) -> dict[str, Any]:
        now = self.console._now()
        token = CLI_TOKEN_PREFIX + new_secret()
        renewing = None if renews is None else session_hash(renews)
        identity, _, until = self.signin.exchange(
            id_token, now, access_token, opens=session_hash(token), renewing=renewing)
        # No longer than the recheck interval: the command line's renewal (a fresh ID token
        # from the provider, exchanged again) is how its sign-in is checked again. A renewal
        # answered the very token it had already exchanged brings no new word from the
        # provider, so it lasts no longer than the sign-in it replaces.
        expires_at = now + min(CLI_TOKEN_SECONDS, self.signin.required().recheck_seconds)
        if until is not None:
            expires_at = min(expires_at, until)
        # A renewal with a new ID token ends the sign-in it replaces as this one opens
        # (the store's compare-and-set: only a live command line's of the same principal;
        # a `renews` naming anything else ends nothing, and this is a fresh sign-in).
        self._open(identity, via="cli", expires_at=expires_at, session_id=token,
                   replaces=renewing)
        log.info("command-line sign-in for %s through the identity provider%s",
                 identity.principal.name, " (renewed with the same ID token)"
                 if until is not None else "")
        return {"token": token, "expires_at": expires_at,
                "principal": identity.principal.name, "roles": list(identity.roles)}

    async def api_logout(self, request: Request) -> Response:
        """``POST /v1/oidc/logout``, authenticated by the very ``mqs_…`` bearer token it
        ends: ``{ended}``, true when this call ended that sign-in, false when there was
        none left to end (idempotent). A principal's token is ``input_invalid``."""
        token = bearer_token(request)
        if token is None:
            raise Unauthenticated("send `Authorization: Bearer <token>`: the command line's "
                                  "sign-in to end")
        ended = await self.console._run(self.signin.sign_out, token, self.console._now())
        if ended:
            log.info("command-line sign-in ended by its logout")
        return JSONResponse({"ended": ended}, headers={"Cache-Control": "no-store"})

    async def backchannel_logout(self, request: Request) -> Response:
        """``POST /oidc/backchannel-logout`` (``logout_token``): the provider ended a session;
        so do we. 200 when the token holds (even if no session matched), 400 otherwise."""
        form = await request.form()
        token = form.get("logout_token")
        headers = {"Cache-Control": "no-store"}
        try:
            ended = await self.console._run(self._logout, token if isinstance(token, str)
                                            else "")
        except MarqueError as exc:
            log.info("back-channel logout refused: %s (%s)", exc.code, exc.detail.get("check"))
            return Response("logout token refused", status_code=400, headers=headers,
                            media_type="text/plain")
        log.info("back-channel logout ended %d console session(s)", ended)
        return Response(status_code=200, headers=headers)

    def _logout(self, token: str) -> int:
        config = self.signin.required()
        claims = verify_logout_token(token, self.providers.get(config.issuer),
                                     client_id=config.client_id, now=self.console._now())
        sid = claims.get("sid")
        sub = claims.get("sub")
        return self.console.hm.store.end_oidc_sessions(
            sid=sid if isinstance(sid, str) else None,
            subject=sub if isinstance(sub, str) and not isinstance(sid, str) else None)
