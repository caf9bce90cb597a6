"""The agent's tools, synchronous, over the Harbourmaster's and the Pilot's HTTP clients.

:class:`AgentTools` is one agent principal: a Harbourmaster URL and that
agent's token, and the agent's private key (which signs the proofs of
possession its marques need, DESIGN §2). It holds no state of its own between
calls — every answer is read from the Harbourmaster or the Pilot's ledger — so
a restarted server answers exactly as the one before it.

Nothing here decides what an agent may do. It refuses to *start* as anything
but an agent (a human's token would make the agent act, and be logged, as that
human), and everything after that is the Harbourmaster's and the Pilot's to
allow or refuse.

``wait_for_decision`` polls the request with backoff (0.5 s doubling to 5 s)
until it is decided or the timeout passes: the Harbourmaster has no push
channel a stateless HTTP client could hold across its processes (several may
share one store), and a few reads a minute cost nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marque.agents.answers import request_answer
from marque.agents.nonces import execution_nonce
from marque.agents.schemas import (
    LIST_LIMIT_MAX,
    WAIT_SECONDS_DEFAULT,
    check_arguments,
)
from marque.clients.harbour import HarbourClient
from marque.errors import Conflict, InvalidInput, MarqueError, Unauthenticated
from marque.request_ids import new_request_id

__all__ = ["AgentConfig", "AgentTools", "UNDECIDED", "POLL_BACKOFF"]

#: The states in which nobody has decided yet.
UNDECIDED = frozenset({"preparing", "awaiting_approval"})
#: ``wait_for_decision``'s pauses between reads (seconds), the last one repeated.
POLL_BACKOFF = (0.5, 1.0, 2.0, 4.0, 5.0)
#: A query's marque lives this long (it runs at once).
QUERY_TTL_SECONDS = 300
#: A query's reason, as the logbook and the console show it.
QUERY_REASON = "agent query"

_EXECUTE_NEXT = {
    "applied": "Applied. Done (replayed=true means this is the recorded outcome of an "
               "earlier call: it did not run again).",
    "aborted_not_applied": "Nothing changed (see outcome.error). For target_unavailable "
                           "call execute again with the same attempt; otherwise fix the "
                           "cause and ask again with a new request_id.",
    "indeterminate": "Nobody can say yet whether it applied: a human must look. Never "
                     "execute it with a new attempt; execute with the same attempt answers "
                     "once it is settled.",
    "in_progress": "Still running: call execute again with the same attempt to learn its "
                   "outcome.",
}


@dataclass(frozen=True)
class AgentConfig:
    """Who the server is and where it reaches: the agent's token and private key, the
    Harbourmaster, and the defaults a tool call may leave out."""

    harbour_url: str
    token: str
    key: dict[str, Any]
    #: A Pilot URL to execute through instead of the one its registration names.
    pilot_url: str | None = None
    pilot_id: str | None = None
    target: str | None = None


class AgentTools:
    """The six tools of docs/agents.md, each a method taking the call's arguments."""

    def __init__(self, config: AgentConfig, *,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.harbour = HarbourClient(config.harbour_url, config.token)
        self._sleep = sleep
        self._clock = clock

    def close(self) -> None:
        """Release the Harbourmaster client."""
        self.harbour.close()

    def start(self) -> dict[str, Any]:
        """Check, before serving, that the token is an agent's and the key is that agent's:
        ``{name, roles, key_thumbprint, harbour_id}``."""
        from marque.token.keys import thumbprint

        found = self.harbour.whoami()
        if found.get("roles") != ["agent"]:
            raise Unauthenticated(
                f"the token is {found.get('name')!r}'s, with the roles {found.get('roles')}: "
                "marque mcp acts only as a principal of the role agent (marque harbour "
                "principal add NAME --role agent --key PUB), never as a human",
                detail={"name": found.get("name"), "roles": found.get("roles")})
        try:
            mine = thumbprint({k: v for k, v in self.config.key.items() if k != "d"})
        except Exception as exc:  # noqa: BLE001 - any unusable key is a bad --key
            raise InvalidInput(f"--key is not a usable private JWK ({exc})") from exc
        if "d" not in self.config.key:
            raise InvalidInput("--key must be the agent's private JWK (it signs proofs of "
                               "possession); this one has no private part")
        if mine != found.get("key_thumbprint"):
            raise InvalidInput(
                f"--key is not the key registered for agent {found.get('name')!r}: its "
                "marques could not be executed with it",
                detail={"key_thumbprint": mine, "registered": found.get("key_thumbprint")})
        return found

    def call(self, name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """Run tool ``name`` on its (schema-checked) arguments."""
        args = check_arguments(name, arguments)
        method: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self, f"tool_{name}")
        return method(args)

    # -- the tools ----------------------------------------------------------------------

    def tool_query(self, args: dict[str, Any]) -> dict[str, Any]:
        """A read: asked for, routed, and when allowed at once, executed read-only."""
        request_id = args.get("request_id") or new_request_id()
        body = self._body(args, {"statements": [_statement(args)]},
                          budget={"executions": 1, "max_rows": args.get("max_rows", 100)},
                          ttl_seconds=QUERY_TTL_SECONDS, reason=QUERY_REASON)
        request = self._submit(body, request_id)
        access = (request.get("change") or {}).get("access")
        # An allowed read holds its marque at once (a repeat of the same request_id too, whose
        # one nonce is then answered from the ledger); anything else is not run here.
        if request.get("marque") is None or access != "read_only":
            return request_answer(request, rows=None, next_step=(
                "The routing did not allow this as a read at once "
                f"(state {request.get('state')}): " + request_answer(request)["next_step"]))
        ran = self._execute(request, 1)
        outcome = ran["outcome"]
        result = outcome.get("result") or {}
        return {"id": request["id"], "request_id": request["request_id"],
                "status": outcome["status"], "replayed": outcome.get("replayed"),
                "columns": result.get("columns"),
                "rows": result.get("rows"), "row_count": outcome.get("rows_affected"),
                "error": outcome.get("error"), "next_step": ran["next_step"]}

    def tool_request_change(self, args: dict[str, Any]) -> dict[str, Any]:
        """A change asked for; answered at once with its routing, preview and next step."""
        if ("statements" in args) == ("effect_set" in args):
            raise InvalidInput("give exactly one of statements and effect_set")
        change = ({"statements": [_statement(s) for s in args["statements"]]}
                  if "statements" in args else {"effect_set": args["effect_set"]})
        body = self._body(args, change,
                          budget={"executions": args.get("executions", 1),
                                  "max_rows": args["max_rows"]},
                          ttl_seconds=args.get("ttl_seconds", 3600), reason=args["reason"])
        return request_answer(self._submit(body, args["request_id"]))

    def tool_get_request(self, args: dict[str, Any]) -> dict[str, Any]:
        """One of the agent's requests, as it is now."""
        return request_answer(self.harbour.get_request(args["id"]))

    def tool_wait_for_decision(self, args: dict[str, Any]) -> dict[str, Any]:
        """The request once decided, or as it is when the timeout passes (backoff polls)."""
        timeout = args.get("timeout_seconds", WAIT_SECONDS_DEFAULT)
        started = self._clock()
        polls = 0
        while True:
            request = self.harbour.get_request(args["id"])
            waited = self._clock() - started
            decided = request.get("state") not in UNDECIDED
            if decided or waited >= timeout:
                return request_answer(request, decided=decided,
                                      waited_seconds=round(waited, 1))
            pause = POLL_BACKOFF[min(polls, len(POLL_BACKOFF) - 1)]
            self._sleep(min(pause, max(timeout - waited, 0.0)))
            polls += 1

    def tool_execute(self, args: dict[str, Any]) -> dict[str, Any]:
        """The agent's approved change, run once per attempt (a repeat answers from the
        ledger)."""
        request = self.harbour.get_request(args["id"])
        return self._execute(request, args.get("attempt", 1))

    def tool_list_requests(self, args: dict[str, Any]) -> dict[str, Any]:
        """The agent's requests, newest first (the Harbourmaster shows an agent only its
        own)."""
        limit = min(args.get("limit", 20), LIST_LIMIT_MAX)
        page = self.harbour.requests_page(args.get("state"), limit=limit)
        return {"requests": [
            {k: r.get(k) for k in ("id", "request_id", "state", "reason", "target",
                                   "created_at", "updated_at")}
            for r in page["requests"]], "more": page["next"] is not None}

    # -- the parts ----------------------------------------------------------------------

    def _body(self, args: dict[str, Any], change: dict[str, Any], *, budget: dict[str, Any],
              ttl_seconds: int, reason: str) -> dict[str, Any]:
        pilot_id = args.get("pilot_id") or self.config.pilot_id
        target = args.get("target") or self.config.target
        if not pilot_id or not target:
            raise InvalidInput("name the pilot_id and the target (this server has no "
                               "--pilot-id/--target defaults)")
        return {"pilot_id": pilot_id, "target": target, "change": change, "budget": budget,
                "ttl_seconds": ttl_seconds, "reason": reason}

    def _submit(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """``POST /v1/requests``, a lost answer retried under the same id (never a second
        request); a refusal carries the request's id and the caller's."""
        from marque.cli.control import submit_with_retry

        try:
            request, _ = submit_with_retry(self.harbour, body, request_id,
                                           lambda exc, delay: None)
        except MarqueError as exc:
            exc.detail.setdefault("request_id", request_id)
            raise
        return request

    def _execute(self, request: dict[str, Any], attempt: int) -> dict[str, Any]:
        from marque.clients.pilot import PilotClient
        from marque.token import make_proof

        rq = request["id"]
        if request.get("marque") is None:
            raise Conflict(f"request {rq} is {request.get('state')}: it has no marque to "
                           "execute. " + request_answer(request)["next_step"],
                           detail={"id": rq, "state": request.get("state")})
        try:
            found = self.harbour.marque_for(rq)
        except Conflict:
            # An ended request's marque is not handed out again; what its nonce did is
            # still known, from the Pilot's reports the request holds.
            recorded = _recorded(request, attempt)
            if recorded is None:
                raise
            return recorded
        marque, pilot = found["marque"], found.get("pilot") or {}
        nonce = execution_nonce(rq, found["marque_id"], attempt)
        url = self.config.pilot_url or pilot.get("url")
        if not url:
            raise InvalidInput(f"Pilot {pilot.get('id')} registered no URL: start marque mcp "
                               "with --pilot URL")
        client = PilotClient(url)
        try:
            outcome = client.execute(
                marque, nonce,
                lambda: make_proof(self.config.key, marque, nonce=nonce,
                                   pilot_id=str(pilot.get("id"))))
        finally:
            client.close()
        shown = outcome.to_dict()
        return {"id": rq, "attempt": attempt, "nonce": nonce, "outcome": shown,
                "next_step": _EXECUTE_NEXT.get(shown["status"], "Call get_request.")}


def _recorded(request: dict[str, Any], attempt: int) -> dict[str, Any] | None:
    """The outcome the Pilot reported for the agent's ``attempt`` at ``request`` (its
    latest attempt under that nonce), or None when none was reported."""
    marque_id = (request.get("marque") or {}).get("marque_id")
    if not isinstance(marque_id, str):
        return None
    nonce = execution_nonce(request["id"], marque_id, attempt)
    rows = [row for row in request.get("executions") or [] if row.get("nonce") == nonce]
    if not rows:
        return None
    last = max(rows, key=lambda row: int(row.get("attempt") or 0))
    outcome = {"marque_id": marque_id, "nonce": nonce, "status": last.get("status"),
               "attempt": last.get("attempt"), "rows_affected": last.get("rows_affected"),
               "replayed": True, "error": last.get("error")}
    return {"id": request["id"], "attempt": attempt, "nonce": nonce, "outcome": outcome,
            "reported": True, "next_step": (
                f"Request {request['id']} is {request.get('state')}: this is the outcome its "
                "Pilot reported for this attempt; it will not run again. "
                + request_answer(request)["next_step"])}


def _statement(given: dict[str, Any]) -> dict[str, Any]:
    return {"sql": given["sql"], "params": list(given.get("params") or [])}
