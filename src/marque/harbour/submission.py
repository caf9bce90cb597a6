"""Accepting a request (DESIGN §11.2): a new one, the same intent again, or an undo.

A submission is read (:mod:`marque.harbour.intake`), given its logical identity
(§11.1), routed, and stored ``preparing`` by one insert the store's partial
unique index decides: a second submission of the same intent answers the
request the first made (resuming its preparation if it was left
``preparing``); another intent under the same request id is
``IntentConflict``. The preparation itself is :mod:`marque.harbour.preparation`'s.
"""

from __future__ import annotations

from typing import Any

from marque.errors import Forbidden, NotFound, PilotUnavailable, UnknownTarget
from marque.harbour.access import ASKERS, find, require
from marque.harbour.context import HarbourContext
from marque.harbour.intake import bounded_reason, read_submission
from marque.harbour.issuance import check_ttl
from marque.harbour.lifecycle import IntentConflict, RequestState
from marque.harbour.preparation import Preparation
from marque.harbour.principals import Principal, Role
from marque.harbour.routing import DELEGATE
from marque.harbour.store.base import RequestDraft, StoredRequest
from marque.harbour.undo import undo_submission, undo_taken
from marque.harbour.views import request_object

__all__ = ["Submissions"]

S = RequestState


class Submissions:
    """``POST /v1/requests`` and ``marque undo``: requests accepted and prepared."""

    def __init__(self, ctx: HarbourContext, preparation: Preparation) -> None:
        self.ctx = ctx
        self.preparation = preparation

    def submit(self, principal: Principal, body: dict[str, Any],
               idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """Accept a request (DESIGN §11.2): ``(request object, created)``.

        A repeat of the active request's intent answers it (resuming a
        preparation left ``preparing``); another intent under the same id is
        ``IntentConflict``. Deny and no-match are stored ``failed`` and raised
        with ``detail["id"]``; so is a refused preview (``preview_failed``).
        """
        require(principal, *ASKERS)
        store = self.ctx.store
        sub = read_submission(body, idempotency_key)
        if sub.rolls_back is not None:
            self._compensated(principal, sub.rolls_back)
        identity = sub.change.identity(store.harbour_id, principal.name, sub.request_id,
                                       sub.budget, sub.ttl_seconds, sub.pilot_id, sub.target)
        active = store.find_active(identity.logical_request_scope)
        if active is not None:
            return self._repeat(active, identity.intent_fingerprint, sub.request_id), False
        pilot = self.ctx.pilot(sub.pilot_id)
        if sub.target not in pilot.targets:
            raise UnknownTarget(f"Pilot {pilot.pilot_id} does not serve a target named "
                                f"{sub.target[:64]!r}", detail={"pilot_id": pilot.pilot_id,
                                                                "target": sub.target[:64]})
        requester = store.get_principal(principal.name)
        if requester.public_jwk is None:
            raise Forbidden(f"principal {principal.name} has no registered public key, so no "
                            "marque can be bound to it: an admin registers one first",
                            detail={"principal": principal.name})
        decision = self.preparation.route(principal.name, pilot, sub.target, sub.change,
                                          sub.budget)
        # Routing decides read_only, which is part of the change and so of its CID.
        change = sub.change.routed(decision)
        if decision.outcome == DELEGATE:
            check_ttl(sub.ttl_seconds, decision.max_ttl_seconds)
        draft = RequestDraft(
            request_id=sub.request_id, principal=principal.name, pilot_id=sub.pilot_id,
            target=sub.target, change=change.to_claim(), budget=sub.budget.to_claim(),
            ttl_seconds=sub.ttl_seconds, change_cid=change.change_cid,
            authority_scope_cid=identity.authority_scope_cid,
            logical_request_scope=identity.logical_request_scope,
            intent_fingerprint=identity.intent_fingerprint, reason=sub.reason,
            rolls_back=sub.rolls_back, requester_jkt=requester.key_thumbprint)
        request, created = store.create_request(draft, actor=principal.name, now=self.ctx.now())
        if not created:  # another submission of the same intent won the insert
            return self._repeat(request, identity.intent_fingerprint, sub.request_id), False
        try:
            return request_object(store, self.preparation.prepare(request, decision)), True
        except PilotUnavailable as exc:  # tried again by itself, then failed: say when
            raise self.preparation.defer(request, exc) from None

    def undo(self, principal: Principal, id: str, *, reason: str | None = None,
             request_id: str | None = None, per_row: bool = False
             ) -> tuple[dict[str, Any], bool]:
        """File the undo of request ``id`` (docs/harbour.md "Undo"): a new request with
        ``rolls_back`` set, derived from the rows the original's preview sealed, then
        routed, previewed and approved like any other — ``(request object, created)``.

        Only someone who may see the original may undo it (anyone else is answered as
        for a missing id); ``UndoUnavailable`` when its images cannot give an undo,
        ``UndoConflict`` (the undo stored ``failed``) when a row changed since.
        """
        require(principal, Role.REQUESTER)
        original = self._compensated(principal, id)
        body = undo_submission(original, self.ctx.pilot(original.pilot_id),
                               reason=bounded_reason(reason), request_id=request_id,
                               per_row=per_row)
        try:
            return self.submit(principal, body, None)
        except IntentConflict as exc:  # the same id holds the undo in its other mode
            raise undo_taken(exc, original.id, per_row) from None

    def _compensated(self, principal: Principal, id: str) -> StoredRequest:
        """The request a compensation names (``rolls_back``), if its requester may see it.

        One they may not see is answered exactly like one that does not exist, so
        ``rolls_back`` can neither reach into another requester's requests nor
        probe for their ids. Whether it can be compensated (its state) is the
        store's check, made with the insert.
        """
        try:
            if not id.startswith("rq_"):
                raise NotFound("not an rq_ id")
            return find(self.ctx.store, principal, id)
        except NotFound:
            raise NotFound(f"rolls_back names no request {id[:64]!r} that you may see",
                           detail={"rolls_back": id[:64]}) from None

    def _repeat(self, active: StoredRequest, fingerprint: str, request_id: str) -> dict[str, Any]:
        if active.intent_fingerprint != fingerprint:
            raise IntentConflict(
                f"request id {request_id[:64]!r} is already used by request {active.id} with a "
                "different change; choose a new request id, or repeat that request's exact "
                "change", detail={"id": active.id, "request": active.id})
        if active.state is S.PREPARING:
            try:
                active = self.preparation.prepare(active, None)
            except PilotUnavailable as exc:
                raise self.preparation.defer(active, exc) from None
        return request_object(self.ctx.store, active)
