"""Which request moves are notified, what an event says, and to whom it is addressed.

An event is decided by the move alone (its ``from`` and ``to`` states), so the
store can decide it inside the transaction that makes the move, and its id is
derived from the move (the request's id, its new version and the event type):
one move can never become two events, and every retry of a delivery carries the
same ``webhook-id``, so receivers de-duplicate on it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from marque.harbour.lifecycle import RequestState

S = RequestState

AWAITING_APPROVAL = "request.awaiting_approval"
APPROVED = "request.approved"
REJECTED = "request.rejected"
EXECUTED = "request.executed"
RECONCILIATION = "request.reconciliation"
#: What ``marque harbour webhooks test`` sends; never written to the outbox.
TEST = "webhook.test"

#: Every event type an endpoint may ask for, in the order a request meets them.
EVENT_TYPES: tuple[str, ...] = (AWAITING_APPROVAL, APPROVED, REJECTED, EXECUTED, RECONCILIATION)

#: The version of the generic event's shape (``data`` members may be added, never changed).
EVENT_VERSION = "marque-event/0.1"

#: States an execution report moves a request out of: leaving them for ``verified`` or
#: ``failed`` is the request having executed (applied, or provably not applied).
_RAN_FROM = frozenset({S.PREPARED, S.EXECUTING, S.RECONCILIATION})


def event_type(from_state: str | None, to_state: str | None) -> str | None:
    """The event a request's move from ``from_state`` to ``to_state`` calls for, or None.

    ``awaiting_approval`` from anywhere; ``awaiting_approval → prepared`` is the
    approval (an allowed request's marque is issued with no approval, and is not
    announced); ``rejected``; ``verified``, or ``failed`` from an execution state,
    is ``request.executed``; ``reconciliation`` from anywhere (a human must look).
    The original of a compensating change moving along with it is not announced
    on its own: its compensating request is.
    """
    try:
        before = None if from_state is None else S(from_state)
        after = S(str(to_state))
    except ValueError:
        return None
    if after is S.AWAITING_APPROVAL:
        return AWAITING_APPROVAL
    if before is S.AWAITING_APPROVAL and after is S.PREPARED:
        return APPROVED
    if after is S.REJECTED:
        return REJECTED
    if after in (S.VERIFIED, S.FAILED) and before in _RAN_FROM:
        return EXECUTED
    if after is S.RECONCILIATION:
        return RECONCILIATION
    return None


def event_id(id: str, version: int, kind: str) -> str:
    """The event's stable id: ``evt_`` and 32 hex digits derived from the move it reports."""
    digest = hashlib.sha256(f"{id}\x00{int(version)}\x00{kind}".encode()).hexdigest()
    return "evt_" + digest[:32]


def diff_summary(preview: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the stored preview says the change does: rows per statement and in total."""
    if not isinstance(preview, dict):
        return None
    statements = []
    for statement in preview.get("statements") or []:
        if isinstance(statement, dict):
            images = statement.get("row_images")
            statements.append({"sql": statement.get("sql"), "rows": statement.get("rows"),
                               **({"changed_rows": len(images["rows"])}
                                  if isinstance(images, dict)
                                  and isinstance(images.get("rows"), list) else {})})
    return {"mode": preview.get("mode"), "total_rows": preview.get("total_rows"),
            "max_rows": preview.get("max_rows"),
            "within_max_rows": preview.get("within_max_rows"), "statements": statements,
            "caveats": sorted({str(c.get("code") if isinstance(c, dict) else c)
                               for s in preview.get("statements") or [] if isinstance(s, dict)
                               for c in s.get("caveats") or []})}


def request_summary(row: dict[str, Any]) -> dict[str, Any]:
    """The request as an event shows it (a stored request's fields, the marque left out)."""
    change = row.get("change") or {}
    routing = row.get("routing") or {}
    return {
        "id": row["id"], "request_id": row["request_id"], "state": row["state"],
        "version": row["version"], "principal": row["principal"], "reason": row.get("reason"),
        "pilot_id": row["pilot_id"], "target": row["target"],
        "statements": [s.get("sql") for s in change.get("statements") or []
                       if isinstance(s, dict)],
        "effect_set": "effect_set" in change,
        "change_cid": row["change_cid"],
        "routing": {"outcome": routing.get("outcome"), "approvals": routing.get("approvals"),
                    "config_cid": routing.get("config_cid")} if routing else None,
        "diff": diff_summary(row.get("preview")),
        "checkpoint_cid": row.get("checkpoint_cid"), "marque_id": row.get("marque_id"),
        "marque_expires_at": row.get("marque_expires_at"), "failure": row.get("failure"),
        "rolls_back": row.get("rolls_back"),
    }


def may_approve(principal: str, roles: list[str], requester: str, self_approval: bool) -> bool:
    """Whether ``principal`` (unrevoked, holding ``roles``) may resolve a request of
    ``requester``'s: an approver, and not its requester unless routing allows it."""
    return "approver" in roles and (self_approval or principal != requester)
