"""What the Harbourmaster asks a Pilot (DESIGN §10): a change's preview, a marque's evidence.

Each ask is made between store operations, never inside a transaction, with a
short-lived token from the issuer key (a preview token bounded by the request's
budget, or a query token naming one marque). An unreachable Pilot raises
``pilot_unavailable`` and leaves the request where it was, for a retry.
"""

from __future__ import annotations

from typing import Any

from marque.change import Budget
from marque.harbour.context import HarbourContext
from marque.harbour.request_change import RequestChange
from marque.harbour.store.base import PilotRecord, StoredRequest
from marque.token.service_tokens import PreviewGrant

__all__ = ["PREVIEW_SAMPLE_ROWS", "ask_evidence", "ask_preview", "preview_token"]

#: Sample rows a preview shows per statement.
PREVIEW_SAMPLE_ROWS = 5


def preview_token(ctx: HarbourContext, request: StoredRequest, change: RequestChange,
                  pilot: PilotRecord, sample_rows: int = PREVIEW_SAMPLE_ROWS) -> str:
    """A preview token for ``request``'s change on ``pilot``, bounded by its budget."""
    return ctx.issuer.preview_token(PreviewGrant(
        pilot_id=pilot.pilot_id, incarnation=pilot.incarnation, target=request.target,
        change=change.preview_change(request.logical_request_scope),
        sample_rows=sample_rows, max_rows=Budget.from_claim(request.budget).max_rows))


def ask_preview(ctx: HarbourContext, pilot: PilotRecord, token: str) -> Any:
    """The Pilot's answer to the preview ``token`` (unchecked: the change checks it is
    its own preview, ``RequestChange.previewed``)."""
    client = ctx.pilot_client_factory(pilot.url)
    try:
        return client.preview(token)
    finally:
        client.close()


def ask_evidence(ctx: HarbourContext, request: StoredRequest) -> dict[str, Any]:
    """The Pilot's evidence for the request's marque, fetched with a query token."""
    assert request.marque_id is not None
    pilot = ctx.store.get_pilot(request.pilot_id)
    token = ctx.issuer.query_token(pilot_id=pilot.pilot_id, marque_id=request.marque_id)
    client = ctx.pilot_client_factory(pilot.url)
    try:
        return client.evidence(request.marque_id, token)
    finally:
        client.close()
