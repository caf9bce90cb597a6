"""What each console page shows, shaped from the core's answers (DESIGN §12).

Every function here takes the :class:`~marque.harbour.service.Harbourmaster`
and the viewer's principal and calls the same core methods the HTTP API calls
(``list_requests``, ``get_request``, ``list_pilots``, ``logbook``…), so what a
page shows — and whether it shows anything at all — is decided by the core's
access rules (§11.7), never by a template. The only reads past the core are of
fields the request object leaves out (the routing decision's matched entries
and the marque's validity window) of a request the core has just shown this
viewer. They block, so the console runs them in worker threads.

States and outcomes are shown by word *and* colour (:data:`STATES`,
:data:`OUTCOMES`): ``reconciliation`` and ``indeterminate`` have their own
tone, ``unknown``, which is never the failure colour — nobody knows yet, and
a human must look.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marque.errors import NotFound
from marque.harbour.console import logbook as console_logbook
from marque.harbour.console import pilots as console_pilots
from marque.harbour.console.highlight import highlight_sql
from marque.harbour.lifecycle import RequestState
from marque.harbour.principals import Principal, Role
from marque.token import unverified_claims

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["OUTCOMES", "STATES", "Tone", "queue_view", "request_view", "tone_of"]


@dataclass(frozen=True)
class Tone:
    """How a state or outcome is shown: its word, a colour class, a symbol, what it means."""

    word: str
    tone: str  # ok | info | running | attention | unknown | bad | ended
    symbol: str
    meaning: str


STATES: dict[str, Tone] = {
    "preparing": Tone("preparing", "info", "…", "accepted; routing and preview in progress"),
    "awaiting_approval": Tone("awaiting approval", "attention", "●",
                              "a sealed Checkpoint waits for its approvals"),
    "prepared": Tone("prepared", "info", "◆",
                     "approved and its marque issued; not executed yet"),
    "executing": Tone("executing", "running", "▶", "a Pilot reported that it is running"),
    "verified": Tone("verified", "ok", "✓", "applied, and no execution is unknown"),
    "reconciliation": Tone("reconciliation: unknown", "unknown", "?",
                           "an execution's outcome is not known, or the Pilot's ledger was "
                           "lost: it needs a human, and only evidence from the target settles "
                           "it"),
    "rolling_back": Tone("rolling back", "running", "↺",
                         "a compensating request is running"),
    "rollback_failed": Tone("rollback failed", "bad", "✕",
                            "the compensating request failed: a human must act"),
    "failed": Tone("failed", "bad", "✕",
                   "denied, refused, or provably not applied and unable to run"),
    "rejected": Tone("rejected", "ended", "⊘", "an approver rejected it"),
    "expired": Tone("expired", "ended", "⌛",
                    "its Checkpoint or its marque expired; it never ran"),
    "rolled_back": Tone("rolled back", "ended", "↺", "a compensating request undid it"),
}

OUTCOMES: dict[str, Tone] = {
    "in_progress": Tone("in progress", "running", "▶", "claimed and running"),
    "indeterminate": Tone("indeterminate: unknown", "unknown", "?",
                          "it may or may not have committed; nobody can say yet. A human "
                          "must look: reconciliation settles it from the target's stamps"),
    "aborted_not_applied": Tone("not applied", "bad", "✕",
                                "provably not applied: nothing changed"),
    "applied": Tone("applied", "ok", "✓", "committed"),
}

#: Queue order: what needs someone first, what is over last.
STATE_ORDER = ("awaiting_approval", "reconciliation", "rollback_failed", "executing",
               "rolling_back", "prepared", "preparing", "verified", "failed", "rejected",
               "expired", "rolled_back")
_READERS = (Role.APPROVER, Role.AUDITOR, Role.ADMIN)


def tone_of(name: str | None, table: dict[str, Tone] | None = None) -> Tone:
    """The tone of a state (or, with ``OUTCOMES``, of an outcome); unknown words say so."""
    table = STATES if table is None else table
    if name is None:
        return Tone("none", "ended", "–", "nothing yet")
    return table.get(name, Tone(name, "unknown", "?", "a status this console does not know"))


def _first_line(request: dict[str, Any]) -> str:
    statements = (request.get("change") or {}).get("statements") or []
    if not statements:
        return "(an Effect Set)" if request.get("change") else ""
    text = " ".join(str(statements[0].get("sql", "")).split())
    more = f"  (+{len(statements) - 1} more)" if len(statements) > 1 else ""
    return (text[:117] + "…" if len(text) > 120 else text) + more


def _approvals(request: dict[str, Any]) -> tuple[int, int]:
    approved = sum(1 for r in request.get("resolutions") or [] if r["decision"] == "approve")
    needed = int((request.get("routing") or {}).get("approvals") or 0)
    return approved, needed


def _self_approval_allowed(hm: Harbourmaster, request_id: str) -> bool:
    try:
        routing = hm.store.get_request(request_id).routing or {}
    except NotFound:
        return False
    return bool(routing.get("self_approval"))


def can_decide(hm: Harbourmaster, principal: Principal, request: dict[str, Any]
               ) -> tuple[bool, str]:
    """Whether to offer this viewer approve/reject, and if not, why (the core decides anyway)."""
    if request["state"] != RequestState.AWAITING_APPROVAL.value:
        return False, ""
    if not principal.has(Role.APPROVER):
        return False, "Only an approver can approve or reject this request."
    if any(r["approver"] == principal.name for r in request.get("resolutions") or []):
        return False, "You have already decided on this request."
    if request["principal"] == principal.name and not _self_approval_allowed(hm, request["id"]):
        return False, ("You asked for this change, so someone else must approve it "
                       "(self_approval).")
    return True, ""


def _row(request: dict[str, Any]) -> dict[str, Any]:
    approved, needed = _approvals(request)
    return {"id": request["id"], "request_id": request["request_id"],
            "state": request["state"], "tone": tone_of(request["state"]),
            "principal": request["principal"], "reason": request.get("reason"),
            "pilot_id": request["pilot_id"], "target": request["target"],
            "created_at": request["created_at"], "updated_at": request["updated_at"],
            "summary": _first_line(request), "approved": approved, "needed": needed,
            "executions": len(request.get("executions") or [])}


def queue_view(hm: Harbourmaster, principal: Principal, state: str | None) -> dict[str, Any]:
    """The queue: what waits for this viewer, counts per state, and the (filtered) list."""
    everything = hm.list_requests(principal)
    shown = hm.list_requests(principal, state) if state else everything
    counts = Counter(r["state"] for r in everything)
    waiting = [_row(r) for r in everything
               if r["state"] == RequestState.AWAITING_APPROVAL.value
               and can_decide(hm, principal, r)[0]]
    ready = [_row(r) for r in everything
             if r["state"] == RequestState.PREPARED.value and r["principal"] == principal.name]
    needs_human = [_row(r) for r in everything
                   if r["state"] in ("reconciliation", "rollback_failed")]
    return {
        "state": state, "rows": [_row(r) for r in shown], "total": len(everything),
        "counts": [(name, counts.get(name, 0), tone_of(name)) for name in STATE_ORDER],
        "waiting": waiting, "ready": ready, "needs_human": needs_human,
        "is_approver": principal.has(Role.APPROVER),
        "sees_all": any(principal.has(role) for role in _READERS),
    }


# -- one request ---------------------------------------------------------------------------


def _statements(change: dict[str, Any]) -> list[dict[str, Any]]:
    shown = []
    for index, statement in enumerate(change.get("statements") or [], start=1):
        sql = str(statement.get("sql", ""))
        shown.append({"index": index, "sql": sql, "html": highlight_sql(sql),
                      "params": list(statement.get("params") or [])})
    return shown


def _preview(preview: dict[str, Any] | None) -> dict[str, Any] | None:
    if not preview:
        return None
    statements = []
    for index, statement in enumerate(preview.get("statements") or [], start=1):
        sample = statement.get("sample") or {}
        statements.append({
            "index": index, "sql": statement.get("sql"),
            "html": highlight_sql(str(statement.get("sql") or "")),
            "rows": statement.get("rows"), "plan": statement.get("plan"),
            "columns": list(sample.get("columns") or []),
            "sample": [list(row) for row in sample.get("rows") or []]})
    return {"mode": preview.get("mode"), "total_rows": preview.get("total_rows"),
            "max_rows": preview.get("max_rows"),
            "within_max_rows": preview.get("within_max_rows"),
            "elapsed_ms": preview.get("elapsed_ms"), "at": preview.get("at"),
            "preview_cid": preview.get("preview_cid"), "pilot": preview.get("pilot"),
            "statements": statements}


def _marque(hm: Harbourmaster, request: dict[str, Any]) -> dict[str, Any] | None:
    """The marque's budget and window, read from its claims (never the token itself)."""
    if request.get("marque_id") is None:
        return None
    stored = hm.store.get_request(request["id"])
    claims = unverified_claims(stored.marque) if stored.marque else None
    claims = claims or {}
    return {"marque_id": request["marque_id"], "budget": claims.get("budget")
            or request.get("budget"), "iat": claims.get("iat"), "nbf": claims.get("nbf"),
            "exp": claims.get("exp", request["marque"]["expires_at"]
                              if request.get("marque") else None),
            "sub": claims.get("sub"), "pilot": claims.get("pilot"),
            "access": (claims.get("change") or {}).get("access")}


def _executions(hm: Harbourmaster, request: dict[str, Any], *, timelines: bool
                ) -> list[dict[str, Any]]:
    """Executions grouped by nonce, each attempt toned, with its Pilot timeline if asked."""
    by_nonce: dict[str, list[dict[str, Any]]] = {}
    for attempt in request.get("executions") or []:
        by_nonce.setdefault(attempt["nonce"], []).append(
            {**attempt, "tone": tone_of(attempt["status"], OUTCOMES)})
    url = None
    if timelines and by_nonce and request.get("marque_id"):
        try:
            url = hm.store.get_pilot(request["pilot_id"]).url
        except NotFound:
            url = None
    shown = []
    for nonce, attempts in by_nonce.items():
        latest = attempts[-1]
        timeline = None
        if url is not None:
            timeline = console_pilots.execution_events(url, request["marque_id"], nonce)
        shown.append({"nonce": nonce, "attempts": attempts, "latest": latest,
                      "timeline": timeline})
    return shown


def request_view(hm: Harbourmaster, principal: Principal, id: str, *,
                 timelines: bool = True) -> dict[str, Any]:
    """Everything the request page shows, for this viewer (``NotFound`` if they may not see it)."""
    request = hm.get_request(principal, id)
    stored = hm.store.get_request(request["id"])
    decide, why_not = can_decide(hm, principal, request)
    approved, needed = _approvals(request)
    entries = console_logbook.request_entries(hm, principal, request["id"])
    return {
        "request": request, "tone": tone_of(request["state"]),
        "statements": _statements(request.get("change") or {}),
        "change_extra": {k: v for k, v in (request.get("change") or {}).items()
                         if k != "statements"},
        "routing": stored.routing, "preview": _preview(request.get("preview")),
        "checkpoint": request.get("checkpoint"), "resolutions": request.get("resolutions"),
        "approved": approved, "needed": needed,
        "can_decide": decide, "why_not": why_not, "marque": _marque(hm, request),
        "executions": _executions(hm, request, timelines=timelines),
        "entries": entries, "live": request["state"] in LIVE_STATES,
    }


#: States in which a request's page keeps itself up to date.
LIVE_STATES = frozenset({"preparing", "prepared", "executing", "reconciliation",
                         "rolling_back"})
