"""The Pilot's HTTP service (DESIGN §10): the same synchronous core, in worker threads.

A route parses, calls the Pilot the CLI calls, and maps errors to RFC 9457
problem documents in one function (:func:`problem`); no rule about executions
lives here. An execution runs in a worker thread from start to finish whatever
happens to the HTTP connection — a caller that goes away can follow the same
execution again (``GET /v1/executions/{marque_id}/{nonce}?follow=true``); it is
never cut short half-way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from marque.crash import crash_point
from marque.errors import InvalidInput, MarqueError, Unauthenticated
from marque.httpcommon import (
    BodyLimit,
    TraceIdMiddleware,
    WorkerThreads,
    api_http_errors,
    core_call,
    internal_error,
    json_body,
    problem,
    trace_id_of,
)
from marque.outcome import Outcome
from marque.pilot.core import Pilot
from marque.token import unverified_claims

NDJSON = "application/x-ndjson"
#: Executions and reads run here, never on the event loop.
WORKER_THREADS = 64
#: The longest request body any endpoint accepts (bytes); a longer one is
#: ``payload_too_large`` before any of it is parsed. A marque's payload is at most a
#: million bytes (a third more in base64url), and a preview token's no larger.
BODY_BYTES = 4 * 1024 * 1024


class _LedgerGauges:
    """Gauges read from the ledger at scrape time (one stats query per scrape)."""

    def __init__(self, pilot: Pilot) -> None:
        self._pilot = pilot

    def collect(self) -> Any:
        try:
            stats = self._pilot.stats()
        except MarqueError:
            return  # the ledger is away: no figures rather than wrong ones
        by_status = stats.get("attempts_by_status", {})
        entries = GaugeMetricFamily("marque_ledger_entries", "Attempts held in the ledger")
        entries.add_metric([], stats.get("attempts", 0))
        yield entries
        unreported = GaugeMetricFamily("marque_unreported_outcomes",
                                       "Outcomes not yet acknowledged by the logbook")
        unreported.add_metric([], stats.get("unreported_outcomes", 0))
        yield unreported
        unsettled = GaugeMetricFamily("marque_unsettled_attempts",
                                      "Attempts in progress or indeterminate", labels=["status"])
        for status in ("in_progress", "indeterminate"):
            unsettled.add_metric([status], by_status.get(status, 0))
        yield unsettled
        size = GaugeMetricFamily("marque_ledger_size_bytes", "The ledger's size on disk")
        size.add_metric([], stats.get("size_bytes", 0))
        yield size


class PilotService:
    """The ASGI app of one Pilot, plus the threads and metrics it owns."""

    def __init__(
        self, pilot: Pilot, *, reachable: Callable[[str], bool] | None = None,
        previews: dict[str, str] | None = None,
    ) -> None:
        self.pilot = pilot
        self._reachable = reachable
        self._previews = dict(previews or {})
        self._threads = WorkerThreads(WORKER_THREADS, "marque-http")
        self.registry = CollectorRegistry()
        self.executions = Counter(
            "marque_executions", "Executions answered, by outcome status and target",
            ["status", "target"], registry=self.registry)
        self.duration = Histogram(
            "marque_execution_seconds", "Time from request to outcome of an execution",
            ["target"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        info = Info("marque_pilot", "This Pilot's identity", registry=self.registry)
        info.info({"pilot_id": pilot.pilot_id, "incarnation": pilot.incarnation})
        self.registry.register(_LedgerGauges(pilot))
        self._routed = Starlette(
            routes=[
                Route("/v1/executions", _Asgi(self.post_execution), methods=["POST"]),
                Route("/v1/executions/{marque_id}/{nonce}", self.get_execution,
                      methods=["GET"]),
                Route("/v1/previews", self.post_preview, methods=["POST"]),
                Route("/v1/marques/{marque_id}", self.get_marque, methods=["GET"]),
                Route("/v1/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ],
            middleware=[Middleware(TraceIdMiddleware)],
            exception_handlers={MarqueError: self._on_error,
                                HTTPException: api_http_errors("/")},
        )
        #: The ASGI app to serve (an instance, so servers see an ASGI 3 app, not a method).
        #: Every body is bounded before anything reads it, the executions' own path included.
        self.app: ASGIApp = BodyLimit(_Asgi(self._front), lambda path: BODY_BYTES)

    async def _front(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/executions`` straight to its handler; everything else through
        Starlette. The one route every execution takes skips the middleware stack, the
        router's regex matching and the Request object (about a tenth of a millisecond
        of the service's CPU per execution); it sets ``X-Request-Id`` and answers its
        problems itself. Other methods on its path still get the router's 405."""
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] == "/v1/executions"):
            await self.post_execution(scope, receive, send)
        else:
            await self._routed(scope, receive, send)

    def close(self) -> None:
        """Wait for running executions to finish, then release the threads."""
        self._threads.close()

    # -- plumbing --------------------------------------------------------------------

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MarqueError)
        return problem(exc)

    async def _in_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        return await self._threads.call(func, *args)

    async def _stream(
        self, work: Callable[[Callable[[dict[str, Any]], None]], Outcome],
        on_outcome: Callable[[Outcome], None] | None = None, trace_id: str | None = None,
    ) -> Response:
        """Run ``work(sink)`` in a worker thread; a problem if it fails before its first
        event, else NDJSON: each event as it happens, then the outcome line.
        ``trace_id`` goes on the answer's header (for a route without the middleware)."""
        feed = _Feed(asyncio.get_running_loop())

        def run() -> None:
            try:
                outcome = core_call(work, lambda event: feed.put("event", event))
            except MarqueError as exc:  # `internal` for a fault of ours, logged
                feed.put("error", exc)
            except BaseException as exc:  # not even an Exception: still said, never hung
                feed.put("error", internal_error(exc, work))
            else:
                feed.put("outcome", outcome)
                if on_outcome is not None:
                    try:
                        on_outcome(outcome)
                    except Exception:  # metrics must never cost an answer
                        pass

        # Not awaited: what the execution says comes through the feed.
        self._threads.start(run)
        first = await feed.take()
        if first[0][0] == "error":
            return problem(first[0][1], trace_id)

        async def chunks() -> AsyncIterator[tuple[bytes, bool]]:
            """Every line already waiting, as one chunk, and whether the stream ends there:
            a fast execution costs a few writes, not one per event."""
            batch, sent = first, False
            while True:
                chunk: list[bytes] = []
                for kind, item in batch:
                    if kind == "event":
                        chunk.append(_line(item))
                        continue
                    if kind == "outcome":
                        crash_point("stream_before_outcome")
                        chunk.append(_line({"event": "outcome", "outcome": item.to_dict()}))
                    else:  # failed after events were sent: the stream says so and ends
                        chunk.append(_line({"event": "error", "error": item.to_dict()}))
                    yield b"".join(chunk), True
                    return
                yield b"".join(chunk), False
                if not sent:
                    sent = True
                    crash_point("stream_after_first_chunk")
                batch = await feed.take()

        return _NdjsonStream(chunks(), trace_id)

    # -- routes ----------------------------------------------------------------------

    async def post_execution(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/executions {marque, nonce, proof}`` (an ASGI app of its own)."""
        trace_id = trace_id_of(scope)
        body = await _body(receive)
        if body is None:
            return  # the caller went away before its request was whole: nothing started
        try:
            response = await self._execution(body, scope["query_string"], trace_id)
        except MarqueError as exc:  # what Starlette's handler did for the routed path
            response = problem(exc, trace_id)
        await response(scope, receive, send)

    async def _execution(self, body: bytes, query: bytes, trace_id: str) -> Response:
        parsed = json_body(body, "{marque, nonce, proof}")
        if not isinstance(parsed, dict):
            return problem(InvalidInput("the body must be a JSON object {marque, nonce, proof}"),
                           trace_id)
        marque, nonce, proof = parsed.get("marque"), parsed.get("nonce"), parsed.get("proof")
        if not isinstance(marque, str) or not isinstance(nonce, str):
            return problem(InvalidInput("`marque` and `nonce` must be strings"), trace_id)
        if proof is not None and not isinstance(proof, str):
            return problem(InvalidInput("`proof` must be a string (a compact JWS)"), trace_id)
        started = time.monotonic()
        target = _target_label(marque)

        def record(outcome: Outcome) -> None:
            self.executions.labels(outcome.status, target).inc()
            if not outcome.replayed:
                self.duration.labels(target).observe(time.monotonic() - started)

        # events=false: the caller wants the outcome only, so the stream is that one line
        # and the execution's events are not sent to this request at all.
        events = _query(query, "events").lower() not in ("false", "0", "no")
        return await self._stream(
            lambda sink: self.pilot.execute(marque, proof, nonce,
                                            on_event=sink if events else None),
            record, trace_id)

    async def get_execution(self, request: Request) -> Response:
        """``GET /v1/executions/{marque_id}/{nonce}[?follow=true]``."""
        marque_id = request.path_params["marque_id"]
        nonce = request.path_params["nonce"]
        if request.query_params.get("follow", "").lower() in ("true", "1", "yes"):
            return await self._stream(
                lambda sink: self.pilot.follow(marque_id, nonce, on_event=sink))
        outcome: Outcome = await self._in_thread(self.pilot.outcome, marque_id, nonce)
        return JSONResponse(outcome.to_dict())

    async def post_preview(self, request: Request) -> Response:
        """``POST /v1/previews {preview}``: run a preview token's change, always rolled back."""
        from marque.pilot.preview import run_preview

        body = json_body(await request.body(), "{preview: <token>}")
        token = body.get("preview") if isinstance(body, dict) else None
        if not isinstance(token, str):
            return problem(InvalidInput("the body must be a JSON object {preview: <token>}"))
        preview = await self._in_thread(
            lambda: run_preview(self.pilot, token, modes=self._previews))
        return JSONResponse(preview)

    async def get_marque(self, request: Request) -> Response:
        """``GET /v1/marques/{marque_id}`` with a query token: the evidence for a marque."""
        from marque.pilot.evidence import marque_evidence

        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return problem(Unauthenticated(
                "send `Authorization: Bearer <query token>` (a marque-query+jwt from a "
                "trusted issuer)"))
        marque_id = request.path_params["marque_id"]
        evidence = await self._in_thread(
            marque_evidence, self.pilot, token.strip(), marque_id)
        return JSONResponse(evidence)

    async def health(self, request: Request) -> Response:
        """``GET /v1/health``: identity, targets' reachability, the ledger's figures."""

        def look() -> dict[str, Any]:
            try:
                stats: dict[str, Any] | None = self.pilot.stats()
            except MarqueError:
                stats = None
            # replaced: the name points at another database than the ledger bound it to.
            targets = {name: {"reachable": self._is_reachable(name),
                              "replaced": name in self.pilot.targets_replaced}
                       for name in self.pilot.targets}
            by_status = (stats or {}).get("attempts_by_status", {})
            return {
                "pilot_id": self.pilot.pilot_id,
                "incarnation": self.pilot.incarnation,
                # Which Pilot process answered: with --workers, one of several.
                "process": self.pilot.processes.process_id,
                "targets": targets,
                "ledger": None if stats is None else {
                    "entries": stats.get("attempts", 0),
                    "unreported": stats.get("unreported_outcomes", 0),
                    "indeterminate": by_status.get("indeterminate", 0),
                    "in_progress": by_status.get("in_progress", 0),
                },
            }

        body = await self._in_thread(look)
        healthy = body["ledger"] is not None
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics`` in Prometheus text format."""
        text = await self._in_thread(generate_latest, self.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def _is_reachable(self, name: str) -> bool:
        if self._reachable is None:
            return True
        try:
            return self._reachable(name)
        except Exception:  # a probe that fails is an unreachable target
            return False


#: Tokens up to this long have their label cached (a marque may carry a megabyte of SQL).
_LABEL_CACHED_CHARS = 16_384


def _target_label(marque: str) -> str:
    """A metrics label only (no I/O, nothing trusted: the execution verifies the marque);
    read once per token, which callers send again and again."""
    if len(marque) > _LABEL_CACHED_CHARS:
        return _read_target(marque)
    return _cached_target(marque)


def _read_target(marque: str) -> str:
    return str((unverified_claims(marque) or {}).get("target", ""))


_cached_target = functools.lru_cache(maxsize=1024)(_read_target)


class _Asgi:
    """An ASGI function as a Starlette route's endpoint (Starlette would call a plain
    function or method as ``request -> response``, a class instance as ASGI)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


async def _body(receive: Receive) -> bytes | None:
    """The request's whole body; None if the client disconnected before sending it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _query(query: bytes, name: str) -> str:
    """A query parameter's value ('' if absent; the last one if repeated), as Starlette's
    ``request.query_params`` reads it."""
    if not query:
        return ""
    return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get(name, "")


_LINE = json.JSONEncoder(sort_keys=True)  # built once: dumps(sort_keys=…) builds one a call


def _line(obj: dict[str, Any]) -> bytes:
    return (_LINE.encode(obj) + "\n").encode("utf-8")


class _Feed:
    """What a worker thread says, for the event loop: the loop is woken once for all the
    items put while it was busy, not once per event (each wake is a write to the loop's
    self-pipe and a turn of the loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        #: A ``_wake`` is scheduled and has not run yet: the items put now will be seen.
        self._wake_pending = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, kind: str, item: Any) -> None:
        """From the worker thread."""
        with self._lock:
            self._items.append((kind, item))
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[tuple[str, Any]]:
        """On the loop: everything put so far (at least one item), in order."""
        while True:
            with self._lock:
                if self._items:
                    items, self._items = self._items, []
                    return items
                self._waiter = self._loop.create_future()
            await self._waiter


class _NdjsonStream(Response):
    """An NDJSON body written chunk by chunk straight to the ASGI ``send``.

    Starlette's ``StreamingResponse`` runs each stream in a task group with a second
    task listening for the client's disconnect, to cancel the stream; an execution runs
    to its end whatever the caller does (it can be followed again), so there is nothing
    to cancel, and the server drops what is sent after a disconnect. The last chunk
    carries the end of the body, so a stream's end costs no write of its own; a stream
    that is whole in its first chunk (the outcome alone, a replay) is sent with a
    ``Content-Length`` instead of chunked framing.
    """

    media_type = NDJSON

    def __init__(self, chunks: AsyncIterator[tuple[bytes, bool]],
                 trace_id: str | None = None) -> None:
        self._chunks = chunks
        self.status_code = 200
        self.background = None
        self.init_headers()
        if trace_id is not None:
            self.raw_headers.append((b"x-request-id", trace_id.encode("latin-1")))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = aiter(self._chunks)
        chunk, last = await anext(chunks)
        headers = self.raw_headers
        if last:
            headers = [*headers, (b"content-length", b"%d" % len(chunk))]
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": headers})
        await send({"type": "http.response.body", "body": chunk, "more_body": not last})
        if last:
            return
        async for chunk, last in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
