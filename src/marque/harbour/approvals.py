"""Approvals (DESIGN §11.3, §11.4): Resolutions on a sealed Checkpoint, and what they decide.

An approver's Resolution is sealed over the Checkpoint and stored once (a
repeat with the same decision and reason is a retry; anything else is refused
with the stored one). When the tally completes, the Checkpoint is revalidated
— the adopted config, the Pilot's incarnation and targets, its expiry — and
the rows are previewed again (:func:`marque.harbour.row_diff.diff_changes`):
only if everything still holds is the marque issued. Two approvers completing
one Checkpoint at once may both get this far; the store's compare-and-set lets
one marque through and the other answers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marque.errors import (
    AlreadyApproved,
    AlreadyRejected,
    Conflict,
    DelegationRejected,
    InvalidInput,
    MarqueError,
    NotFound,
    RequestExpired,
    RevalidationFailed,
    UndoConflict,
)
from marque.harbour.access import find, require
from marque.harbour.checkpoint import (
    CHECKPOINT_EXPIRED,
    Checkpoint,
    Resolution,
    TallyState,
    check_resolution,
    refuse_shared_key,
    require_revalidated,
    revalidate,
    seal_resolution,
    tally,
)
from marque.harbour.context import HarbourContext
from marque.harbour.intake import bounded_reason
from marque.harbour.issuance import approval_for_checkpoint
from marque.harbour.lifecycle import RequestState
from marque.harbour.moves import end, issue
from marque.harbour.principals import Principal, Role
from marque.harbour.request_change import marque_change
from marque.harbour.row_diff import DIFF_CHANGED, diff_changes, refuse_over_budget
from marque.harbour.store.base import AdoptedConfig, PilotRecord, StoredRequest
from marque.harbour.undo import named_conflict
from marque.harbour.views import request_object

__all__ = ["Approvals", "DecisionFacts"]

S = RequestState


class Approvals:
    """Approving and rejecting requests ``awaiting_approval``, and settling their tally."""

    def __init__(self, ctx: HarbourContext) -> None:
        self.ctx = ctx

    def approve(self, principal: Principal, id: str, reason: str | None) -> dict[str, Any]:
        """An approver's approval; completing the Checkpoint revalidates and issues."""
        return self._resolve(principal, id, "approve", bounded_reason(reason))

    def reject(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """An approver's rejection (a reason is required): the request ends ``rejected``."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("a reject needs a reason: say why, so the requester can act on it")
        return self._resolve(principal, id, "reject", bounded_reason(reason))

    def no_longer_holds(self, id: str) -> list[str]:
        """What of an ``awaiting_approval`` request's Checkpoint no longer holds now
        (``checkpoint.revalidate``'s names; [] when an approval could still issue its
        marque). A request in any other state cannot be approved: ``["not_awaiting"]``."""
        request = self.ctx.store.get_request(id)
        if request.state is not S.AWAITING_APPROVAL or request.checkpoint_cid is None:
            return ["not_awaiting"]
        checkpoint, _ = self.sealed(request)
        return revalidate(checkpoint, **self._revalidation_check(request))

    def sealed(self, request: StoredRequest) -> tuple[Checkpoint, list[Resolution]]:
        """The request's sealed Checkpoint and the Resolutions stored on it."""
        assert request.checkpoint_cid is not None
        store = self.ctx.store
        stored = store.get_checkpoint(request.checkpoint_cid)
        checkpoint = Checkpoint.from_body(stored.body, stored.checkpoint_cid)
        resolutions = [Resolution.from_body(r.body, r.resolution_cid)
                       for r in store.resolutions(request.checkpoint_cid)]
        return checkpoint, resolutions

    # -- one Resolution ------------------------------------------------------------------

    def _resolve(self, principal: Principal, id: str, decision: str,
                 reason: str | None) -> dict[str, Any]:
        require(principal, Role.APPROVER)
        request = find(self.ctx.store, principal, id)
        if request.checkpoint_cid is None:
            raise _not_awaiting(request)
        if reason is not None and not reason.strip():
            reason = None
        checkpoint, existing = self.sealed(request)
        mine = [r for r in existing if r.approver == principal.name]
        if mine:
            return self._already(principal, request, mine[0], decision, reason)
        if request.state is not S.AWAITING_APPROVAL:
            raise _not_awaiting(request)
        if decision == "approve":
            refuse_over_budget(request)
        if decision == "approve" and not _self_approval(request):
            refuse_shared_key(principal.key_thumbprint, request.principal,
                              (self.ctx.store.get_principal(request.principal).key_thumbprint,
                               request.requester_jkt), checkpoint.cid)
        now = self.ctx.now()
        resolution = seal_resolution(checkpoint, decision=decision, approver=principal.name,
                                     reason=reason, at=now)
        self._check(principal, request, checkpoint, resolution, existing)
        stored, created = self.ctx.store.add_resolution(
            checkpoint.cid, resolution_cid=resolution.cid, approver=principal.name,
            decision=decision, body=resolution.body, now=now,
            approver_jkt=principal.key_thumbprint)
        if not created:  # a concurrent submission of theirs won
            return self._already(principal, request,
                                 Resolution.from_body(stored.body, stored.resolution_cid),
                                 decision, reason)
        return self._decided(self.settle(self.ctx.store.get_request(request.id),
                                         principal.name))

    def _check(self, principal: Principal, request: StoredRequest, checkpoint: Checkpoint,
               resolution: Resolution, existing: list[Resolution]) -> None:
        """Refuse a Resolution that cannot count (``check_resolution``)."""
        try:
            check_resolution(checkpoint, resolution, requester=request.principal,
                             self_approval_allowed=_self_approval(request),
                             existing=existing)
        except Conflict:
            # Others' Resolutions already decided it: this one is not counted. Finish what
            # their completion may have left undone (a crash between storing the deciding
            # Resolution and issuing), so a decided Checkpoint never stays waiting.
            self.settle(request, principal.name)
            raise
        except RequestExpired as exc:
            ended = end(self.ctx, request, S.EXPIRED, exc, actor=principal.name)
            raise RequestExpired(exc.message, detail={"id": ended.id}) from None

    def _already(self, principal: Principal, request: StoredRequest, mine: Resolution,
                 decision: str, reason: str | None) -> dict[str, Any]:
        """A repeated resolution. The same decision with the same reason is a retry: it is
        answered (completing the Checkpoint if a crash interrupted that). Anything else —
        another reason, or the other decision — would be dropped, so it is refused with
        the stored Resolution (``already_approved`` / ``already_rejected``)."""
        if mine.decision.value != decision or mine.reason != reason:
            # ``at`` as the request object shows it (the stored instant), beside the CID.
            at = next((r.at for r in self.ctx.store.resolutions(mine.checkpoint_cid)
                       if r.resolution_cid == mine.cid), None)
            raise _already_decided(principal, request, mine, at)
        return self._decided(self.settle(request, principal.name))

    def _decided(self, request: StoredRequest) -> dict[str, Any]:
        """The request a Resolution left, or the refusal it ended in.

        An approval whose revalidation failed (or whose Checkpoint expired) issued
        no marque: that is a refusal (``revalidation_failed`` / ``request_expired``,
        exit 3, HTTP 403) whose body carries the request's new state, never a
        success.
        """
        failure = request.failure or {}
        refusal: type[MarqueError] | None = None
        if request.state is S.FAILED and failure.get("code") == RevalidationFailed.code:
            refusal = RevalidationFailed
        elif request.state is S.EXPIRED and failure.get("code") == RequestExpired.code:
            refusal = RequestExpired
        elif request.state is S.FAILED and failure.get("code") == UndoConflict.code:
            refusal = UndoConflict
        if refusal is None:
            return request_object(self.ctx.store, request)
        raise refusal(f"request {request.id} is now {request.state}: "
                      f"{failure.get('message')}",
                      detail={"id": request.id, "state": request.state.value,
                              "failure": request.failure})

    # -- the tally -----------------------------------------------------------------------

    def settle(self, request: StoredRequest, actor: str) -> StoredRequest:
        """Act on the tally of an ``awaiting_approval`` request (else return it as it is):
        a rejection ends it ``rejected``; completed approvals revalidate the Checkpoint,
        compare the rows again, and issue the marque."""
        if request.state is not S.AWAITING_APPROVAL:
            return request
        checkpoint, resolutions = self.sealed(request)
        counted = tally(checkpoint, resolutions, requester=request.principal,
                        self_approval_allowed=_self_approval(request))
        if counted.state is TallyState.PENDING:
            return request
        if counted.state is TallyState.REJECTED:
            return end(self.ctx, request, S.REJECTED, DelegationRejected(
                f"rejected by {counted.rejected_by}: {counted.reject_reason}"), actor=actor)
        failed = self._unrevalidated(request, checkpoint, actor)
        if failed is not None:
            return failed
        max_ttl = (request.routing or {}).get("max_ttl_seconds")
        return issue(self.ctx, request, marque_change(request.change, request.preview),
                     approval=approval_for_checkpoint(checkpoint, counted),
                     checkpoint=checkpoint, max_ttl=max_ttl, actor=actor)

    def _unrevalidated(self, request: StoredRequest, checkpoint: Checkpoint,
                       actor: str) -> StoredRequest | None:
        """The request ended because its approved Checkpoint no longer holds now (expired,
        revalidation failed, or its rows moved since the approvers saw them); None when it
        holds and its marque may be issued."""
        check = self._revalidation_check(request)
        failed = revalidate(checkpoint, **check)
        if failed == [CHECKPOINT_EXPIRED]:
            return end(self.ctx, request, S.EXPIRED, RequestExpired(
                f"checkpoint {checkpoint.cid} expired at {checkpoint.expires_at} before its "
                "approvals completed"), actor=actor)
        if failed:
            try:
                require_revalidated(checkpoint, **check)
            except RevalidationFailed as exc:
                return end(self.ctx, request, S.FAILED, exc, actor=actor)
        # The approvals are for the rows the approvers saw: if they moved since, none carries.
        try:
            moved = diff_changes(self.ctx, request, self.ctx.store.get_pilot(request.pilot_id))
        except UndoConflict as exc:  # a row of this undo changed since its preview
            message, rows = named_conflict(self.ctx.store, request, exc)
            return end(self.ctx, request, S.FAILED, UndoConflict(message), actor=actor,
                       conflicts=rows)
        if moved is None:
            return None
        return end(self.ctx, request, S.FAILED, RevalidationFailed(
            f"checkpoint {checkpoint.cid} no longer holds ({DIFF_CHANGED}: {moved}); no "
            "marque is issued — ask for the change again to get a new preview and "
            "Checkpoint"), actor=actor)

    def _revalidation_check(self, request: StoredRequest) -> dict[str, Any]:
        """What a Checkpoint is revalidated against now (``checkpoint.revalidate``'s inputs)."""
        store = self.ctx.store
        adopted = store.current_routing_config()
        try:
            pilot: PilotRecord | None = store.get_pilot(request.pilot_id)
        except NotFound:
            pilot = None
        return _check_inputs(request, adopted, pilot, self.ctx.now())

    # -- what waits for an approver --------------------------------------------------------

    def decision_facts(self, ids: Sequence[str]) -> dict[str, DecisionFacts]:
        """For each stored request of ``ids`` (an id no request has is left out), what
        deciding on it depends on besides its request object — its routing's
        self-approval, the requester's keys and what of its Checkpoint no longer holds
        (:meth:`no_longer_holds`) — read for all of them at once: a fixed number of store
        queries whatever their number (the console's queue lists every one waiting)."""
        store = self.ctx.store
        stored = store.get_requests(ids)
        parts = store.request_parts(list(stored.values()))
        adopted = store.current_routing_config()
        pilots = {p.pilot_id: p for p in store.list_pilots()}
        keys = _current_keys(store.list_principals())
        now = self.ctx.now()
        facts: dict[str, DecisionFacts] = {}
        for request in stored.values():
            holds = ["not_awaiting"]
            sealed = parts.checkpoints.get(request.checkpoint_cid or "")
            if request.state is S.AWAITING_APPROVAL and sealed is not None:
                checkpoint = Checkpoint.from_body(sealed.body, sealed.checkpoint_cid)
                holds = revalidate(checkpoint, **_check_inputs(
                    request, adopted, pilots.get(request.pilot_id), now))
            facts[request.id] = DecisionFacts(
                self_approval=_self_approval(request),
                requester_keys=frozenset({request.requester_jkt,
                                          keys.get(request.principal)}) - {None},
                no_longer_holds=holds)
        return facts


@dataclass(frozen=True)
class DecisionFacts:
    """What deciding on one request depends on besides its request object."""

    #: Whether its routing lets its requester approve it.
    self_approval: bool
    #: The key thumbprints it was asked with and its requester holds now.
    requester_keys: frozenset[str | None]
    #: What of its Checkpoint no longer holds ([]: an approval could issue its marque).
    no_longer_holds: list[str]


def _check_inputs(request: StoredRequest, adopted: AdoptedConfig | None,
                  pilot: PilotRecord | None, now: float) -> dict[str, Any]:
    return {"adopted_config_cid": None if adopted is None else adopted.config_cid,
            "pilot_id": request.pilot_id,
            "pilot_incarnation": None if pilot is None else pilot.incarnation,
            "target": request.target, "now": now,
            "pilot_targets": None if pilot is None else pilot.targets}


def _current_keys(principals: list[Principal]) -> dict[str, str | None]:
    """Each name's key thumbprint as ``get_principal`` answers it: its unrevoked
    principal's, else its latest revoked one's (``list_principals`` lists by age)."""
    found: dict[str, Principal] = {}
    for principal in principals:
        held = found.get(principal.name)
        if held is None or held.revoked or not principal.revoked:
            found[principal.name] = principal
    return {name: p.key_thumbprint for name, p in found.items()}


def _self_approval(request: StoredRequest) -> bool:
    return bool((request.routing or {}).get("self_approval"))


def _not_awaiting(request: StoredRequest) -> Conflict:
    return Conflict(f"request {request.id} is {request.state}, not awaiting approval",
                    detail={"id": request.id, "state": request.state.value})


def _already_decided(principal: Principal, request: StoredRequest, mine: Resolution,
                     at: float | None) -> Conflict:
    """``already_approved`` / ``already_rejected``: the stored Resolution, which stands."""
    kind = AlreadyApproved if mine.decision.value == "approve" else AlreadyRejected
    said = f" ({mine.reason!r})" if mine.reason else ""
    done = "approved" if kind is AlreadyApproved else "rejected"
    return kind(f"{principal.name} already {done} request {request.id}'s "
                f"Checkpoint at {mine.at}{said}; a Resolution cannot be changed or replaced, "
                "so this one was not recorded",
                detail={"id": request.id, "state": request.state.value,
                        "resolution": {"decision": mine.decision.value, "reason": mine.reason,
                                       "at": at, "resolution_cid": mine.cid}})
