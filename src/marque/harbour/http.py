"""The Harbourmaster's HTTP service (DESIGN §10, §11): its synchronous core, in worker threads.

A route reads the bearer token and the body, calls the
:class:`~marque.harbour.service.Harbourmaster` every other caller uses, and
answers its dict as JSON or its error as a problem document
(:func:`marque.httpcommon.problem`). Who may do what is decided by the core,
never here, so the HTTP API and any other caller obey the same rules; the one
exception is ``/metrics``, which the core does not serve. A route only checks
that a body is a JSON object and that the members it reads have their types.

The core blocks (on the store, and on a Pilot while a preview runs), so each
call runs in a worker thread; the event loop only parses and writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from marque.errors import Forbidden, InvalidInput, MarqueError, Unauthenticated
from marque.harbour.console import Console
from marque.harbour.console.sessions import SESSION_SECONDS
from marque.harbour.figures import StoreFigures
from marque.harbour.notifications.figures import NotificationMetrics
from marque.harbour.principals import Principal, Role
from marque.harbour.views import REQUESTS_PAGE, REQUESTS_PAGE_MAX
from marque.httpcommon import (
    BodyLimit,
    TraceIdMiddleware,
    WorkerThreads,
    api_http_errors,
    bearer_token,
    json_body,
    problem,
)

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["HarbourService"]

#: Core calls run here, never on the event loop. A submit may wait on a Pilot's preview.
WORKER_THREADS = 32
#: ``GET /v1/logbook``'s page size: the default, and the most one page holds.
LOGBOOK_PAGE = 100
LOGBOOK_PAGE_MAX = 1000
#: The longest request body each part accepts (bytes), larger ones are ``payload_too_large``:
#: a Pilot's batch of reports (up to 100, each possibly with an Effect Set's row states),
#: any other API call (a request's change, an Effect Set's inputs included), and everything
#: else — the console's forms, whose longest field is a reason of 4096 characters.
REPORTS_BODY_BYTES = 16 * 1024 * 1024
API_BODY_BYTES = 4 * 1024 * 1024
FORM_BODY_BYTES = 64 * 1024
#: The largest sequence number or count a query parameter may name (a signed 64-bit integer,
#: what both stores' columns hold).
QUERY_INT_MAX = 2**63 - 1
#: Who may scrape ``/metrics`` (DESIGN §11.7): the roles that may read everything.
_METRICS_ROLES = (Role.AUDITOR, Role.ADMIN)


def body_limit(path: str) -> int:
    """The longest body (bytes) ``path`` accepts (see :data:`API_BODY_BYTES`)."""
    if path == "/v1/reports":
        return REPORTS_BODY_BYTES
    if path.startswith("/v1/"):
        return API_BODY_BYTES
    return FORM_BODY_BYTES


async def _json_object(request: Request, shape: str, *, optional: bool = False
                       ) -> dict[str, Any]:
    """The body as a JSON object; anything else is ``input_invalid`` naming ``shape``."""
    raw = await request.body()
    if optional and not raw.strip():
        return {}
    body = json_body(raw, shape)
    if not isinstance(body, dict):
        raise InvalidInput(f"the body must be a JSON object {shape}")
    return body


def _reason(body: dict[str, Any], *, required: bool) -> str | None:
    reason = body.get("reason")
    if reason is None and not required:
        return None
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("`reason` must be a non-empty string"
                           + (" (it is required here)" if required else ""))
    return reason


def _int_param(request: Request, name: str, default: int, minimum: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise InvalidInput(f"`{name}` must be an integer, got {value[:40]!r}") from None
    if not minimum <= number <= QUERY_INT_MAX:
        raise InvalidInput(f"`{name}` must be an integer from {minimum} to {QUERY_INT_MAX}",
                           detail={"parameter": name})
    return number


class HarbourService:
    """The ASGI app of one Harbourmaster process, plus the threads and metrics it owns."""

    def __init__(self, harbourmaster: Harbourmaster, *,
                 console_session_seconds: float = SESSION_SECONDS) -> None:
        self.harbourmaster = harbourmaster
        self._threads = WorkerThreads(WORKER_THREADS, "marque-harbour")
        self.registry = CollectorRegistry()
        self.reports_ingested = Counter(
            "marque_harbour_reports_ingested", "Execution reports newly stored by this process",
            registry=self.registry)
        info = Info("marque_harbour", "This Harbourmaster's identity", registry=self.registry)
        info.info({"harbour_id": harbourmaster.store.harbour_id})
        self.registry.register(StoreFigures(harbourmaster.store))
        # Webhook deliveries (docs/notifications.md): the delivery thread counts its attempts.
        self.notifications = NotificationMetrics(self.registry, harbourmaster.store)
        # The web console (DESIGN §12): its pages at `/`, over the same core, in the same threads.
        self.console = Console(harbourmaster, self._in_thread,
                               session_seconds=console_session_seconds)
        self.app = Starlette(
            routes=[
                Route("/v1/requests", self.post_request, methods=["POST"]),
                Route("/v1/requests", self.list_requests, methods=["GET"]),
                Route("/v1/requests/{id}", self.get_request, methods=["GET"]),
                Route("/v1/requests/{id}/approve", self.approve, methods=["POST"]),
                Route("/v1/requests/{id}/reject", self.reject, methods=["POST"]),
                Route("/v1/requests/{id}/expire", self.expire, methods=["POST"]),
                Route("/v1/requests/{id}/undo", self.undo, methods=["POST"]),
                Route("/v1/requests/{id}/marque", self.marque, methods=["GET"]),
                Route("/v1/requests/{id}/logbook", self.request_logbook, methods=["GET"]),
                Route("/v1/pilots", self.register_pilot, methods=["POST"]),
                Route("/v1/pilots", self.list_pilots, methods=["GET"]),
                Route("/v1/reports", self.post_reports, methods=["POST"]),
                Route("/v1/logbook", self.logbook, methods=["GET"]),
                Route("/v1/logbook/head", self.logbook_head, methods=["GET"]),
                Route("/.well-known/jwks.json", self.jwks, methods=["GET"]),
                Route("/v1/whoami", self.whoami, methods=["GET"]),
                Route("/v1/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                *self.console.oidc.api_routes,
                *self.console.routes,
            ],
            middleware=[Middleware(TraceIdMiddleware), Middleware(BodyLimit,
                                                                     limit_of=body_limit)],
            exception_handlers={
                MarqueError: self._on_error,
                HTTPException: api_http_errors("/v1/", "/.well-known/", "/metrics")},
        )

    def close(self) -> None:
        """Let calls in progress finish, then release the threads and the identity
        provider's kept HTTP clients."""
        self._threads.close()
        self.console.oidc.providers.close()

    # -- plumbing --------------------------------------------------------------------

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MarqueError)
        response = problem(exc, getattr(request.state, "trace_id", None))
        if isinstance(exc, Unauthenticated):
            response.headers["WWW-Authenticate"] = 'Bearer realm="marque-harbour"'
        return response

    async def _in_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        # A fault of ours is logged there and answered `internal`, without its text.
        return await self._threads.call(func, *args)

    async def _principal(self, request: Request) -> Principal:
        token = bearer_token(request)
        principal: Principal = await self._in_thread(self.harbourmaster.authenticate, token)
        return principal

    # -- requests --------------------------------------------------------------------

    async def post_request(self, request: Request) -> Response:
        """``POST /v1/requests``: 201 a new request, 200 the same intent again."""
        principal = await self._principal(request)
        # The raw field: the core parses it (an RFC 8941 string) with the body's request_id.
        key = request.headers.get("idempotency-key")
        body = await _json_object(request, "{request_id?, pilot_id, target, change, budget, "
                                           "ttl_seconds, reason?, rolls_back?}")
        found, created = await self._in_thread(self.harbourmaster.submit, principal, body, key)
        return JSONResponse(found, status_code=201 if created else 200)

    async def list_requests(self, request: Request) -> Response:
        """``GET /v1/requests[?state=S&limit=N&cursor=C]``: ``{requests, next}``, newest
        first, a page at a time; a requester sees only their own."""
        principal = await self._principal(request)
        state = request.query_params.get("state") or None
        # More than a page's worth is answered with a full page: next continues.
        limit = min(_int_param(request, "limit", REQUESTS_PAGE, 1), REQUESTS_PAGE_MAX)
        cursor = request.query_params.get("cursor") or None
        found = await self._in_thread(
            lambda: self.harbourmaster.requests_page(principal, state, limit=limit,
                                                     cursor=cursor))
        return JSONResponse(found)

    async def get_request(self, request: Request) -> Response:
        """``GET /v1/requests/{id}`` (a ``rq_`` id, or the caller's own request id)."""
        principal = await self._principal(request)
        found = await self._in_thread(self.harbourmaster.get_request, principal,
                                      request.path_params["id"])
        return JSONResponse(found)

    async def approve(self, request: Request) -> Response:
        """``POST /v1/requests/{id}/approve {reason?}``."""
        principal = await self._principal(request)
        reason = _reason(await _json_object(request, "{reason?}", optional=True),
                         required=False)
        found = await self._in_thread(self.harbourmaster.approve, principal,
                                      request.path_params["id"], reason)
        return JSONResponse(found)

    async def reject(self, request: Request) -> Response:
        """``POST /v1/requests/{id}/reject {reason}``."""
        principal = await self._principal(request)
        reason = _reason(await _json_object(request, "{reason}"), required=True)
        found = await self._in_thread(self.harbourmaster.reject, principal,
                                      request.path_params["id"], reason)
        return JSONResponse(found)

    async def undo(self, request: Request) -> Response:
        """``POST /v1/requests/{id}/undo {reason?, request_id?, mode?}``: 201 the new
        compensating request (derived from the original's sealed row images), 200 the same
        undo again; ``mode`` ``all_or_nothing`` (the default) or ``per_row``."""
        principal = await self._principal(request)
        body = await _json_object(request, "{reason?, request_id?, mode?}", optional=True)
        unknown = sorted(str(k) for k in body if k not in ("reason", "request_id", "mode"))
        if unknown:
            raise InvalidInput(f"the body has unknown member(s) {', '.join(unknown)}")
        reason = _reason(body, required=False)
        request_id = body.get("request_id")
        if request_id is not None and not isinstance(request_id, str):
            raise InvalidInput("`request_id` must be a string")
        mode = body.get("mode", "all_or_nothing")
        if mode not in ("all_or_nothing", "per_row"):
            raise InvalidInput("`mode` must be all_or_nothing or per_row")
        found, created = await self._in_thread(
            lambda: self.harbourmaster.undo(principal, request.path_params["id"],
                                            reason=reason, request_id=request_id,
                                            per_row=mode == "per_row"))
        return JSONResponse(found, status_code=201 if created else 200)

    async def expire(self, request: Request) -> Response:
        """``POST /v1/requests/{id}/expire {reason}`` (admin)."""
        principal = await self._principal(request)
        reason = _reason(await _json_object(request, "{reason}"), required=True)
        found = await self._in_thread(self.harbourmaster.expire, principal,
                                      request.path_params["id"], reason)
        return JSONResponse(found)

    async def marque(self, request: Request) -> Response:
        """``GET /v1/requests/{id}/marque``: the marque, for the requester who owns it."""
        principal = await self._principal(request)
        found = await self._in_thread(self.harbourmaster.marque_for, principal,
                                      request.path_params["id"])
        return JSONResponse(found)

    async def request_logbook(self, request: Request) -> Response:
        """``GET /v1/requests/{id}/logbook?after=SEQ&limit=N``: a page of the request's own
        logbook entries, ``{id, entries, next_after}``."""
        principal = await self._principal(request)
        after = _int_param(request, "after", 0, 0)
        limit = min(_int_param(request, "limit", LOGBOOK_PAGE_MAX, 1), LOGBOOK_PAGE_MAX)
        found = await self._in_thread(self.harbourmaster.request_logbook, principal,
                                      request.path_params["id"], after, limit)
        return JSONResponse(found)

    # -- pilots and reports ----------------------------------------------------------

    async def register_pilot(self, request: Request) -> Response:
        """``POST /v1/pilots {pilot_id, url, incarnation, targets}``."""
        principal = await self._principal(request)
        body = await _json_object(request, "{pilot_id, url, incarnation, targets}")
        found = await self._in_thread(self.harbourmaster.register_pilot, principal, body)
        return JSONResponse(found)

    async def list_pilots(self, request: Request) -> Response:
        """``GET /v1/pilots``."""
        principal = await self._principal(request)
        found = await self._in_thread(self.harbourmaster.list_pilots, principal)
        return JSONResponse({"pilots": found})

    async def post_reports(self, request: Request) -> Response:
        """``POST /v1/reports {pilot_id, reports}``: idempotent; ``{acknowledged, new}``."""
        principal = await self._principal(request)
        body = await _json_object(request, "{pilot_id, reports: [...]}")
        found = await self._in_thread(self.harbourmaster.ingest_reports, principal, body)
        new = found.get("new") if isinstance(found, dict) else None
        if isinstance(new, int) and new > 0:
            self.reports_ingested.inc(new)
        return JSONResponse(found)

    # -- logbook, keys, health, metrics ----------------------------------------------

    async def logbook(self, request: Request) -> Response:
        """``GET /v1/logbook?after=SEQ&limit=N&kind=PREFIX``: ``{entries, next_after}``."""
        principal = await self._principal(request)
        after = _int_param(request, "after", 0, 0)
        # More than a page's worth is answered with a full page: next_after continues.
        limit = min(_int_param(request, "limit", LOGBOOK_PAGE, 1), LOGBOOK_PAGE_MAX)
        kind = request.query_params.get("kind", "")
        found = await self._in_thread(self.harbourmaster.logbook, principal, after, limit, kind)
        return JSONResponse(found)

    async def logbook_head(self, request: Request) -> Response:
        """``GET /v1/logbook/head``: ``{seq, hash, at, signed}``."""
        principal = await self._principal(request)
        found = await self._in_thread(self.harbourmaster.logbook_head, principal)
        return JSONResponse(found)

    async def jwks(self, request: Request) -> Response:
        """``GET /.well-known/jwks.json``: the issuer's public keys, to anyone."""
        found = await self._in_thread(self.harbourmaster.jwks)
        return JSONResponse(found)

    async def whoami(self, request: Request) -> Response:
        """``GET /v1/whoami``: whom the bearer token authenticates (any role)."""
        principal = await self._principal(request)
        return JSONResponse(self.harbourmaster.whoami(principal))

    async def health(self, request: Request) -> Response:
        """``GET /v1/health``: ``{harbour_id, store}``, 503 when the store cannot be read."""
        try:
            found: dict[str, Any] = await self._in_thread(self.harbourmaster.health)
        except MarqueError:
            found = {"harbour_id": self.harbourmaster.store.harbour_id,
                     "store": "unavailable"}
        return JSONResponse(found, status_code=200 if found.get("store") == "ok" else 503)

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics`` in Prometheus text format (auditor, admin)."""
        principal = await self._principal(request)
        if not any(principal.has(role) for role in _METRICS_ROLES):
            raise Forbidden("metrics are for an auditor or an admin")
        text = await self._in_thread(generate_latest, self.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)
