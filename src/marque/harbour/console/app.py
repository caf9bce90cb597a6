"""The console's routes: parse, find the session, check CSRF, call the core, render.

Each handler is thin in the way ``harbour/http.py``'s are: it reads the
session cookie and the form, runs the same core methods the API runs (in the
service's worker threads — the core blocks), and renders a template; who may
see or do what is the core's decision. A forged approval by the requester is
therefore refused by :meth:`Harbourmaster.approve` with ``self_approval``,
whatever the page offered.

Errors become pages, never tracebacks: a :class:`~marque.errors.MarqueError`
is shown with its code and message, with the HTTP status its class carries;
a failed approve or reject shows the request again with the message and the
reason as typed, so nothing is lost. A missing, expired or ended session on a
page is a redirect to the login page saying why.

Every page is sent with a strict Content-Security-Policy (scripts and styles
only from ``/static``), ``Cache-Control: no-store`` and ``X-Frame-Options:
DENY``; templates autoescape everything.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Awaitable, Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from marque.errors import InvalidInput, MarqueError, TokenLoginDisabled, Unauthenticated
from marque.harbour.console import csrf as console_csrf
from marque.harbour.console import views
from marque.harbour.console.logbook import logbook_page
from marque.harbour.console.notifications import notifications_view
from marque.harbour.console.oidc import OIDC_WHY, ConsoleOidc, safe_next
from marque.harbour.console.pilots import pilots_view
from marque.harbour.console.sessions import (
    LOGIN_COOKIE,
    LOGIN_FORM_SECONDS,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Sessions,
    Viewer,
    clear_cookie,
    is_secure,
    new_secret,
    set_cookie,
)
from marque.harbour.lifecycle import RequestState
from marque.target.image_values import display

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["Console"]

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
Run = Callable[..., Awaitable[Any]]
Handler = Callable[["Console", Request], Awaitable[Response]]

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_WHY = {
    "expired": "Your session has expired. Log in again to go on.",
    "revoked": "You logged out. Log in again to go on.",
    "logged_out": "You have logged out.",
    "principal_revoked": "Your principal was revoked: its sessions no longer work.",
    "role_revoked": "A role you signed in with was revoked: sign in again.",
    **OIDC_WHY,
    "unknown": "Log in with your principal's token to use the console.",
}


class _ToLogin(Exception):
    """No live session: the handler answers with a redirect to the login page."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def page(func: Handler) -> Handler:
    """Turn a missing session into a redirect to login, and an error into an error page."""

    @wraps(func)
    async def handler(self: Console, request: Request) -> Response:
        try:
            return await func(self, request)
        except _ToLogin as go:
            return self.to_login(request, go.reason)
        except MarqueError as exc:
            return self.error_page(request, exc)

    return handler


def _when(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "—"
    if isinstance(value, int | float):
        moment = _dt.datetime.fromtimestamp(float(value), tz=_dt.UTC)
        return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def _iso(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _dt.datetime.fromtimestamp(float(value), tz=_dt.UTC).isoformat()
    return ""


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and any(str(k).startswith("$") for k in value):
        return display(value)  # a row image's typed form: bytes:…, a jsonb's text
    return json.dumps(value, ensure_ascii=False, default=str)


def _safe_next(target: str | None) -> str:
    """A same-site path to return to after login (never another host; see
    :func:`marque.harbour.console.oidc.safe_next`)."""
    return safe_next(target)


class Console:
    """The web console of one Harbourmaster process: its routes and templates."""

    def __init__(self, harbourmaster: Harbourmaster, run: Run, *,
                 session_seconds: float = SESSION_SECONDS) -> None:
        self.hm = harbourmaster
        self._run = run
        self.sessions = Sessions(harbourmaster.store, seconds=session_seconds)
        self.templates = Environment(loader=FileSystemLoader(str(TEMPLATES)),
                                     autoescape=select_autoescape(default=True),
                                     undefined=StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
        self.templates.filters.update(when=_when, iso=_iso, pretty=_pretty, cell=_cell,
                                      tone=views.tone_of)
        self.templates.globals.update(OUTCOMES=views.OUTCOMES, STATES=views.STATES,
                                      Tone=views.Tone, nav_for=views.nav_for)
        digest = hashlib.sha256()
        for asset in sorted(STATIC.iterdir()):
            digest.update(asset.read_bytes())
        self.asset_version = digest.hexdigest()[:12]
        self.headers = _HEADERS
        self.oidc = ConsoleOidc(self)
        self.routes: list[BaseRoute] = [
            Route("/", self.queue, methods=["GET"]),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/requests/{id}", self.request_page, methods=["GET"]),
            Route("/requests/{id}/live", self.request_live, methods=["GET"]),
            Route("/requests/{id}/approve", self.approve, methods=["POST"]),
            Route("/requests/{id}/reject", self.reject, methods=["POST"]),
            Route("/requests/{id}/undo", self.undo, methods=["POST"]),
            Route("/pilots", self.pilots, methods=["GET"]),
            Route("/logbook", self.logbook, methods=["GET"]),
            Route("/notifications", self.notifications, methods=["GET"]),
            Route("/favicon.ico", self.favicon, methods=["GET"]),
            *self.oidc.routes,
            Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
        ]

    # -- plumbing ------------------------------------------------------------------------

    def _now(self) -> float:
        return float(self.hm.clock())

    def render(self, request: Request, name: str, status: int = 200, *,
               viewer: Viewer | None = None, **context: Any) -> HTMLResponse:
        """A template as a page, with the console's headers."""
        csrf = None
        if viewer is not None:
            csrf = console_csrf.csrf_token(viewer.session.csrf_secret,
                                           viewer.session.session_hash)
        context.setdefault("error", None)
        context.setdefault("flash", None)
        context.setdefault("section", "")
        html = self.templates.get_template(name).render(
            viewer=viewer, csrf=csrf, asset_version=self.asset_version, now=self._now(),
            harbour_id=self.hm.store.harbour_id, path=request.url.path, **context)
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    def to_login(self, request: Request, reason: str) -> Response:
        """303 to the login page, saying why, and coming back here after (401 for a fragment)."""
        path = request.url.path
        if path.endswith("/live"):
            return Response("log in again", status_code=401, headers=_HEADERS,
                            media_type="text/plain")
        if request.method == "GET":
            back = path + (f"?{request.url.query}" if request.url.query else "")
        else:  # a form's page, not its action
            back = path.rsplit("/", 1)[0] if path.startswith("/requests/") else "/"
        query = urlencode({"next": back, "why": reason})
        return RedirectResponse(f"/login?{query}", status_code=303, headers=_HEADERS)

    def error_page(self, request: Request, exc: MarqueError, *,
                   viewer: Viewer | None = None) -> Response:
        """A Marque error as a page: its code, its message, its status."""
        viewer = viewer or getattr(request.state, "viewer", None)
        return self.render(request, "error.html", exc.http_status, viewer=viewer,
                           error={"code": exc.code, "message": exc.message,
                                  "detail": exc.detail})

    async def viewer(self, request: Request) -> Viewer:
        """The live session's viewer, or :class:`_ToLogin` with why there is none."""
        session_id = request.cookies.get(SESSION_COOKIE)
        if not session_id:
            raise _ToLogin("unknown")
        try:
            found: Viewer = await self._run(self.sessions.find, session_id, self._now())
            await self.oidc.recheck(found)  # checked again at the provider, when due
        except Unauthenticated as exc:
            raise _ToLogin(str(exc.detail.get("reason") or "unknown")) from None
        if found.session.via == "cli":  # a command line's sign-in is a bearer token only
            raise _ToLogin("unknown")
        request.state.viewer = found
        return found

    async def form(self, request: Request, viewer: Viewer) -> dict[str, str]:
        """The posted form, after its CSRF token is checked against this session."""
        data = await request.form()
        form = {key: value for key, value in data.items() if isinstance(value, str)}
        console_csrf.check_token(viewer.session.csrf_secret, viewer.session.session_hash,
                                 form.get("csrf"))
        return form

    async def favicon(self, request: Request) -> Response:
        """``GET /favicon.ico``: the anchor, as SVG (where browsers look for an icon first)."""
        return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400",
                                 "X-Content-Type-Options": "nosniff"})

    # -- login and logout ----------------------------------------------------------------

    def _login_page(self, request: Request, status: int = 200, *, error: Any = None,
                    why: str = "", oidc: dict[str, Any] | None = None,
                    provider_logout: str | None = None) -> Response:
        nonce = request.cookies.get(LOGIN_COOKIE) or new_secret()
        token = console_csrf.csrf_token(nonce, "login", purpose=console_csrf.LOGIN_PURPOSE)
        response = self.render(request, "login.html", status, error=error,
                               message=_WHY.get(why) if why else None,
                               next=_safe_next(request.query_params.get("next")),
                               login_csrf=token, oidc=oidc,
                               provider_logout=provider_logout)
        set_cookie(response, LOGIN_COOKIE, nonce, max_age=LOGIN_FORM_SECONDS,
                   secure=is_secure(request))
        return response

    async def login_form(self, request: Request) -> Response:
        """``GET /login``: the token form (and why the viewer was sent here)."""
        why = request.query_params.get("why", "")
        offer = await self.oidc.offer()
        provider_logout = None
        if why == "logged_out" and offer is not None:
            provider_logout = await self.oidc.provider_logout_url(request)
        return self._login_page(request, why=why, oidc=offer, provider_logout=provider_logout)

    async def login_refused(self, request: Request, exc: MarqueError) -> Response:
        """The login page again, saying what was refused (no session is made)."""
        return self._login_page(request, exc.http_status, oidc=await self.oidc.offer(),
                                error={"code": exc.code, "message": exc.message})

    async def login(self, request: Request) -> Response:
        """``POST /login``: a principal's token becomes a session cookie."""
        data = await request.form()
        form = {key: value for key, value in data.items() if isinstance(value, str)}
        offer = await self.oidc.offer()
        try:
            if offer is not None and offer["require"]:
                raise TokenLoginDisabled("the console's token login is off: sign in through "
                                         "the identity provider")
            console_csrf.check_token(request.cookies.get(LOGIN_COOKIE) or new_secret(),
                                     "login", form.get("csrf"),
                                     purpose=console_csrf.LOGIN_PURPOSE)
            principal = await self._run(self.hm.authenticate, form.get("token", "").strip())
            session_id, _ = await self._run(self.sessions.start, principal, self._now())
        except MarqueError as exc:
            return self._login_page(request, exc.http_status, oidc=offer,
                                    error={"code": exc.code, "message": exc.message})
        response = RedirectResponse(_safe_next(form.get("next")), status_code=303,
                                    headers=_HEADERS)
        set_cookie(response, SESSION_COOKIE, session_id, max_age=int(self.sessions.seconds),
                   secure=is_secure(request))
        clear_cookie(response, LOGIN_COOKIE, secure=is_secure(request))
        return response

    @page
    async def logout(self, request: Request) -> Response:
        """``POST /logout``: the session ends in the store, everywhere (and a sign-in
        through the provider's refresh token is revoked there)."""
        viewer = await self.viewer(request)
        await self.form(request, viewer)
        await self._run(self.sessions.end, request.cookies.get(SESSION_COOKIE, ""),
                        self._now())
        await self.oidc.logged_out(viewer)  # the provider's refresh token revoked there
        response = RedirectResponse("/login?why=logged_out", status_code=303,
                                    headers=_HEADERS)
        clear_cookie(response, SESSION_COOKIE, secure=is_secure(request))
        return response

    # -- pages ---------------------------------------------------------------------------

    @page
    async def queue(self, request: Request) -> Response:
        """``GET /[?state=S]``: the requests queue."""
        viewer = await self.viewer(request)
        state = request.query_params.get("state") or None
        if state is not None and state not in {s.value for s in RequestState}:
            raise InvalidInput(f"there is no request state {state[:40]!r}: choose one of the "
                               "states listed", detail={"state": state[:40]})
        cursor = request.query_params.get("cursor") or None
        found = await self._run(views.queue_view, self.hm, viewer.principal, state, cursor)
        return self.render(request, "queue.html", viewer=viewer, section="queue", q=found)

    async def _request(self, request: Request, viewer: Viewer, status: int = 200, *,
                       error: Any = None, form: dict[str, str] | None = None) -> Response:
        found = await self._run(views.request_view, self.hm, viewer.principal,
                                request.path_params["id"])
        done = request.query_params.get("done")
        flash = {"approved": "Your approval is recorded.",
                 "rejected": "Your rejection is recorded.",
                 "undo_filed": "The undo is filed as this request: it is previewed and "
                               "approved like any other."}.get(done or "")
        return self.render(request, "request.html", status, viewer=viewer, section="queue",
                           v=found, error=error, flash=flash, form=form or {})

    @page
    async def request_page(self, request: Request) -> Response:
        """``GET /requests/{id}``: everything about one request."""
        viewer = await self.viewer(request)
        return await self._request(request, viewer)

    @page
    async def request_live(self, request: Request) -> Response:
        """``GET /requests/{id}/live``: the parts of the request page that change while it
        runs, as a fragment the page's script swaps in."""
        viewer = await self.viewer(request)
        found = await self._run(views.request_view, self.hm, viewer.principal,
                                request.path_params["id"])
        return self.render(request, "_live.html", viewer=viewer, v=found)

    async def _decide(self, request: Request, decision: str) -> Response:
        viewer = await self.viewer(request)
        form = await self.form(request, viewer)
        id = request.path_params["id"]
        reason = form.get("reason", "")
        try:
            if decision == "approve":
                await self._run(self.hm.approve, viewer.principal, id, reason.strip() or None)
            else:
                await self._run(self.hm.reject, viewer.principal, id, reason)
        except MarqueError as exc:
            error = {"code": exc.code, "message": exc.message, "detail": exc.detail}
            return await self._request(request, viewer, exc.http_status, error=error,
                                       form={"reason": reason, "decision": decision})
        done = "approved" if decision == "approve" else "rejected"
        return RedirectResponse(f"/requests/{quote(id, safe='')}?done={done}",
                                status_code=303, headers=_HEADERS)

    @page
    async def approve(self, request: Request) -> Response:
        """``POST /requests/{id}/approve`` (csrf, reason?): the core decides if it may."""
        return await self._decide(request, "approve")

    @page
    async def reject(self, request: Request) -> Response:
        """``POST /requests/{id}/reject`` (csrf, reason): a reason is required."""
        return await self._decide(request, "reject")

    @page
    async def undo(self, request: Request) -> Response:
        """``POST /requests/{id}/undo`` (csrf, reason?, mode?): file the undo of the viewer's
        own applied request — ``mode=per_row`` row by row, else all or nothing — then show
        the undo's page (or this page with why it was not)."""
        viewer = await self.viewer(request)
        form = await self.form(request, viewer)
        id = request.path_params["id"]
        reason = form.get("reason", "").strip() or None
        per_row = form.get("mode") == "per_row"
        try:
            filed, _ = await self._run(
                lambda: self.hm.undo(viewer.principal, id, reason=reason, per_row=per_row))
        except MarqueError as exc:
            error = {"code": exc.code, "message": exc.message, "detail": exc.detail}
            return await self._request(request, viewer, exc.http_status, error=error,
                                       form={"reason": reason or ""})
        return RedirectResponse(f"/requests/{quote(filed['id'], safe='')}?done=undo_filed",
                                status_code=303, headers=_HEADERS)

    @page
    async def pilots(self, request: Request) -> Response:
        """``GET /pilots``: the registry, each Pilot's live health, and the findings."""
        viewer = await self.viewer(request)
        found = await self._run(pilots_view, self.hm, viewer.principal)
        return self.render(request, "pilots.html", viewer=viewer, section="pilots", p=found)

    @page
    async def notifications(self, request: Request) -> Response:
        """``GET /notifications`` (admins): webhook endpoints, their deliveries, failures."""
        viewer = await self.viewer(request)
        found = await self._run(notifications_view, self.hm, viewer.principal)
        return self.render(request, "notifications.html", viewer=viewer,
                           section="notifications", n=found)

    @page
    async def logbook(self, request: Request) -> Response:
        """``GET /logbook[?before=SEQ&kind=PREFIX&actor=NAME&subject=ID]``: the newest
        matching entries (before ``before``), and the chain's verdict."""
        viewer = await self.viewer(request)
        raw = request.query_params.get("before", "")
        before = None
        if raw:
            if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
                raise InvalidInput(f"`before` must be a sequence number, got {raw[:40]!r}")
            before = int(raw)
        kind = request.query_params.get("kind", "").strip()
        actor = request.query_params.get("actor", "").strip()
        subject = request.query_params.get("subject", "").strip()
        found = await self._run(lambda: logbook_page(self.hm, viewer.principal, before=before,
                                                     kind=kind, actor=actor, subject=subject))
        return self.render(request, "logbook.html", viewer=viewer, section="logbook", lb=found)
