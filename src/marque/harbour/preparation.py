"""A request's preparation (DESIGN §11.2): routed, previewed, then refused, issued or sealed.

A request is ``preparing`` from its submission until :meth:`Preparation.prepare`
takes it on: it is routed by the adopted config (a deny or a no-match ends it
``failed``), an allowed one gets its marque at once, and a delegated one is
previewed by its Pilot and its Checkpoint sealed over that preview
(``awaiting_approval``).

When the Pilot cannot be reached the request would wait there forever unless its
requester repeated it under the same request id — which someone who let the CLI
generate the id never knows to do. So the Harbourmaster tries again by itself on
a bounded schedule (:class:`RetrySchedule`) and then ends the request ``failed``
with ``pilot_unavailable``, saying the next step. Nothing ran: a preview always
rolls back, so failing the request is the truth.

Several ``harbour serve`` processes may share one store, and any of them may
die mid-attempt. The bookkeeping therefore lives in the request's row
(``prepare_attempts``, ``prepare_due``): a process *claims* the next attempt by
a compare-and-set on the request's version that also pushes ``prepare_due`` a
lease ahead, so exactly one process makes each attempt, and an attempt whose
process died is claimed again by another once the lease has passed. A request
no attempt was ever recorded for (its process died before the first answer)
is due once it has been untouched for a lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marque.change import Budget
from marque.errors import (
    AccountConfigInvalid,
    AccountDenied,
    AccountNoMatch,
    InvalidInput,
    MarqueError,
    RevalidationFailed,
    UndoConflict,
)
from marque.harbour.checkpoint import seal_checkpoint
from marque.harbour.context import HarbourContext
from marque.harbour.issuance import approval_for_allow
from marque.harbour.lifecycle import IllegalTransition, RequestState, StaleVersion
from marque.harbour.moves import end, issue
from marque.harbour.pilot_calls import ask_preview, preview_token
from marque.harbour.request_change import RequestChange, stored_change
from marque.harbour.routing import (
    ALLOW,
    Decision,
    approvals_with_caveats,
    parse_config,
    within_caps,
)
from marque.harbour.routing import require_permitted as _require_permitted
from marque.harbour.row_diff import sealed_diff_cid
from marque.harbour.statement_requests import StatementRequest
from marque.harbour.store.base import PilotRecord, StoredRequest
from marque.harbour.undo import named_conflict, refuse_fences
from marque.timefmt import iso_time

__all__ = ["CHECKPOINT_TTL_SECONDS", "DEFAULT_RETRY", "Preparation", "RetrySchedule"]

S = RequestState
#: How long a sealed Checkpoint waits for its approvals by default.
CHECKPOINT_TTL_SECONDS = 86_400
#: Logbook kind of an attempt that could not reach the Pilot and will be tried again.
DEFERRED = "request.preparation_deferred"
_ACTOR = "harbourmaster"


@dataclass(frozen=True)
class RetrySchedule:
    """When a preparation is tried again: ``delays[i]`` seconds after failed attempt
    ``i + 1``; after ``len(delays) + 1`` failed attempts the request ends ``failed``.
    ``lease`` is how long one attempt may take before another process may take it over."""

    delays: tuple[float, ...]
    lease: float = 60.0

    def __post_init__(self) -> None:
        if any(not d > 0 for d in self.delays) or not self.lease > 0:
            raise InvalidInput("preview retry delays and their lease must be positive")

    @classmethod
    def of(cls, delays: Sequence[float], lease: float | None = None) -> RetrySchedule:
        """A schedule of ``delays``; the lease defaults to the longer of 60 s and the
        longest delay."""
        delays = tuple(float(d) for d in delays)
        return cls(delays, max((60.0, *delays)) if lease is None else float(lease))

    @property
    def attempts(self) -> int:
        """Attempts in all, the first (made while the request is submitted) included."""
        return len(self.delays) + 1


#: A few tries over about two minutes: 15 s, 30 s, then 60 s after each failed attempt.
DEFAULT_RETRY = RetrySchedule.of((15, 30, 60))


class Preparation:
    """Routing and preparing requests, and trying again those left ``preparing``."""

    def __init__(self, ctx: HarbourContext, *,
                 checkpoint_ttl_seconds: int = CHECKPOINT_TTL_SECONDS,
                 retry_schedule: RetrySchedule = DEFAULT_RETRY) -> None:
        if checkpoint_ttl_seconds <= 0:
            raise InvalidInput("checkpoint_ttl_seconds must be positive")
        self.ctx = ctx
        self.checkpoint_ttl_seconds = checkpoint_ttl_seconds
        self.retry_schedule = retry_schedule

    # -- routing and preparing -------------------------------------------------------

    def route(self, principal: str, pilot: PilotRecord, target: str,
              change: RequestChange, budget: Budget) -> Decision:
        """Route by the adopted config, re-derived from its source (never a stale parse);
        a budget over the routing's caps is denied (``within_caps``)."""
        adopted = self.ctx.store.current_routing_config()
        if adopted is None:
            raise AccountConfigInvalid("no routing config is adopted: nothing can be routed")
        config = parse_config(adopted.source)
        if config.config_cid != adopted.config_cid:
            raise AccountConfigInvalid(
                f"the adopted routing config {adopted.config_cid} no longer re-derives to its "
                f"CID (it gives {config.config_cid}): nothing is routed by it",
                detail={"config_cid": adopted.config_cid, "derived": config.config_cid})
        dialect = pilot.dialects.get(target)
        if dialect is None:
            raise InvalidInput(f"Pilot {pilot.pilot_id} registered target {target[:64]!r} "
                               "without its dialect; it must register again",
                               detail={"pilot_id": pilot.pilot_id, "target": target[:64]})
        return within_caps(change.route(config, principal, target, dialect),
                           budget.max_rows, budget.executions)

    def prepare(self, request: StoredRequest, decision: Decision | None) -> StoredRequest:
        """Take a ``preparing`` request on: refuse it, issue at once, or seek approval.
        ``decision`` None: resuming, so it is routed again (nothing was sealed yet)."""
        change = stored_change(request.change)
        pilot = self.ctx.pilot(request.pilot_id)
        if decision is None:
            decision = self.route(request.principal, pilot, request.target, change,
                                  Budget.from_claim(request.budget))
            if decision.permitted and decision.all_read != change.read_only:
                return end(self.ctx, request, S.FAILED, RevalidationFailed(
                    "the routing decision changed while the request was being prepared; "
                    "ask again"), actor=request.principal, routing=decision.to_dict())
        if not decision.permitted:
            self._refuse(request, decision)
        if decision.outcome == ALLOW:
            preview = None
            if change.marque_names_preview:
                preview, _ = self._preview(request, change, pilot, decision)
            return issue(self.ctx, request, change.marque_change(preview),
                         approval=approval_for_allow(decision.config_cid),
                         max_ttl=decision.max_ttl_seconds, actor=request.principal,
                         routing=decision.to_dict(), preview=preview)
        preview, preview_cid = self._preview(request, change, pilot, decision)
        self._refuse_conflicts(request, change, preview, decision)
        return self._seal(request, pilot, decision, preview,
                          change.marque_change(preview).change_cid, preview_cid)

    def _refuse(self, request: StoredRequest, decision: Decision) -> None:
        """End a denied or unmatched request ``failed`` and raise its refusal, naming it."""
        routing = decision.to_dict()
        try:
            _require_permitted(decision)
        except (AccountDenied, AccountNoMatch) as refusal:
            failed = end(self.ctx, request, S.FAILED, refusal, actor=request.principal,
                         routing=routing)
            raise type(refusal)(refusal.message,
                                detail={"id": failed.id, "routing": routing}) from None

    def _preview(self, request: StoredRequest, change: RequestChange, pilot: PilotRecord,
                 decision: Decision) -> tuple[dict[str, Any], str]:
        """The change's preview from its Pilot, checked to be this request's:
        ``(the preview to store, the preview_cid to seal)``. A refusal in
        ``change.preview_refusals`` or a foreign preview ends the request ``failed``."""
        token = preview_token(self.ctx, request, change, pilot)
        try:
            return change.previewed(ask_preview(self.ctx, pilot, token), pilot,
                                    request.target)
        except change.preview_refusals as exc:
            failed = end(self.ctx, request, S.FAILED, exc, actor=request.principal,
                         routing=decision.to_dict())
            raise change.refused(exc, failed.id) from None

    def _refuse_conflicts(self, request: StoredRequest, change: RequestChange,
                          preview: dict[str, Any], decision: Decision) -> None:
        """End ``request`` ``failed`` with ``undo_conflict`` (by key) when a fenced statement
        of it touched another number of rows than it expects in ``preview``."""
        if not isinstance(change, StatementRequest):
            return
        try:
            refuse_fences(change.change, preview)
        except UndoConflict as exc:
            message, rows = named_conflict(self.ctx.store, request, exc)
            failed = end(self.ctx, request, S.FAILED, UndoConflict(message),
                         actor=request.principal, conflicts=rows,
                         routing=decision.to_dict(), preview=preview)
            raise UndoConflict(message, detail={"id": failed.id, "conflicts": rows}) from None

    def _seal(self, request: StoredRequest, pilot: PilotRecord, decision: Decision,
              preview: dict[str, Any], change_cid: str, preview_cid: str) -> StoredRequest:
        """Seal the Checkpoint over ``preview`` (``awaiting_approval``), or lose the race."""
        decision = approvals_with_caveats(decision, preview)  # two_approvers, DESIGN §11.3
        now = self.ctx.now()
        checkpoint = seal_checkpoint(
            logical_request_scope=request.logical_request_scope,
            intent_fingerprint=request.intent_fingerprint, change_cid=change_cid,
            preview_cid=preview_cid, config_cid=decision.config_cid,
            approvals=decision.approvals, pilot_id=pilot.pilot_id,
            incarnation=pilot.incarnation, target=request.target,
            expires_at=now + self.checkpoint_ttl_seconds, diff_cid=sealed_diff_cid(preview))
        try:
            return self.ctx.store.seal_checkpoint(
                request.id, request.version, checkpoint_cid=checkpoint.cid,
                body=checkpoint.body, expires_at=float(checkpoint.expires_at_epoch),
                actor=request.principal, now=now, kind="checkpoint.sealed",
                routing=decision.to_dict(), preview=preview,
                **({"failure": None} if request.failure else {}))
        except StaleVersion:
            return self.ctx.store.get_request(request.id)

    # -- trying again ------------------------------------------------------------------

    def defer(self, request: StoredRequest, exc: MarqueError, *,
              claimed: bool = False) -> MarqueError:
        """Record an attempt at preparing ``request`` that left it ``preparing`` because of
        ``exc``; the error to answer for it (``exc``'s class, naming the request).

        ``claimed``: the attempt was claimed (already counted); otherwise it is counted
        now (a submission's own attempt). Past the schedule the request ends ``failed``
        with ``exc``'s code and a message saying to ask again once the Pilot is up.
        """
        schedule = self.retry_schedule
        attempts = request.prepare_attempts if claimed else request.prepare_attempts + 1
        now = self.ctx.now()
        kind = type(exc)
        if attempts >= schedule.attempts:
            message = (f"the preview could not be made after {attempts} attempt(s) "
                       f"({exc.message}); nothing ran. Once Pilot {request.pilot_id} is up, "
                       "ask for the change again (`marque request …`, a new request)")
            ended = end(self.ctx, request, S.FAILED, kind(message), actor=_ACTOR)
            return kind(message, detail={"id": ended.id, "state": ended.state.value,
                                         "attempt": attempts})
        due = now + schedule.delays[attempts - 1]
        left = schedule.attempts - attempts
        noted = self._note_deferred(request, exc, attempts, due, now)
        detail: dict[str, Any] = {"id": noted.id, "state": noted.state.value,
                                  "attempt": attempts, "next_attempt_at": due}
        return kind(f"{exc.message}; request {request.id} waits `preparing`: the "
                    f"Harbourmaster tries its preview again at {iso_time(due)} ({left} more "
                    f"attempt(s)), then fails it (`marque requests show {request.id}`)",
                    detail=detail)

    def _note_deferred(self, request: StoredRequest, exc: MarqueError, attempts: int, due: float,
                       now: float) -> StoredRequest:
        """Store that attempt ``attempts`` failed and when the next one is due."""
        left = self.retry_schedule.attempts - attempts
        failure = {"code": exc.code,
                   "message": f"attempt {attempts} of {self.retry_schedule.attempts} at the "
                              f"preview failed ({exc.message}); the Harbourmaster tries again "
                              f"at {iso_time(due)} ({left} more attempt(s)), then fails the "
                              "request"}
        try:
            return self.ctx.store.note_preparation(
                request.id, request.version, attempts=attempts, due=due, failure=failure,
                actor=_ACTOR, now=now, kind=DEFERRED)
        except (StaleVersion, IllegalTransition):  # another attempt moved it meanwhile
            return self.ctx.store.get_request(request.id)

    def retry_due(self) -> int:
        """Claim and make every due attempt at a ``preparing`` request; how many were made.

        A claim lost to another process (or to the request moving on) is skipped. An
        attempt that fails again is recorded by :meth:`defer`; one the core stored
        as refused (``preview_failed``, a deny) is left as it is.
        """
        schedule = self.retry_schedule
        now = self.ctx.now()
        made = 0
        store = self.ctx.store
        for request in store.preparations_due(now, untouched_since=now - schedule.lease):
            try:
                mine = store.note_preparation(
                    request.id, request.version, attempts=request.prepare_attempts + 1,
                    due=now + schedule.lease, failure=request.failure, actor=_ACTOR, now=now)
            except (StaleVersion, IllegalTransition):
                continue
            made += 1
            try:
                self.prepare(mine, None)
            except MarqueError as exc:
                current = store.get_request(mine.id)
                if current.state is S.PREPARING and current.version == mine.version:
                    self.defer(mine, exc, claimed=True)
        return made
