"""What Marque's HTTP services share: problem documents, ``X-Request-Id`` and the worker
threads their synchronous cores run in (DESIGN §10).

The Pilot's service and the Harbourmaster's answer errors the same way — an
RFC 9457 problem document whose status comes from the error's class — and
both put an ``X-Request-Id`` on every response, so one request can be traced
across a client, a Harbourmaster and a Pilot. Both run their core in
:class:`WorkerThreads`, the one boundary where an exception that is not a
:class:`~marque.errors.MarqueError` (a fault of ours) is logged with its
traceback and answered ``internal`` — without its text, which may hold anything
(a DSN, a row, a path). Keeping all of it here means the two services cannot
drift apart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marque.errors import (
    PROBLEM_MEMBERS,
    Internal,
    InvalidInput,
    MarqueError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
)

__all__ = ["PROBLEM", "BodyLimit", "TraceIdMiddleware", "WorkerThreads", "api_http_errors",
           "bearer_token", "core_call", "internal_error", "json_body", "no_surrogates",
           "problem", "trace_id_of"]

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"
_TRACE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: A lone UTF-16 surrogate: JSON's ``\\uD800`` escapes can make one, and no UTF-8 text
#: (a store's column, an answer's body) can hold it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def problem(exc: MarqueError, trace_id: str | None = None, *,
            extra: Mapping[str, Any] | None = None) -> JSONResponse:
    """The RFC 9457 problem document of a Marque error; its status comes from the class.

    The error's ``detail`` travels as extension members (``rule``, ``statement``,
    ``target``…: what a caller's client turns back into the error's detail, see
    :func:`marque.clients.problems.problem_error`); JSON values only. ``extra`` adds
    members (e.g. the ``id`` of a request stored as failed). Neither can override
    the standard ones. ``trace_id``, when given, goes on the response's
    ``X-Request-Id`` header (a route that skips the middleware sets it so; behind
    the middleware the header is its, the same id).
    """
    body: dict[str, Any] = {
        "type": f"urn:marque:error:{exc.code}",
        "title": exc.code.replace("_", " "),
        "status": exc.http_status,
        "detail": exc.message,
        "code": exc.code,
    }
    if exc.sqlstate:
        body["sqlstate"] = exc.sqlstate
    for key, value in {**exc.json_detail(), **(extra or {})}.items():
        if key not in PROBLEM_MEMBERS:  # extras never replace the standard members
            body[key] = value
    response = JSONResponse(body, status_code=exc.http_status, media_type=PROBLEM)
    if trace_id is not None:
        response.headers["x-request-id"] = trace_id
    return response


def internal_error(exc: BaseException, where: object) -> Internal:
    """Log ``exc`` (an exception that is not a Marque error) with its traceback, and the
    ``internal`` error that answers it in its place: the caller learns that the service
    failed, not what the exception said."""
    name = getattr(where, "__qualname__", None) or getattr(where, "__name__", None) or where
    log.error("unexpected error in %s", name, exc_info=exc)
    return Internal("the service met an unexpected error; its log holds the cause")


def core_call(func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` as a service's core call: a Marque error passes as it is; any other
    exception is logged and becomes ``internal`` (:func:`internal_error`)."""
    try:
        return func(*args)
    except MarqueError:
        raise
    except Exception as exc:
        raise internal_error(exc, func) from exc


class WorkerThreads:
    """The threads a service's synchronous core runs in: never on the event loop.

    :meth:`call` awaits one core call; :meth:`start` runs a job the caller follows by
    other means (the Pilot's execution streams through a feed). Both go through
    :func:`core_call`, so a crash is logged and answered ``internal`` the same way
    everywhere.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

    async def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` in a worker thread (see :func:`core_call`)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, core_call, func, *args)

    def start(self, job: Callable[[], None]) -> None:
        """Run ``job`` in a worker thread, not awaited: it must report its own result
        (an error it lets out is logged as :func:`core_call` logs one)."""
        self._pool.submit(core_call, job)

    def close(self) -> None:
        """Let calls in progress finish, then release the threads."""
        self._pool.shutdown(wait=True)


def trace_id_of(scope: Scope) -> str:
    """The trace id (sent and answered as ``X-Request-Id``; not a change request's
    ``request_id``): the caller's header if it is sane, else a new one;
    kept in the scope's state, so every layer of one request finds the same id."""
    state = scope.setdefault("state", {})
    known = state.get("trace_id")
    if isinstance(known, str):
        return known
    given = ""
    for name, value in scope["headers"]:
        if name == b"x-request-id":  # servers hand ASGI header names lower-cased
            given = value.decode("latin-1")
    trace_id = given if _TRACE_ID.fullmatch(given) else "req_" + uuid.uuid4().hex
    state["trace_id"] = trace_id
    return trace_id


class TraceIdMiddleware:
    """Every response carries ``X-Request-Id``: the caller's if it is sane, else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace_id = trace_id_of(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", trace_id.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)


def api_http_errors(*prefixes: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    """A Starlette handler for the router's own 404 and 405 that answers them, under the
    API's path ``prefixes``, as problem documents (``not_found``, ``method_not_allowed``,
    with ``Allow`` kept) like every other error of the API; elsewhere (the console's
    pages) as Starlette answers them, in plain text."""

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        if exc.status_code in (404, 405) and path.startswith(prefixes):
            error: MarqueError = (
                NotFound(f"no endpoint at {path}") if exc.status_code == 404 else
                MethodNotAllowed(f"{request.method} is not answered at {path}"))
            response = problem(error, getattr(request.state, "trace_id", None))
            for name, value in (exc.headers or {}).items():
                response.headers[name] = value
            return response
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=exc.headers)
        return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)

    return handle


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is larger than this endpoint's limit of "
                           f"{limit} bytes", detail={"limit": limit})


class BodyLimit:
    """Refuse a request body longer than its path's limit with ``payload_too_large`` (413),
    before the app has parsed or stored any of it.

    ``limit_of(path)`` gives the limit in bytes. A ``Content-Length`` over it is answered at
    once, without reading the body; a body sent without one (chunked) is counted as the
    app reads it, and the read that crosses the limit raises :class:`PayloadTooLarge` into
    the app — whose error handling answers it — so no body is ever held whole past its
    limit. If the app lets the error through, it is answered here (while nothing of the
    response has been sent).
    """

    def __init__(self, app: ASGIApp, limit_of: Callable[[str], int]) -> None:
        self.app = app
        self._limit_of = limit_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit_of(scope["path"])
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _answer(_too_large(limit), scope, receive, send)
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _too_large(limit)
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except PayloadTooLarge as exc:
            if started:
                raise
            await _answer(exc, scope, receive, send)


async def _answer(exc: MarqueError, scope: Scope, receive: Receive, send: Send) -> None:
    # The caller is told to stop sending: the connection is not kept for a body unread.
    response = problem(exc, trace_id_of(scope))
    response.headers["connection"] = "close"
    await response(scope, receive, send)


def no_surrogates(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) holds no lone surrogate in any string or key."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is None
    if isinstance(value, dict):
        return all(no_surrogates(k) and no_surrogates(v) for k, v in value.items())
    if isinstance(value, list):
        return all(no_surrogates(item) for item in value)
    return True


def bearer_token(request: Request) -> str | None:
    """The bearer token of ``Authorization``; None when the header is absent, and
    ``Unauthenticated`` when it names another scheme or no token."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("send `Authorization: Bearer <token>` with a principal's token")
    return token.strip()


def json_body(raw: bytes, shape: str) -> Any:
    """A request body parsed as JSON (any value); ``input_invalid`` naming ``shape`` if it
    is not UTF-8 JSON, or if a string in it holds a lone surrogate (``"\\ud800"``), which
    no UTF-8 text can carry."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise InvalidInput(f"the body must be a JSON object {shape}") from None
    # Only an escape can make a surrogate (UTF-8 cannot encode one): skip the walk without.
    if b"\\u" in raw and not no_surrogates(body):
        raise InvalidInput("the body holds a lone UTF-16 surrogate (an unpaired "
                           "\\ud800-\\udfff escape): strings must be valid Unicode")
    return body
