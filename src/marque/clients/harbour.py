"""The Harbourmaster's HTTP client (httpx): what the control-plane CLI and a Pilot use.

One method per endpoint of the Harbourmaster's API (DESIGN §10–§11, the
service contract in docs/harbour.md). Two rules make callers simple:

* A problem document comes back as the typed :class:`~marque.errors.MarqueError`
  its ``code`` names, by the rule of :mod:`marque.clients.problems` (the one
  both clients follow): the server's ``detail`` as its message, its extension
  members (``id`` of a request stored as failed…) in its ``detail`` dict — so
  ``self_approval`` is a :class:`~marque.errors.SelfApproval` here exactly as in
  the core.
* Anything that keeps an answer from arriving — refused connection, timeout,
  a connection dropped mid-answer, an answer that is not the API's — is
  :class:`~marque.errors.HarbourUnavailable`. Its ``detail["sent"]`` says
  whether the request may have reached the server (false only when the
  connection was never made), so a caller knows a retry of a POST must carry
  the same request id — which is always safe: the Harbourmaster answers a
  retried intent with the request it already holds.

The bearer token is a secret and never appears in anything this client says:
surrounding whitespace is stripped (as the server strips it), a token with a
space or control character inside is refused as ``input_invalid`` before
anything is sent, and a transport error's text has the token masked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from marque.clients.problems import problem_error
from marque.errors import HarbourUnavailable, InvalidInput, MarqueError
from marque.request_ids import check_request_id, format_idempotency_key

__all__ = ["HarbourClient", "check_token", "error_from_problem"]


def error_from_problem(response: httpx.Response) -> MarqueError:
    """The typed Marque error an error answer of the Harbourmaster stands for
    (:func:`marque.clients.problems.problem_error`); an answer that is not a problem
    document is :class:`HarbourUnavailable` — whatever answered is not a Harbourmaster
    speaking its API (e.g. a proxy's error page), and it may have got the request.
    """
    error = problem_error(response)
    if error is not None:
        return error
    return HarbourUnavailable(
        f"{response.request.url} answered HTTP {response.status_code} without a problem "
        f"document: {response.text[:200]!r}",
        detail={"status": response.status_code, "sent": True})


def check_token(token: str) -> str:
    """``token`` without surrounding whitespace; ``InvalidInput`` (which never quotes it) for
    an empty token or one holding anything but visible ASCII — a header cannot carry it."""
    stripped = token.strip(" \t\r\n")
    if not stripped:
        raise InvalidInput("the token is empty: give the token `marque harbour principal add` "
                           "printed", detail={"rule": "empty"})
    for index, char in enumerate(stripped):
        if not 0x21 <= ord(char) <= 0x7E:
            raise InvalidInput(
                f"the token holds a space or a control or non-ASCII character (position "
                f"{index}): a token is one word of visible ASCII; check how it was copied",
                detail={"rule": "character", "index": index})
    return stripped


def _segment(value: str) -> str:
    """A request id as one path segment: every reserved character escaped.

    A segment of dots only (``.``, ``..``) is escaped too: left as it is, URL
    normalisation would read it as "this" or "the parent" directory and the
    call would reach another endpoint.
    """
    if value.strip(".") == "":
        return "%2E" * len(value)
    return quote(value, safe="")


class HarbourClient:
    """A Harbourmaster at ``url``, authenticated by ``token`` (a principal's bearer token).

    ``token`` may be None for the two public endpoints (:meth:`health`,
    :meth:`jwks`); any other call without one is answered ``unauthenticated``
    by the server.
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json"}
        self._token = None if token is None else check_token(token)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            raise InvalidInput(f"not a Harbourmaster URL: {url!r} ({exc})") from exc

    @property
    def token(self) -> str | None:
        """The bearer token as it is sent (surrounding whitespace stripped)."""
        return self._token

    def close(self) -> None:
        """Release the connection pool."""
        self._http.close()

    def __enter__(self) -> HarbourClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one place requests are made ------------------------------------------------

    def _call(self, method: str, path: str, *, json: Any = None,
              params: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=json, params=params,
                                          headers=headers)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidInput(f"not a Harbourmaster URL: {self.url!r} ({exc})") from exc
        except httpx.ConnectError as exc:
            raise HarbourUnavailable(
                f"the Harbourmaster at {self.url} cannot be reached ({self._masked(exc)}); "
                "nothing was sent", detail={"sent": False}) from exc
        except httpx.TransportError as exc:
            raise HarbourUnavailable(
                f"lost the Harbourmaster at {self.url} during {method} {path} "
                f"({type(exc).__name__}: {self._masked(exc)}); it may have received the "
                "request", detail={"sent": True}) from exc
        if response.status_code >= 400:
            error = error_from_problem(response)
            if self._token and self._token in error.message:  # e.g. a proxy echoing headers
                error.message = error.message.replace(self._token, "***")
                error.args = (error.message,)
            raise error
        return response

    def _masked(self, exc: Exception) -> str:
        """An exception's text with the token (and so the Authorization value) masked."""
        text = str(exc)
        if self._token:
            text = text.replace(self._token, "***")
        return text

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._call(method, path, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise HarbourUnavailable(
                f"{self.url}{path} answered HTTP {response.status_code} with something that "
                "is not a JSON object: it does not speak the Harbourmaster's API",
                detail={"status": response.status_code, "sent": True})
        return body

    # -- public ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /v1/health`` → ``{harbour_id, store}`` (a 503 raises its problem)."""
        return self._json("GET", "/v1/health")

    def jwks(self) -> dict[str, Any]:
        """``GET /.well-known/jwks.json`` → ``{keys: [issuer public JWK]}``."""
        return self._json("GET", "/.well-known/jwks.json")

    def whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami`` → ``{name, roles, key_thumbprint, harbour_id}``: whom the token
        authenticates (``unauthenticated`` for an unknown, rotated or revoked one)."""
        return self._json("GET", "/v1/whoami")

    # -- requests -----------------------------------------------------------------------

    def submit(self, body: dict[str, Any], request_id: str | None = None
               ) -> tuple[dict[str, Any], bool]:
        """``POST /v1/requests``: (the request object, whether it was created now).

        ``request_id`` travels in ``Idempotency-Key`` when it is printable ASCII
        (else in the body, as ``request_id``); an id already in ``body`` is sent
        as it is. A retry with the same id and intent answers the same request
        (created False), never a second one.
        """
        payload = dict(body)
        headers: dict[str, str] = {}
        if request_id is not None:
            check_request_id(request_id)
            if request_id.isascii() and request_id.isprintable():
                headers["Idempotency-Key"] = format_idempotency_key(request_id)
            else:
                payload.setdefault("request_id", request_id)
        response = self._call("POST", "/v1/requests", json=payload, headers=headers)
        return self._filed(response, "/v1/requests")

    def _filed(self, response: httpx.Response, path: str) -> tuple[dict[str, Any], bool]:
        """A filing's answer: the request object, and whether it is new (201) or the one
        filed before under the same request id (200)."""
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise HarbourUnavailable(
                f"{self.url}{path} answered HTTP {response.status_code} without a request "
                "object", detail={"status": response.status_code, "sent": True})
        return answer, response.status_code == 201

    def requests_page(self, state: str | None = None, *, limit: int | None = None,
                      cursor: str | None = None) -> dict[str, Any]:
        """``GET /v1/requests[?state=S&limit=N&cursor=C]`` → one page, ``{requests, next}``
        (``next`` None on the last page)."""
        params: dict[str, Any] = {}
        if state is not None:
            params["state"] = state
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        found = self._json("GET", "/v1/requests", params=params or None)
        return {"requests": list(found.get("requests", [])), "next": found.get("next")}

    def iter_requests(self, state: str | None = None, *,
                      page: int | None = None) -> Iterator[dict[str, Any]]:
        """The request objects the caller may see, newest first, fetched a page (of
        ``page``, or the Harbourmaster's default size) at a time as they are consumed."""
        cursor: str | None = None
        while True:
            found = self.requests_page(state, limit=page, cursor=cursor)
            yield from found["requests"]
            cursor = found["next"] if isinstance(found["next"], str) else None
            if cursor is None:
                return

    def list_requests(self, state: str | None = None) -> list[dict[str, Any]]:
        """Every request object the caller may see, newest first (every page of
        ``GET /v1/requests[?state=S]``)."""
        return list(self.iter_requests(state))

    def get_request(self, id_or_request_id: str) -> dict[str, Any]:
        """``GET /v1/requests/{id}``: by ``rq_…`` id, or by the caller's own request id."""
        return self._json("GET", f"/v1/requests/{_segment(id_or_request_id)}")

    def approve(self, id_or_request_id: str, reason: str | None = None) -> dict[str, Any]:
        """``POST /v1/requests/{id}/approve`` → the request object after the Resolution."""
        body = {} if reason is None else {"reason": reason}
        return self._json("POST", f"/v1/requests/{_segment(id_or_request_id)}/approve",
                          json=body)

    def reject(self, id_or_request_id: str, reason: str) -> dict[str, Any]:
        """``POST /v1/requests/{id}/reject`` (a reason is required)."""
        return self._json("POST", f"/v1/requests/{_segment(id_or_request_id)}/reject",
                          json={"reason": reason})

    def undo(self, id: str, reason: str | None = None,
             request_id: str | None = None,
             per_row: bool = False) -> tuple[dict[str, Any], bool]:
        """``POST /v1/requests/{id}/undo`` → (the undo's request object, whether it was
        created now); ``per_row`` asks for the per-row undo (``mode: per_row``)."""
        body: dict[str, Any] = {"mode": "per_row"} if per_row else {}
        if reason is not None:
            body["reason"] = reason
        if request_id is not None:
            body["request_id"] = request_id
        response = self._call("POST", f"/v1/requests/{_segment(id)}/undo", json=body)
        return self._filed(response, "/v1/requests/…/undo")

    def expire(self, id_or_request_id: str, reason: str) -> dict[str, Any]:
        """``POST /v1/requests/{id}/expire`` (admin): ADR-038's ``expire_prepared``."""
        return self._json("POST", f"/v1/requests/{_segment(id_or_request_id)}/expire",
                          json={"reason": reason})

    def marque_for(self, id_or_request_id: str) -> dict[str, Any]:
        """``GET /v1/requests/{id}/marque`` → ``{marque, marque_id, expires_at, pilot: {id,
        url, incarnation}, target}`` (the requester who owns it only)."""
        return self._json("GET", f"/v1/requests/{_segment(id_or_request_id)}/marque")

    # -- pilots and reports -------------------------------------------------------------

    def register_pilot(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/pilots`` ``{pilot_id, url, incarnation, targets: {name: {dialect}}}``."""
        return self._json("POST", "/v1/pilots", json=body)

    def list_pilots(self) -> list[dict[str, Any]]:
        """``GET /v1/pilots`` → the registered Pilots."""
        return list(self._json("GET", "/v1/pilots").get("pilots", []))

    def report(self, pilot_id: str, reports: list[dict[str, Any]]) -> dict[str, Any]:
        """``POST /v1/reports`` → ``{acknowledged, new}`` (idempotent per report)."""
        return self._json("POST", "/v1/reports",
                          json={"pilot_id": pilot_id, "reports": reports})

    # -- logbook and metrics ------------------------------------------------------------

    def logbook(self, after: int = 0, limit: int = 100,
                kind: str | None = None) -> dict[str, Any]:
        """``GET /v1/logbook`` → ``{entries: [entry], next_after}``, one page in ``seq``
        order."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if kind:
            params["kind"] = kind
        return self._json("GET", "/v1/logbook", params=params)

    def logbook_head(self) -> dict[str, Any]:
        """``GET /v1/logbook/head`` → ``{seq, hash, at, signed}`` (``signed``: a JWS)."""
        return self._json("GET", "/v1/logbook/head")

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._call("GET", "/metrics").text
