"""The JSON the Harbourmaster answers with: the request object and a registered Pilot.

One shape for every caller (the HTTP API, the CLI's ``--json``): fields not
reached yet are ``null`` or ``[]``, never missing. A request's executions are
read from its stored reports (the latest word per nonce and attempt).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from typing import Any

from marque.errors import InvalidInput
from marque.harbour.executions import latest_attempts
from marque.harbour.store.base import HarbourStore, PilotRecord, RequestParts, StoredRequest
from marque.harbour.undo import undo_view

_ROUTING_SHOWN = ("outcome", "config_cid", "approvals", "code", "caveats")
#: A page of ``GET /v1/requests``: its default size, and the most one page holds.
REQUESTS_PAGE = 100
REQUESTS_PAGE_MAX = 500


def page_cursor(request: StoredRequest) -> str:
    """The opaque cursor of a listing page that ends with ``request``: where the next page
    starts (base64url of ``[created_at, id]``; a caller only hands it back)."""
    text = json.dumps([request.created_at, request.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def read_cursor(cursor: str) -> tuple[float, str]:
    """A cursor from :func:`page_cursor` back as ``(created_at, id)``; ``input_invalid``
    for anything else."""
    bad = InvalidInput("`cursor` is not a cursor this Harbourmaster gave: pass the `next` "
                       "of the page before, unchanged", detail={"parameter": "cursor"})
    if not isinstance(cursor, str) or not 0 < len(cursor) <= 256:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        found = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if (not isinstance(found, list) or len(found) != 2
            or not isinstance(found[0], int | float) or isinstance(found[0], bool)
            or not isinstance(found[1], str) or not found[1].startswith("rq_")
            or found[0] != found[0] or abs(found[0]) == float("inf")):
        raise bad
    return float(found[0]), found[1]


class _PageReads:
    """The store, with what a page of request objects reads about the requests its
    compensations roll back already read: their rows (``RequestParts.originals``) and
    the Pilots (one list). An undo's view derives the undo from both (:class:`UndoReads`);
    read per request, that would be two queries for each undo on the page."""

    def __init__(self, store: HarbourStore, parts: RequestParts) -> None:
        self._store = store
        self._originals = parts.originals
        self._pilots: dict[str, PilotRecord] | None = None

    def get_request(self, id: str) -> StoredRequest:
        found = self._originals.get(id)
        return found if found is not None else self._store.get_request(id)

    def get_pilot(self, pilot_id: str) -> PilotRecord:
        if self._pilots is None:  # a handful of Pilots: one list, read once a page
            self._pilots = {p.pilot_id: p for p in self._store.list_pilots()}
        found = self._pilots.get(pilot_id)
        return found if found is not None else self._store.get_pilot(pilot_id)


def request_objects(store: HarbourStore, requests: Sequence[StoredRequest]) -> list[dict[str, Any]]:
    """The request objects of ``requests``, in order, their parts read together: a fixed
    number of queries for the whole list, whatever its length (the parts, and the Pilots
    once when an undo is among them)."""
    parts = store.request_parts(requests)
    reads = _PageReads(store, parts)
    return [request_object(store, request, parts, reads) for request in requests]


def request_object(store: HarbourStore, request: StoredRequest,
                   parts: RequestParts | None = None,
                   reads: _PageReads | None = None) -> dict[str, Any]:
    """The request object of the service contract for ``request`` (its Checkpoint,
    Resolutions, reports and original from ``parts`` when given, else read from
    ``store``; ``reads``, a page's, shared by its requests)."""
    if parts is None:
        parts = store.request_parts([request])
    if reads is None:
        reads = _PageReads(store, parts)
    checkpoint, resolutions = _checkpoint_view(store, request, parts)
    executions: list[dict[str, Any]] = []
    receipt = None
    if request.marque_id is not None:
        reports = parts.reports.get(request.marque_id, [])
        executions = latest_attempts(r.body for r in reports)
        receipt = effect_receipt(r.body for r in reports)
    routing = None
    if request.routing is not None:
        routing = {name: request.routing.get(name) for name in _ROUTING_SHOWN}
    marque = None
    if request.marque_id is not None:
        marque = {"marque_id": request.marque_id, "expires_at": request.marque_expires_at}
    return {
        "id": request.id,
        "request_id": request.request_id,
        "state": request.state.value,
        "version": request.version,
        "principal": request.principal,
        "reason": request.reason,
        "pilot_id": request.pilot_id,
        "target": request.target,
        "change": request.change,
        "budget": request.budget,
        "ttl_seconds": request.ttl_seconds,
        "change_cid": request.change_cid,
        "logical_request_scope": request.logical_request_scope,
        "intent_fingerprint": request.intent_fingerprint,
        "routing": routing,
        "preview": request.preview,
        "checkpoint": checkpoint,
        "resolutions": resolutions,
        "marque": marque,
        "marque_id": request.marque_id,
        "executions": executions,
        "receipt": receipt,
        "failure": request.failure,
        "rolls_back": request.rolls_back,
        "undo": undo_view(reads, request, executions, receipt) if request.rolls_back else None,
        "created_at": request.created_at,
        "updated_at": request.updated_at,
    }


def _checkpoint_view(store: HarbourStore, request: StoredRequest, parts: RequestParts
                     ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The request object's ``checkpoint`` and ``resolutions`` (None and [] before one is
    sealed)."""
    if request.checkpoint_cid is None:
        return None, []
    sealed = parts.checkpoints.get(request.checkpoint_cid)
    if sealed is None:  # a request names only a stored Checkpoint: this says so
        sealed = store.get_checkpoint(request.checkpoint_cid)
    checkpoint = {"cid": sealed.checkpoint_cid, "body": sealed.body,
                  "expires_at": sealed.expires_at}
    resolutions = [
        {"resolution_cid": r.resolution_cid, "approver": r.approver,
         "decision": r.decision, "reason": r.body.get("reason"), "at": r.at}
        for r in parts.resolutions.get(request.checkpoint_cid, [])
    ]
    return checkpoint, resolutions


def effect_receipt(reports: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """An Effect Set request's set receipt, from the last report (in the order received)
    that carried one: ``{nonce, attempt, status, set_receipt, row_states, run_outcome,
    run_state, effect_preview_cid, set_receipt_cid}`` — ``row_states`` is every row's latest
    state by member, so a row reconciliation settled shows its settled state (``run_state``
    the Run's projection with that report). None until a Pilot
    reported one (and for every statement request)."""
    found = None
    for body in reports:
        summary = body.get("effect_set")
        if isinstance(summary, dict) and isinstance(summary.get("set_receipt"), dict):
            found = {"nonce": body.get("nonce"), "attempt": body.get("attempt"),
                     "status": summary["set_receipt"].get("status"),
                     "set_receipt_cid": summary.get("set_receipt_cid"),
                     "effect_preview_cid": summary.get("effect_preview_cid"),
                     "run_outcome": summary.get("run_outcome"),
                     "run_state": summary.get("run_state"),
                     "row_states": summary.get("row_states"),
                     "failed_rows": summary.get("failed_rows"),
                     "set_receipt": summary["set_receipt"]}
    return found


def pilot_object(pilot: PilotRecord) -> dict[str, Any]:
    """A registered Pilot: ``targets`` maps each target to ``{dialect}`` (null if unknown);
    ``report_key`` is the public JWK its reports are checked against (null if none)."""
    return {
        "pilot_id": pilot.pilot_id,
        "url": pilot.url,
        "incarnation": pilot.incarnation,
        "targets": {name: {"dialect": pilot.dialects.get(name)} for name in pilot.targets},
        "registered_at": pilot.registered_at,
        "last_seen": pilot.last_seen,
        "report_key": pilot.report_key,
    }
