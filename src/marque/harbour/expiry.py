"""Ending a request that never ran, or settling one nobody knows about (ADR-038, §11.5).

An admin expires a request whose Checkpoint expired unapproved, or a
``prepared`` one whose marque provably never ran — the Pilot's evidence says
no claim and no stamp, the marque is past its ``exp`` plus the clock skew, and
no report was recorded (the store checks all of it with the move). A
``reconciliation`` request is settled only from the stamps its target holds:
a stamp of its marque says it ran; none on a reachable target after its
``exp`` says it never did.
"""

from __future__ import annotations

import math
from typing import Any

from marque.errors import Conflict, InvalidInput, RequestExpired
from marque.harbour.access import find, require
from marque.harbour.context import HarbourContext
from marque.harbour.intake import bounded_reason
from marque.harbour.lifecycle import RequestState, StaleVersion
from marque.harbour.moves import end, failure
from marque.harbour.pilot_calls import ask_evidence
from marque.harbour.principals import Principal, Role
from marque.harbour.store.base import StoredRequest
from marque.harbour.views import request_object

__all__ = ["SKEW_SECONDS", "Expiry"]

S = RequestState
#: Clock skew allowed between this Harbourmaster and its Pilots when a marque's expiry
#: decides something (the Pilots' own default).
SKEW_SECONDS = 60.0


class Expiry:
    """The admin's expiry and the settlement of ``reconciliation`` requests from stamps."""

    def __init__(self, ctx: HarbourContext, *, skew_seconds: float = SKEW_SECONDS) -> None:
        self.ctx = ctx
        self.skew_seconds = skew_seconds

    def expire(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """The admin's expiry (ADR-038): of an expired Checkpoint's request, of a prepared
        request whose marque provably never ran (the Pilot's evidence), or settling a
        ``reconciliation`` request from stamps."""
        require(principal, Role.ADMIN)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("expiring a request needs a reason")
        bounded_reason(reason)
        request = find(self.ctx.store, principal, id)
        now = self.ctx.now()
        if request.state is S.AWAITING_APPROVAL:
            return self._expire_checkpoint(principal, request, reason, now)
        if request.state is S.PREPARED:
            exp = request.marque_expires_at if request.marque_expires_at is not None \
                else math.inf
            # An unexpired marque is refused by the store before any evidence is read, so
            # the Pilot is asked only when its answer can matter.
            evidence = ask_evidence(self.ctx, request) if now >= exp + self.skew_seconds \
                else {}
            return request_object(self.ctx.store, self.ctx.store.expire_prepared(
                request.id, request.version, evidence=evidence, now=now,
                skew_seconds=self.skew_seconds, marque_exp=exp, reason=reason,
                actor=principal.name))
        if request.state is S.RECONCILIATION:
            return self.settle_from_stamps(request.id)
        raise Conflict(f"request {request.id} is {request.state}: there is nothing to expire",
                       detail={"id": request.id, "state": request.state.value,
                               "reason": "not_expirable"})

    def _expire_checkpoint(self, principal: Principal, request: StoredRequest, reason: str,
                           now: float) -> dict[str, Any]:
        """End a request whose Checkpoint expired unapproved; ``conflict`` while it is open."""
        assert request.checkpoint_cid is not None
        sealed = self.ctx.store.get_checkpoint(request.checkpoint_cid)
        if now < sealed.expires_at:
            raise Conflict(f"request {request.id}'s Checkpoint is open until "
                           f"{sealed.expires_at}: it cannot be expired yet",
                           detail={"id": request.id, "reason": "checkpoint_unexpired"})
        return request_object(self.ctx.store, end(self.ctx, request, S.EXPIRED,
                                                   RequestExpired(reason),
                                                   actor=principal.name))

    def settle_from_stamps(self, id: str) -> dict[str, Any]:
        """Settle a ``reconciliation`` request from the stamps its target holds (§11.5).

        A stamp of its marque → ``verified``; none on a reachable target and the
        marque past its ``exp`` (plus skew) → ``expired``; otherwise it stays.
        Any other state is answered as it is. ``PilotUnavailable`` if the Pilot
        cannot be asked.
        """
        store = self.ctx.store
        request = store.get_request(id)
        if request.state is not S.RECONCILIATION or request.marque_id is None:
            return request_object(store, request)
        evidence = ask_evidence(self.ctx, request)
        pilot = evidence.get("pilot")
        if evidence.get("marque_id") != request.marque_id or not isinstance(pilot, dict) \
                or pilot.get("id") != request.pilot_id:
            return request_object(store, request)
        stamps = [s for s in evidence.get("stamps") or []
                  if isinstance(s, dict) and s.get("marque_id", request.marque_id)
                  == request.marque_id]
        # Only an applied stamp (of a nonce, or of an Effect Set's row) says it ran; a
        # tombstone says that attempt, or that row, never did and now never can.
        applied = [s for s in stamps if s.get("kind", "applied") == "applied"]
        now = self.ctx.now()
        seen = {"stamps": len(stamps), "applied_stamps": len(applied),
                "target_reachable": evidence.get("target_reachable"), "pilot": pilot}
        updates: dict[str, Any] = {}
        if applied:
            to = S.VERIFIED
        elif (evidence.get("target_reachable") is True and request.marque_expires_at is not None
              and now >= request.marque_expires_at + self.skew_seconds):
            to = S.EXPIRED
            updates["failure"] = failure(RequestExpired(
                "no stamp of its marque on a reachable target, and the marque has expired: "
                "it never ran"))
        else:
            return request_object(store, request)
        try:
            moved = store.transition(request.id, request.version, to, actor="harbourmaster",
                                     now=now, reason="settled from the target's stamps",
                                     kind="reconciliation.settled", body={"evidence": seen},
                                     **updates)
        except StaleVersion:
            moved = store.get_request(request.id)
        return request_object(store, moved)
