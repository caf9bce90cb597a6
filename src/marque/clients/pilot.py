"""The Pilot service's HTTP client (httpx): what ``exec --pilot URL`` and a Harbourmaster use.

An execution posted to a Pilot service runs there to its end whatever happens
to the connection, so a client that loses the stream never posts a second
execution: it *follows* the same nonce (``GET …?follow=true``) until it has the
outcome, and only when the Pilot says it never claimed that nonce (the post
never arrived) does it post again — under the same nonce, which is safe.

A problem document becomes its typed error by the rule of
:mod:`marque.clients.problems`. An answer that is not one (not the Pilot speaking
its API): to a read (health, preview, evidence) it is ``pilot_unavailable`` — nothing
ran; to an execution it is the base :class:`~marque.errors.MarqueError` naming the
HTTP status, which claims nothing about whether the execution ran (exit 1).

:class:`PilotQueries` is the part a Harbourmaster asks (a preview, a marque's
evidence, then ``close``): what its core is typed against, so its unit tests can
hand it an in-process Pilot instead of a service (``tests/support/pilot_client.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.request import getproxies

import httpx

from marque.clients.problems import error_of, problem_error
from marque.errors import MarqueError, PilotLost, PilotUnavailable
from marque.outcome import Outcome

__all__ = ["PilotClient", "PilotQueries"]

EventSink = Callable[[dict[str, Any]], None]
#: How long a client keeps trying to get back to an execution after losing it.
RECONNECT_SECONDS = 30.0
_BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)


def _execution_error(response: httpx.Response) -> MarqueError:
    """An execution's error answer: its problem's typed error; for an answer that is not a
    problem document, an error that says what came back and claims nothing."""
    error = problem_error(response)
    if error is not None:
        return error
    return MarqueError(f"{response.request.url} answered HTTP {response.status_code} without "
                       f"a problem document: {response.text[:500]!r}",
                       detail={"status": response.status_code})


class PilotQueries(Protocol):
    """What a Harbourmaster asks a Pilot (DESIGN §10), each ask with a token it issued;
    :class:`PilotClient` is one. Refusals raise their typed error, an unreachable Pilot
    ``PilotUnavailable``."""

    def preview(self, preview_token: str) -> dict[str, Any]:
        """The preview object for a preview token."""
        ...

    def evidence(self, marque_id: str, query_token: str) -> dict[str, Any]:
        """The Pilot's evidence for ``marque_id``, read with a query token."""
        ...

    def close(self) -> None:
        """Release what the asks held."""
        ...


class _Lost(Exception):
    """The stream broke before its outcome line."""


class PilotClient:
    """A Pilot service at ``url``."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        # Executions go straight to the client's transport (its pool, the same keep-alive
        # connection): Client.send's auth flow, redirect loop, event hooks and cookie
        # jar cost client CPU on every request and do nothing here (no auth, no
        # cookies, redirects are not followed anyway). With a proxy in the environment
        # the client keeps its own transports (one passed in would replace its proxy
        # mounts) and executions go through Client.send.
        proxied = any(scheme != "no" for scheme in getproxies())
        self._direct = None if proxied else httpx.HTTPTransport()  # httpx.Client()'s own
        # Reads wait as long as an execution takes: the stream ends with its outcome.
        self._http = httpx.Client(base_url=self.url, transport=self._direct,
                                  timeout=httpx.Timeout(timeout, read=None))
        # An execution's request is built from parts made once: httpx's per-request URL
        # merging and header building cost more client CPU than the request itself.
        self._executions = httpx.URL(self.url + "/v1/executions")
        self._executions_quiet = httpx.URL(self.url + "/v1/executions?events=false")
        self._post_headers = [(b"Host", self._executions.netloc),
                              (b"Content-Type", b"application/json"),
                              (b"Accept", b"application/x-ndjson"),
                              (b"User-Agent", b"marque")]
        self._stream_timeout = {"timeout": httpx.Timeout(timeout, read=None).as_dict()}

    def close(self) -> None:
        """Release the connection pool."""
        self._http.close()

    def health(self) -> dict[str, Any]:
        """``GET /v1/health``; ``PilotUnavailable`` if the service cannot be reached."""
        try:
            response = self._http.get("/v1/health", timeout=self._timeout)
        except httpx.TransportError as exc:
            raise PilotUnavailable(f"the Pilot at {self.url} cannot be reached ({exc}); "
                                   "nothing was sent: retrying the same nonce is safe") from exc
        if response.status_code >= 400 and (error := problem_error(response)) is not None:
            raise error
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "pilot_id" not in body:
            raise PilotUnavailable(f"{self.url} does not answer like a Pilot service")
        return body

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request answered by a JSON object; problems raise their typed error."""
        try:
            response = self._http.request(method, path, timeout=self._timeout, **kwargs)
        except httpx.TransportError as exc:
            raise PilotUnavailable(f"the Pilot at {self.url} cannot be reached ({exc})") from exc
        if response.status_code >= 400:
            if (error := problem_error(response)) is not None:
                raise error
            raise PilotUnavailable(f"the Pilot at {self.url} answered {response.status_code} "
                                   "without a problem document")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise PilotUnavailable(f"{self.url} does not answer like a Pilot service")
        return body

    def preview(self, preview_token: str) -> dict[str, Any]:
        """``POST /v1/previews``: the preview object for a preview token (DESIGN §10).

        Refusals raise their error (``preview_failed``, ``wrong_incarnation``, …);
        ``PilotUnavailable`` if the Pilot cannot be reached. Nothing is claimed.
        """
        return self._json("POST", "/v1/previews", json={"preview": preview_token})

    def evidence(self, marque_id: str, query_token: str) -> dict[str, Any]:
        """``GET /v1/marques/{marque_id}`` with a query token: the Pilot's evidence.

        ``{marque_id, pilot, budget, claims, stamps, target_reachable}``;
        refusals raise their error, ``PilotUnavailable`` if unreachable.
        """
        from urllib.parse import quote

        return self._json("GET", f"/v1/marques/{quote(marque_id, safe='')}",
                          headers={"Authorization": f"Bearer {query_token}"})

    def execute(self, marque: str, nonce: str, prove: Callable[[], str],
                on_event: EventSink | None = None) -> Outcome:
        """Post an execution and stream its events to its outcome.

        ``prove()`` makes a fresh proof of possession (each post needs its own).
        Without ``on_event`` the Pilot is asked for the outcome only (``?events=false``).
        Refusals raise their error. A broken stream is followed again, never
        re-executed; a re-post happens only for a nonce the Pilot never claimed.
        """
        sink = on_event or (lambda event: None)
        try:
            return self._post(marque, nonce, prove(), sink, events=on_event is not None)
        except _Lost as lost:
            return self._recover(marque, nonce, prove, sink, str(lost))

    def _post(self, marque: str, nonce: str, proof: str, sink: EventSink,
              hello: dict[str, Any] | None = None, *, events: bool = True) -> Outcome:
        body = json.dumps({"marque": marque, "nonce": nonce, "proof": proof}).encode("utf-8")
        # Without a sink the events are not wanted: the Pilot sends the outcome line only.
        url = self._executions if events else self._executions_quiet
        # stream=: the headers are all given (Host and Content-Length too), not derived.
        request = httpx.Request(
            "POST", url, stream=httpx.ByteStream(body),
            headers=[*self._post_headers, (b"Content-Length", b"%d" % len(body))],
            extensions=self._stream_timeout)
        try:
            if self._direct is not None:
                response = self._direct.handle_request(request)
            else:
                response = self._http.send(request, stream=True)
            try:
                if response.status_code != 200:
                    response.read()
                    raise _execution_error(response)
                if hello is not None:
                    sink(hello)
                return self._read(response, sink)
            finally:
                response.close()
        except httpx.ConnectError as exc:
            # Not connected: the request never left, so nothing can have been claimed.
            raise PilotUnavailable(
                f"the Pilot at {self.url} cannot be reached ({exc}); nothing was sent: "
                "retrying the same nonce is safe") from exc
        except httpx.TransportError as exc:
            raise _Lost(f"{type(exc).__name__}: {exc}") from exc

    def _follow(self, marque_id: str, nonce: str, sink: EventSink,
                hello: dict[str, Any]) -> Outcome | None:
        """The outcome by following; None if the Pilot never claimed the nonce."""
        try:
            with self._http.stream("GET", f"/v1/executions/{marque_id}/{nonce}",
                                   params={"follow": "true"}) as response:
                if response.status_code == 404:
                    response.read()
                    error = _execution_error(response)
                    if error.code == "not_found":
                        return None
                    raise error
                if response.status_code != 200:
                    response.read()
                    raise _execution_error(response)
                sink(hello)
                return self._read(response, sink)
        except httpx.TransportError as exc:
            raise _Lost(f"{type(exc).__name__}: {exc}") from exc

    def _recover(self, marque: str, nonce: str, prove: Callable[[], str], sink: EventSink,
                 why: str) -> Outcome:
        from marque.token import unverified_claims

        marque_id = str((unverified_claims(marque) or {}).get("jti", ""))
        deadline = time.monotonic() + RECONNECT_SECONDS
        tries = 0
        while True:
            # Said once the Pilot answers again, before what it then streams.
            hello = {"event": "reconnected", "marque_id": marque_id, "nonce": nonce,
                     "after": why, "try": tries + 1}
            try:
                outcome = self._follow(marque_id, nonce, sink, hello)
                if outcome is None:  # the post never got as far as a claim: post again
                    hello["reposted"] = True
                    outcome = self._post(marque, nonce, prove(), sink, hello)
                return outcome
            except (_Lost, PilotUnavailable) as exc:
                why = str(exc)
            if time.monotonic() > deadline:
                raise PilotLost(
                    f"lost the Pilot at {self.url} mid-execution and could not get back to it "
                    f"within {RECONNECT_SECONDS:.0f} s ({why}). The execution may have run: "
                    f"ask again with the SAME nonce ({nonce}), never a new one")
            time.sleep(_BACKOFF[min(tries, len(_BACKOFF) - 1)])
            tries += 1

    @classmethod
    def _read(cls, response: httpx.Response, sink: EventSink) -> Outcome:
        """The stream's events to ``sink``, to its outcome (or error) line; the rest of the
        body is read too, so the connection goes back to the pool for the next request
        (a response closed half-read takes its connection with it)."""
        chunks = response.iter_raw()
        pending = b""
        for chunk in chunks:
            pending += chunk
            if b"\n" not in pending:
                continue
            *lines, pending = pending.split(b"\n")
            for line in lines:
                end = cls._line(line, sink)
                if end is not None:
                    with contextlib.suppress(httpx.TransportError):  # the answer is in
                        for _ in chunks:  # the stream ends right behind its last line
                            pass
                    return end
        end = cls._line(pending, sink)  # a last line without its newline
        if end is not None:
            return end
        raise _Lost("the stream ended before its outcome")

    @staticmethod
    def _line(line: bytes, sink: EventSink) -> Outcome | None:
        """One NDJSON line: an event for ``sink``; the outcome it ends with; or its error."""
        if not line.strip():
            return None
        try:
            event = json.loads(line)
        except ValueError as exc:  # a line cut in half by a broken connection
            raise _Lost(f"a garbled event line ({line[:80]!r})") from exc
        if not isinstance(event, dict):
            raise _Lost(f"an event line that is not an object ({line[:80]!r})")
        if event.get("event") == "outcome":
            return Outcome.from_dict(event["outcome"])
        if event.get("event") == "error":
            error = event.get("error") or {}
            raise error_of(error.get("code"), str(error.get("message", "")),
                           error.get("sqlstate"))
        sink(event)
        return None
