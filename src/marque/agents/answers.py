"""What an agent is told: a request as it can act on it, and an error with its next step.

A tool's answer is the request object of the service contract, trimmed to
what an agent needs (the marque itself stays with this server), and
``next_step``: one sentence naming the tool to call next, or saying that a
human must act. A refusal is an MCP tool error whose body is
``{error: {code, message, next_step, detail}}`` — ``code`` is Marque's stable
code (DESIGN §9), so an agent can branch on it.
"""

from __future__ import annotations

from typing import Any

from marque.errors import (
    Indeterminate,
    MarqueError,
    NotApplied,
    Refusal,
    Unavailable,
    UsageError,
)

__all__ = ["request_answer", "state_next_step", "error_answer", "error_next_step"]

_STATE_NEXT = {
    "preparing": "The Harbourmaster is still preparing it (its Pilot could not be reached "
                 "yet; it tries again by itself): call get_request later.",
    "awaiting_approval": "A human approver must decide: call wait_for_decision with its id. "
                         "You cannot approve it yourself.",
    "prepared": "Approved and ready: call execute with its id (attempt 1).",
    "executing": "An execution is running or was reported: call get_request to see its "
                 "outcome.",
    "verified": "Done: the change applied. Nothing more to do.",
    "reconciliation": "The outcome of an execution is not known yet: a human must look "
                      "(the console shows it). Do not execute it again with a new attempt.",
    "failed": "It will not run (see failure). Fix the cause and ask again with a new "
              "request_id.",
    "rejected": "A human rejected it (see resolutions for why). Do not ask for the same "
                "change again without addressing the reason.",
    "expired": "It expired before it ran. Ask again with a new request_id if it is still "
               "needed.",
    "rolling_back": "A compensating change is running: call get_request later.",
    "rollback_failed": "A compensating change failed: a human must look.",
    "rolled_back": "A compensating change undid it. Nothing more to do.",
}

#: The next step for codes where the class alone does not say it.
_CODE_NEXT = {
    "unauthenticated": "This server's agent token is unknown, rotated or revoked: a human "
                       "must give it a new one. Retrying will not help.",
    "forbidden": "Agents may not do this; a human with the right role must. Do not try "
                 "another way.",
    "not_found": "No such request of yours: check the id (list_requests shows yours).",
    "conflict": "This request_id already names a different change or the request is not in "
                "a state for this: use a new request_id, or call get_request to see it.",
    "request_id_invalid": "Use a request_id of printable text, at most 256 bytes.",
    "account_denied": "The routing refuses this change for you (or its budget is over the "
                      "routing's cap): ask for less, or ask a human to change the routing.",
    "account_no_match": "No routing entry covers this change for you: a human must add one.",
    "budget_exhausted": "This marque has no executions left: ask for the change again with "
                        "a new request_id if it must run again.",
    "attempts_exhausted": "This execution has used all its attempts: ask for the change "
                          "again with a new request_id.",
    "marque_expired": "The approval's marque expired: ask for the change again with a new "
                      "request_id.",
    "max_rows_exceeded": "It would touch (or return) more rows than max_rows, so nothing "
                         "changed: narrow it, or ask again with a larger max_rows.",
    "preview_failed": "The Pilot could not preview it (see message): fix the statements and "
                      "ask again with a new request_id.",
    "target_unavailable": "The target database could not be reached and nothing was sent: "
                          "call execute again with the same attempt.",
    "pilot_lost": "The Pilot was lost mid-execution: call execute again with the SAME "
                  "attempt (never a new one), or get_request, to learn the outcome.",
}


def state_next_step(request: dict[str, Any]) -> str:
    """The next step for a request in its state."""
    return _STATE_NEXT.get(str(request.get("state")), "Call get_request to see it.")


def _preview(preview: Any) -> Any:
    """The preview an approver sees, without the Pilot's plans and timings."""
    if not isinstance(preview, dict):
        return preview
    shown = {k: preview.get(k) for k in ("mode", "total_rows", "max_rows", "within_max_rows")
             if k in preview}
    statements = preview.get("statements")
    if isinstance(statements, list):
        shown["statements"] = [
            {k: s.get(k) for k in ("sql", "rows", "row_images", "preview_caveats", "sample")
             if k in s} for s in statements if isinstance(s, dict)]
    for key in ("effect_preview_cid", "members", "preview_cid", "diff_cid"):
        if key in preview:
            shown[key] = preview[key]
    return shown


def _caveats(preview: Any) -> list[Any]:
    statements = preview.get("statements") if isinstance(preview, dict) else None
    found: list[Any] = []
    for index, statement in enumerate(statements if isinstance(statements, list) else []):
        for caveat in (statement.get("preview_caveats") or []) if isinstance(
                statement, dict) else []:
            found.append({"statement": index, **caveat} if isinstance(caveat, dict)
                         else caveat)
    return found


def request_answer(request: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request object as an agent reads it, with ``next_step``."""
    routing = request.get("routing") or None
    answer = {
        "id": request.get("id"),
        "request_id": request.get("request_id"),
        "state": request.get("state"),
        "principal": request.get("principal"),
        "reason": request.get("reason"),
        "pilot_id": request.get("pilot_id"),
        "target": request.get("target"),
        "budget": request.get("budget"),
        "routing": None if routing is None else {
            k: routing.get(k) for k in ("outcome", "approvals", "code", "caveats")},
        "preview": _preview(request.get("preview")),
        "caveats": _caveats(request.get("preview")),
        "resolutions": [
            {k: r.get(k) for k in ("approver", "decision", "reason", "at")}
            for r in request.get("resolutions") or [] if isinstance(r, dict)],
        "marque": request.get("marque"),
        "executions": request.get("executions") or [],
        "receipt": request.get("receipt"),
        "failure": request.get("failure"),
        "created_at": request.get("created_at"),
        "updated_at": request.get("updated_at"),
    }
    answer.update(extra)
    answer.setdefault("next_step", state_next_step(request))
    return answer


def error_next_step(exc: MarqueError) -> str:
    """What an agent should do after ``exc`` (by its code, else by its kind)."""
    if exc.code in _CODE_NEXT:
        return _CODE_NEXT[exc.code]
    if isinstance(exc, Unavailable):
        sent = exc.detail.get("sent")
        if sent is False:
            return "Nothing was sent: the same call is safe to make again in a moment."
        return ("No answer came back: make the same call again (the same request_id, the "
                "same attempt) — it is answered, never done twice.")
    if isinstance(exc, Indeterminate):
        return ("Nobody can say yet whether it applied: a human must look. Never retry with "
                "a new attempt; execute with the same attempt answers once it is known.")
    if isinstance(exc, NotApplied):
        return "Nothing changed. Read the message, fix the cause, and ask again."
    if isinstance(exc, Refusal):
        return "Refused; nothing ran. Read the message: a human may have to act."
    if isinstance(exc, UsageError):
        return "The call was not valid: fix the arguments as the message says."
    return "Read the message; a human may have to look."


def error_answer(exc: MarqueError) -> dict[str, Any]:
    """The body of a tool error: ``{error: {code, message, next_step, detail}}``."""
    detail = {k: v for k, v in exc.detail.items() if k not in ("status",)}
    return {"error": {"code": exc.code, "message": exc.message,
                      "next_step": error_next_step(exc), "detail": detail}}
