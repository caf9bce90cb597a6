"""The diff an approver approves (DESIGN §10, §11.4): sealed, in budget, and still true.

A statement request's preview carries each changed row before and after
(:mod:`marque.target.row_images`) and ``diff_cid``, the CID of those images.
Here the Harbourmaster

* seals ``diff_cid`` in the Checkpoint (:func:`sealed_diff_cid`), so the
  approval names the diff itself, not only the preview that carried it;
* refuses an approval of a preview over its budget (:func:`refuse_over_budget`):
  its execution could only claim an attempt and abort with ``max_rows_exceeded``;
* when the approvals are in, asks the Pilot for the preview again and compares
  what the rows were *before* the change (:func:`diff_changes`): if the data
  moved since the approvers looked, the approval does not carry over to rows
  nobody saw — the request fails ``revalidation_failed`` (``diff_changed``) and
  is asked for again, with a new preview and new approvals. Before-images are
  compared, not after-images: values a statement makes as it runs (``now()``, a
  sequence's next number) differ on every rolled-back run without the data
  having changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marque.cid import is_cid
from marque.errors import PreviewOverBudget
from marque.harbour.pilot_calls import PREVIEW_SAMPLE_ROWS, ask_preview, preview_token
from marque.harbour.request_change import stored_change
from marque.harbour.statement_requests import StatementRequest
from marque.harbour.undo import refuse_fences
from marque.target.row_images import before_state

if TYPE_CHECKING:
    from marque.harbour.context import HarbourContext
    from marque.harbour.store.base import PilotRecord, StoredRequest

__all__ = ["DIFF_CHANGED", "sealed_diff_cid", "over_budget", "refuse_over_budget",
           "diff_changes"]

#: What revalidation names when a fresh preview's before-images are not the approved ones.
DIFF_CHANGED = "diff_changed"


def sealed_diff_cid(preview: dict[str, Any] | None) -> str | None:
    """The ``diff_cid`` a Checkpoint seals: the preview's, when it names one."""
    value = (preview or {}).get("diff_cid")
    return value if isinstance(value, str) and is_cid(value) else None


def over_budget(preview: dict[str, Any] | None) -> str | None:
    """Why ``preview`` cannot be approved for its budget (None when it can): it touched
    more rows than ``max_rows``."""
    if not preview or preview.get("within_max_rows") is not False:
        return None
    return (f"the preview touched {preview.get('total_rows')} row(s), more than the budget's "
            f"max_rows of {preview.get('max_rows')}: executing it would claim an attempt and "
            "abort with max_rows_exceeded, so it cannot be approved")


def refuse_over_budget(request: StoredRequest) -> None:
    """Raise :class:`PreviewOverBudget` for an approval of an over-budget preview."""
    why = over_budget(request.preview)
    if why is not None:
        raise PreviewOverBudget(
            f"request {request.id}: {why}. Reject it, and ask for a narrower change or a "
            "larger max_rows",
            detail={"id": request.id, "total_rows": (request.preview or {}).get("total_rows"),
                    "max_rows": (request.preview or {}).get("max_rows")})


def diff_changes(ctx: HarbourContext, request: StoredRequest, pilot: PilotRecord,
                 sample_rows: int = PREVIEW_SAMPLE_ROWS) -> str | None:
    """Preview ``request`` again and say how its rows differ from the approved preview's
    (None when its before-images are the same). Only a rolled-back preview with row
    images is compared. A Pilot that cannot be reached raises (nothing is issued,
    and the approvals stay: approving again tries again); a preview that fails now
    is a difference. A fenced statement (an undo's) that no longer touches exactly
    its row raises ``UndoConflict``."""
    approved = request.preview or {}
    if sealed_diff_cid(approved) is None or approved.get("mode") != "rollback":
        return None
    change = stored_change(request.change)
    token = preview_token(ctx, request, change, pilot, sample_rows)
    try:
        fresh, _ = change.previewed(ask_preview(ctx, pilot, token), pilot, request.target)
    except change.preview_refusals as exc:
        return f"the change no longer previews ({exc.message})"
    if isinstance(change, StatementRequest):
        refuse_fences(change.change, fresh)  # an undo's row changed: UndoConflict, by key
    return _difference(approved, fresh)


def _difference(approved: dict[str, Any], fresh: dict[str, Any]) -> str | None:
    then = _states(approved)
    now = _states(fresh)
    if then == now:
        return None
    for index, (old, new) in enumerate(zip(then, now, strict=False)):
        if old != new:
            return (f"statement {index}'s rows are not what the approvers saw: "
                    f"{_describe(old)} then, {_describe(new)} now")
    return "the change's statements preview differently now"


def _states(preview: dict[str, Any]) -> list[Any]:
    statements = [s for s in preview.get("statements") or [] if isinstance(s, dict)]
    return [None if s.get("row_images") is None else {"rows": s.get("rows"), "images": state}
            for s, state in zip(statements, before_state(statements), strict=True)]


def _describe(state: Any) -> str:
    if not isinstance(state, dict):
        return "no rows written"
    images = state["images"]
    if isinstance(images, list):
        return f"{state['rows']} row(s) with before-images {images[1][:19]}…"
    return f"{state['rows']} row(s), images {images}"
