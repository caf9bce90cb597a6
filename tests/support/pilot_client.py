"""An in-process Pilot for the Harbourmaster core's tests: :class:`PilotQueries` without HTTP.

The Harbourmaster asks a Pilot only for a preview and for a marque's evidence
(:class:`marque.clients.pilot.PilotQueries`). :class:`InProcessPilot` answers
those asks from a REAL Pilot — :func:`marque.pilot.open_pilot` over a Pilot
home, its ledger and targets real SQLite files — by calling the very core
functions ``pilot/http.py``'s routes call (:func:`~marque.pilot.preview.run_preview`,
:func:`~marque.pilot.evidence.marque_evidence`), through the same
:func:`~marque.httpcommon.core_call`. Tokens are the Harbourmaster's own, verified
by the Pilot (signature, trusted key, window, pilot id, incarnation, unseen ``jti``).

What crosses is what would cross HTTP, and nothing else: an answer is the JSON
the route would send (:class:`~starlette.responses.JSONResponse`'s bytes, read back),
and an error is the problem document the service would answer
(:func:`~marque.httpcommon.problem`) read back by the client's one rule
(:func:`~marque.clients.problems.problem_error`) — so a refusal reaches the
Harbourmaster as the same typed :class:`~marque.errors.MarqueError`, with the same
detail, as from :class:`~marque.clients.pilot.PilotClient`.

The one thing it can do that a served Pilot cannot be told to: be unreachable
(:meth:`InProcessPilot.unreachable`), raising ``pilot_unavailable`` as the client
does when nothing answers at the URL — as it also does for any URL but its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from starlette.responses import JSONResponse

from marque.clients.problems import problem_error
from marque.errors import MarqueError, PilotUnavailable, Unauthenticated
from marque.httpcommon import core_call, problem
from marque.pilot import Pilot, PilotHome, open_pilot
from marque.pilot.evidence import marque_evidence
from marque.pilot.preview import run_preview

__all__ = ["InProcessPilot", "InProcessPilotClient"]


def _as_answered(exc: MarqueError) -> MarqueError:
    """``exc`` as the Pilot's client would raise it: its problem document, read back."""
    answer = problem(exc)
    error = problem_error(httpx.Response(answer.status_code, content=bytes(answer.body),
                                         headers={"content-type": answer.media_type or ""}))
    assert error is not None, "a Marque error's problem document is always one"
    return error


class InProcessPilot:
    """A real Pilot (``open_pilot`` over its home), asked in process at ``url``.

    Give :meth:`client` to the Harbourmaster as its ``pilot_client_factory``. ``asks``
    lists every ask that reached the Pilot (``"preview"``, ``"evidence"``), in order;
    ``clients_open`` counts clients made and not yet closed; ``previews`` is
    ``pilot.json``'s preview modes, which ``pilot serve`` hands its service.
    """

    def __init__(self, pilot: Pilot, url: str, *,
                 previews: dict[str, str] | None = None) -> None:
        self.pilot = pilot
        self.url = url.rstrip("/")
        self.previews = dict(previews or {})
        self.reachable = True
        self.asks: list[str] = []
        self.clients_open = 0

    @classmethod
    def open(cls, home: str | os.PathLike[str], url: str) -> InProcessPilot:
        """The Pilot of ``home`` (recovered, as ``pilot serve`` opens it), with its
        ``pilot.json`` preview modes, answering at ``url``."""
        previews = PilotHome(home).load().previews
        return cls(open_pilot(home), url, previews=previews)

    def close(self) -> None:
        """Close the Pilot (its ledger and targets)."""
        self.pilot.close()

    def client(self, url: str) -> InProcessPilotClient:
        """A client for the Pilot at ``url`` (the Harbourmaster's ``pilot_client_factory``)."""
        self.clients_open += 1
        return InProcessPilotClient(self, url)

    @contextmanager
    def unreachable(self) -> Iterator[None]:
        """Within the block, every ask is ``pilot_unavailable`` and reaches nothing."""
        self.reachable = False
        try:
            yield
        finally:
            self.reachable = True

    def answer(self, client_url: str, what: str, call: Callable[[], dict[str, Any]]
               ) -> dict[str, Any]:
        """``call()``'s answer as the route would send it, asked by a client for
        ``client_url``; its error as the client would raise it."""
        if not self.reachable or client_url.rstrip("/") != self.url:
            raise PilotUnavailable(f"the Pilot at {client_url} cannot be reached (nothing "
                                   "answers there in this test)")
        self.asks.append(what)
        try:
            answer = core_call(call)
        except MarqueError as exc:
            raise _as_answered(exc) from exc
        body = json.loads(bytes(JSONResponse(answer).body))
        assert isinstance(body, dict)
        return body


class InProcessPilotClient:
    """What :class:`~marque.clients.pilot.PilotClient` is to a served Pilot, for an
    :class:`InProcessPilot`; it satisfies
    :class:`~marque.clients.pilot.PilotQueries`."""

    def __init__(self, pilot: InProcessPilot, url: str) -> None:
        self._pilot = pilot
        self.url = url
        self.closed = False

    def preview(self, preview_token: str) -> dict[str, Any]:
        """``POST /v1/previews``'s answer: the preview object for ``preview_token``."""
        self._open()
        pilot = self._pilot
        return pilot.answer(self.url, "preview", lambda: run_preview(
            pilot.pilot, preview_token, modes=pilot.previews))

    def evidence(self, marque_id: str, query_token: str) -> dict[str, Any]:
        """``GET /v1/marques/{marque_id}``'s answer: the evidence, read with ``query_token``."""
        self._open()
        token = query_token.strip()
        if not token:  # what the route answers before it reaches the core
            raise _as_answered(Unauthenticated(
                "send `Authorization: Bearer <query token>` (a marque-query+jwt from a "
                "trusted issuer)"))
        pilot = self._pilot
        return pilot.answer(self.url, "evidence",
                            lambda: marque_evidence(pilot.pilot, token, marque_id))

    def close(self) -> None:
        """Done with this client (a second close is harmless, as httpx's is)."""
        if not self.closed:
            self.closed = True
            self._pilot.clients_open -= 1

    def _open(self) -> None:
        if self.closed:  # httpx refuses a closed client too
            raise RuntimeError("this Pilot client has been closed")

