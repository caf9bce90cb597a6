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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marque.errors import NotFound
from marque.harbour.approvals import DecisionFacts
from marque.harbour.console import logbook as console_logbook
from marque.harbour.console import pilots as console_pilots
from marque.harbour.console.highlight import highlight_sql
from marque.harbour.console.row_images import row_images_view
from marque.harbour.lifecycle import RequestState
from marque.harbour.principals import Principal, Role
from marque.harbour.row_diff import over_budget
from marque.harbour.undo import UNDOABLE, why_no_undo
from marque.token import unverified_claims

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["NAV", "OUTCOMES", "STATES", "Tone", "nav_for", "queue_view", "request_view",
           "tone_of"]


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
#: The console's sections, and the roles whose principals the core lets read each
#: (``list_requests``, ``list_pilots``, ``logbook``: DESIGN §11.7). A link is shown only to a
#: viewer who may open it; the core still decides on every page.
NAV: tuple[tuple[str, str, str, tuple[Role, ...]], ...] = (
    ("queue", "/", "Requests", (Role.REQUESTER, *_READERS)),
    ("pilots", "/pilots", "Pilots", _READERS),
    ("logbook", "/logbook", "Logbook", (Role.AUDITOR, Role.ADMIN)),
    ("notifications", "/notifications", "Notifications", (Role.ADMIN,)),
)


def nav_for(principal: Principal) -> list[dict[str, str]]:
    """The sections ``principal`` may open: ``[{section, href, label}]``, in order."""
    return [{"section": section, "href": href, "label": label}
            for section, href, label, roles in NAV
            if any(principal.has(role) for role in roles)]


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


def can_decide(hm: Harbourmaster, principal: Principal, request: dict[str, Any],
               facts: DecisionFacts | None = None) -> tuple[bool, str]:
    """Whether to offer this viewer approve/reject, and if not, why (the core decides anyway).
    ``facts``: what the core read for it beside its object (``Harbourmaster.decision_facts``),
    read here when not given."""
    if request["state"] != RequestState.AWAITING_APPROVAL.value:
        return False, ""
    if not principal.has(Role.APPROVER):
        return False, "Only an approver can approve or reject this request."
    if any(r["approver"] == principal.name for r in request.get("resolutions") or []):
        return False, "You have already decided on this request."
    if facts is None:
        facts = hm.decision_facts([request["id"]]).get(request["id"]) \
            or DecisionFacts(self_approval=False, requester_keys=frozenset(),
                             no_longer_holds=["not_awaiting"])
    if request["principal"] == principal.name and not facts.self_approval:
        return False, ("You asked for this change, so someone else must approve it "
                       "(self_approval).")
    if principal.key_thumbprint is not None \
            and principal.key_thumbprint in facts.requester_keys and not facts.self_approval:
        return False, ("You hold the key this change was asked with, so someone else must "
                       "approve it (self_approval).")
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


#: How many requests the queue's "All requests" table shows a page.
QUEUE_PAGE = 50


def queue_view(hm: Harbourmaster, principal: Principal, state: str | None,
               cursor: str | None = None) -> dict[str, Any]:
    """The queue: what waits for this viewer, counts per state, and one page of the
    (filtered) list, newest first (``next``: the cursor of the page after, or None).

    The lists of work (waiting for an approval, ready to run, needing a human) are read
    whole, by state: nothing waiting is ever on a page the viewer did not open."""
    counts = hm.request_counts(principal)
    page = hm.requests_page(principal, state, limit=QUEUE_PAGE, cursor=cursor)
    # Only what an approval could still turn into a marque: a Checkpoint that expired, or
    # whose config, Pilot or target changed, waits for nobody (an approval would fail it).
    awaiting = hm.list_requests(principal, RequestState.AWAITING_APPROVAL.value)
    facts = hm.decision_facts([r["id"] for r in awaiting]) \
        if principal.has(Role.APPROVER) else {}
    waiting = [_row(r) for r in awaiting
               if r["id"] in facts and can_decide(hm, principal, r, facts[r["id"]])[0]
               and not facts[r["id"]].no_longer_holds]
    ready = [_row(r) for r in hm.list_requests(principal, RequestState.PREPARED.value)
             if r["principal"] == principal.name]
    needs_human = [_row(r) for name in ("reconciliation", "rollback_failed")
                   for r in hm.list_requests(principal, name)]
    return {
        "state": state, "rows": [_row(r) for r in page["requests"]],
        "next": page["next"], "first_page": cursor is None,
        "total": sum(counts.values()),
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
            "sample": [list(row) for row in sample.get("rows") or []],
            "row_images": row_images_view(statement.get("row_images")),
            "caveats": _caveats(statement)})
    return {"mode": preview.get("mode"), "total_rows": preview.get("total_rows"),
            "max_rows": preview.get("max_rows"),
            "within_max_rows": preview.get("within_max_rows"),
            "elapsed_ms": preview.get("elapsed_ms"), "at": preview.get("at"),
            "preview_cid": preview.get("preview_cid"), "pilot": preview.get("pilot"),
            "diff_cid": preview.get("diff_cid"), "statements": statements,
            "caveats": [{"statement": s["index"], **c} for s in statements
                        for c in s["caveats"]]}


def _caveats(statement: dict[str, Any]) -> list[dict[str, str]]:
    """A statement's preview caveats as shown: code and message (docs/harbour.md)."""
    found = statement.get("preview_caveats")
    return [{"code": str(c.get("code")), "message": str(c.get("message"))}
            for c in (found if isinstance(found, list) else []) if isinstance(c, dict)]


#: How an Effect Set row's (or receipt's) state is shown: ``unknown`` is unknown — needing a
#: human, never the failure colour.
ROW_STATES: dict[str, Tone] = {
    "applied": Tone("applied", "ok", "✓", "committed"),
    "accepted": Tone("accepted", "ok", "✓", "accepted by the target"),
    "failed": Tone("failed", "bad", "✕", "provably not applied"),
    "unattempted": Tone("unattempted", "ended", "–", "never sent"),
    "rolled_back": Tone("rolled back", "ended", "↺", "rolled back with its batch"),
    "unknown": Tone("unknown: needs a human", "unknown", "?",
                    "it may or may not have committed; reconciliation settles it from its "
                    "row stamp, never by resending"),
    "unknown_outcome": Tone("unknown outcome: needs a human", "unknown", "?",
                            "some rows' outcome is not known yet; reconciliation settles them"),
    "partial_failure": Tone("partial failure", "bad", "✕", "some rows applied, others not"),
    "needs_reconciliation": Tone("needs reconciliation", "unknown", "?",
                                 "a row's outcome is unknown: a human must look"),
    "succeeded": Tone("succeeded", "ok", "✓", "every row applied"),
}


def _row_state(state: str | None) -> dict[str, Any]:
    return {"state": state, "tone": tone_of(state, ROW_STATES)}


def _shown_state(state: dict[str, Any]) -> tuple[str, Any]:
    """A row state as ``(kind, value)``: ``("present", {column: value})`` or ``(state, None)``."""
    name = str(state.get("state"))
    return (name, state.get("value")) if name == "present" else (name, None)


def _effect_set(change: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An Effect Set request's members as asked: declaration and input size per member."""
    effect_set = change.get("effect_set")
    if not isinstance(effect_set, dict):
        return None
    inputs = effect_set.get("inputs") or {}
    strength = effect_set.get("strength") or {}
    return [{**member, "rows": len((inputs.get(member.get("effect_id")) or {}).get("rows")
                                   or []),
             "strength": strength.get(member.get("effect_id"), "full_diff")}
            for member in (effect_set.get("declaration") or {}).get("members") or []]


def _effect_preview(preview: dict[str, Any] | None,
                    receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    """An Effect preview, row by row (key, before → after per changed column), with each
    row's state from the set receipt once one is known."""
    if not preview or "effect_preview_cid" not in preview:
        return None
    states = (receipt or {}).get("row_states") or {}
    members = []
    for member in preview.get("members") or []:
        member_states = states.get(member.get("effect_id")) or []
        rows = []
        for index, change in enumerate(member.get("changes") or []):
            before_kind, before = _shown_state(change.get("before") or {})
            after_kind, after = _shown_state(change.get("after") or {})
            key = change.get("row_or_item_key")
            keyed = set(key) if isinstance(key, dict) else set()
            columns = sorted((set(before or {}) | set(after or {})) - keyed)
            cells = [{"column": c, "before": (before or {}).get(c),
                      "after": (after or {}).get(c),
                      "changed": (before or {}).get(c) != (after or {}).get(c)}
                     for c in columns]
            rows.append({"index": index + 1, "key": key, "before_kind": before_kind,
                         "after_kind": after_kind, "cells": cells,
                         "row_preview_cid": change.get("row_preview_cid"),
                         "state": _row_state(member_states[index])
                         if index < len(member_states) else None})
        members.append({"effect_id": member.get("effect_id"), "kind": member.get("kind"),
                        "table": member.get("table"), "key": member.get("key") or [],
                        "strength": member.get("strength"),
                        "failure_policy": member.get("failure_policy"),
                        "item_count": member.get("item_count"), "rows": rows,
                        "cid": member.get("effect_member_preview_cid")})
    return {"effect_preview_cid": preview.get("effect_preview_cid"),
            "previewed_at": (preview.get("authoring_context") or {}).get("previewed_at"),
            "members": members,
            "total_rows": sum(int(m.get("item_count") or 0) for m in members)}


def _effect_receipt(receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    if not receipt:
        return None
    sealed = receipt.get("set_receipt") or {}
    return {"status": _row_state(receipt.get("status")),
            "run_outcome": _row_state(receipt.get("run_outcome")),
            "set_receipt_cid": receipt.get("set_receipt_cid"),
            "nonce": receipt.get("nonce"), "attempt": receipt.get("attempt"),
            "authorization": sealed.get("authorization"),
            "members": [{"effect_id": m.get("effect_id"), "state": _row_state(m.get("state")),
                         "member_receipt_cid": m.get("member_receipt_cid")}
                        for m in sealed.get("members") or []]}


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


def _undo_offer(hm: Harbourmaster, principal: Principal, request: dict[str, Any]
                ) -> dict[str, Any] | None:
    """What the requester is offered to undo their applied request: ``{available, why}``
    (None for anyone else, and in a state that cannot be undone; the core decides anyway)."""
    if request["state"] not in UNDOABLE or request["principal"] != principal.name \
            or not principal.has(Role.REQUESTER):
        return None
    why = why_no_undo(hm.store, hm.store.get_request(request["id"]))
    return {"available": why is None, "why": why}


def _compensates(hm: Harbourmaster, principal: Principal, original: str | None
                 ) -> dict[str, Any] | None:
    """The request a compensation rolls back, as this viewer may see it: ``{id, state,
    principal}`` (state and requester None if they may not see it)."""
    if not original:
        return None
    try:
        found = hm.get_request(principal, original)
    except NotFound:
        return {"id": original, "state": None, "principal": None}
    return {"id": found["id"], "state": found["state"], "principal": found["principal"]}


def _is_agent(hm: Harbourmaster, name: str) -> bool:
    """Whether the requester is an AI agent (role ``agent``): its approver is told so."""
    try:
        return hm.store.get_principal(name).has(Role.AGENT)
    except NotFound:
        return False


def request_view(hm: Harbourmaster, principal: Principal, id: str, *,
                 timelines: bool = True) -> dict[str, Any]:
    """Everything the request page shows, for this viewer (``NotFound`` if they may not see it)."""
    request = hm.get_request(principal, id)
    stored = hm.store.get_request(request["id"])
    decide, why_not = can_decide(hm, principal, request)
    approved, needed = _approvals(request)
    entries, entries_more = console_logbook.request_entries(hm, principal, request["id"])
    return {
        "compensates": _compensates(hm, principal, request.get("rolls_back")),
        "undo": request.get("undo"), "undo_offer": _undo_offer(hm, principal, request),
        "requester_is_agent": _is_agent(hm, request["principal"]),
        "request": request, "tone": tone_of(request["state"]),
        "statements": _statements(request.get("change") or {}),
        "change_extra": {k: v for k, v in (request.get("change") or {}).items()
                         if k not in ("statements", "effect_set")},
        "effect_set": _effect_set(request.get("change") or {}),
        "effect_preview": _effect_preview(request.get("preview"), request.get("receipt")),
        "effect_receipt": _effect_receipt(request.get("receipt")),
        "routing": stored.routing,
        "preview": None if "effect_set" in (request.get("change") or {})
        else _preview(request.get("preview")),
        "checkpoint": request.get("checkpoint"), "resolutions": request.get("resolutions"),
        "approved": approved, "needed": needed,
        "can_decide": decide, "why_not": why_not, "marque": _marque(hm, request),
        "no_longer_holds": hm.no_longer_holds(request["id"]) if decide else [],
        # Offered a reject only: an approval of it is refused (preview_over_budget).
        "over_budget": None if "effect_set" in (request.get("change") or {})
        else over_budget(request.get("preview")),
        "executions": _executions(hm, request, timelines=timelines),
        "entries": entries, "live": request["state"] in LIVE_STATES,
        "entries_more": entries_more,
    }


#: States in which a request's page keeps itself up to date.
LIVE_STATES = frozenset({"preparing", "prepared", "executing", "reconciliation",
                         "rolling_back"})
