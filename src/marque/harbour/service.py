"""The Harbourmaster's synchronous core (DESIGN §11): every endpoint's behaviour, once.

The HTTP service, the CLI and tests call :class:`Harbourmaster`; each method
checks the caller's roles itself (§11.7), so every caller gets the same rules,
and raises only :class:`~marque.errors.MarqueError` subclasses.

Nothing here is guarded by a lock in this process. Every change of state is one
store operation — a compare-and-set on the request's version with its logbook
entry in the same transaction — so several processes on one PostgreSQL store
behave as one Harbourmaster. Where two callers race (two approvals completing
one Checkpoint, two retries resuming one preparation), both may do the work
(sign a marque, ask for a preview) but only the first compare-and-set stores
it; the loser reads the request again and answers what is stored. A marque
that lost is never stored nor handed out, so exactly one marque exists per
request.

Contacting a Pilot (previews, evidence) happens between store operations,
never inside a transaction: an unreachable Pilot is ``pilot_unavailable`` and
leaves the request where it was, for a retry to resume.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from typing import Any

from marque.change import AnyChange, Budget
from marque.clients.pilot import PilotClient
from marque.errors import (
    AccountConfigInvalid,
    AccountDenied,
    AccountNoMatch,
    AlreadyApproved,
    AlreadyRejected,
    Conflict,
    Forbidden,
    InvalidInput,
    MarqueError,
    NotFound,
    PilotUnavailable,
    RequestExpired,
    RevalidationFailed,
    Unauthenticated,
    UndoConflict,
    UnknownTarget,
)
from marque.harbour.checkpoint import (
    CHECKPOINT_EXPIRED,
    Checkpoint,
    Resolution,
    TallyState,
    check_resolution,
    refuse_shared_key,
    require_revalidated,
    revalidate,
    seal_checkpoint,
    seal_resolution,
    tally,
)
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.identity import authority_scope_cid, logical_request_scope
from marque.harbour.intake import read_registration, read_submission
from marque.harbour.issuance import Issuer, approval_for_allow, approval_for_checkpoint, check_ttl
from marque.harbour.lifecycle import TERMINAL, IntentConflict, RequestState, StaleVersion
from marque.harbour.oidc.signin import CLI_TOKEN_PREFIX
from marque.harbour.preparation import DEFAULT_RETRY, RetrySchedule, defer, retry_due
from marque.harbour.principals import Principal, Role
from marque.harbour.reports import ingest
from marque.harbour.request_change import RequestChange, marque_change, stored_change
from marque.harbour.routing import (
    ALLOW,
    DELEGATE,
    Decision,
    approvals_with_caveats,
    parse_config,
    within_caps,
)
from marque.harbour.routing import require_permitted as _require_permitted
from marque.harbour.row_diff import DIFF_CHANGED, diff_changes, refuse_over_budget, sealed_diff_cid
from marque.harbour.statement_requests import StatementRequest
from marque.harbour.store.base import HarbourStore, PilotRecord, Request, RequestDraft
from marque.harbour.undo import named_conflict, refuse_fences, undo_submission, undo_taken
from marque.harbour.views import (
    page_cursor,
    pilot_object,
    read_cursor,
    request_object,
    request_objects,
)
from marque.logbook.heads import sign_head
from marque.token import unverified_claims

S = RequestState
#: How long a sealed Checkpoint waits for its approvals by default.
CHECKPOINT_TTL_SECONDS = 86_400
#: Sample rows a preview shows per statement.
PREVIEW_SAMPLE_ROWS = 5
#: Clock skew allowed between this Harbourmaster and its Pilots when a marque's expiry
#: decides something (the Pilots' own default).
SKEW_SECONDS = 60.0
#: The most logbook entries one page holds.
MAX_LOGBOOK_PAGE = 1000
#: The longest reason an approval, a rejection or an expiry may carry (as a request's own).
REASON_CHARS = 4096
#: The largest sequence number a logbook read may start after (the stores' 64-bit column).
MAX_SEQ = 2**63 - 1

_READERS = (Role.APPROVER, Role.AUDITOR, Role.ADMIN)


#: Who may ask for a change and see it through: a requester, or an agent (docs/agents.md).
_ASKERS = (Role.REQUESTER, Role.AGENT)


def _require(principal: Principal, *roles: Role) -> None:
    """Refuse a principal holding none of ``roles`` (403, never 404: it is authenticated).

    An agent is refused everything not naming :data:`Role.AGENT` whatever else it holds,
    so no role added beside it can ever let it approve, expire or administer."""
    if principal.has(Role.AGENT) and Role.AGENT not in roles:
        raise Forbidden(f"{principal.name} is an agent: agents may request, read their own "
                        "requests and execute their own marques, and nothing else; a "
                        "human with the role " + " or ".join(r.value for r in roles)
                        + " does this", detail={"principal": principal.name,
                                                "roles": sorted(r.value for r in roles)})
    if not any(principal.has(role) for role in roles):
        raise Forbidden(f"{principal.name} may not do this: it needs the role "
                        f"{' or '.join(r.value for r in roles)}",
                        detail={"principal": principal.name,
                                "roles": sorted(r.value for r in roles)})


def _failure(code: str, message: str,
             conflicts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    failure: dict[str, Any] = {"code": code, "message": message}
    if conflicts is not None:  # an undo_conflict: the rows, by key
        failure["conflicts"] = conflicts
    return failure


class Harbourmaster:
    """One Harbourmaster: its store, its issuer, and the flow of DESIGN §11."""

    def __init__(self, store: HarbourStore, issuer: Issuer, *,
                 clock: Callable[[], float] = time.time,
                 pilot_client_factory: Callable[[str], PilotClient] | None = None,
                 checkpoint_ttl_seconds: int = CHECKPOINT_TTL_SECONDS,
                 skew_seconds: float = SKEW_SECONDS,
                 retry_schedule: RetrySchedule = DEFAULT_RETRY) -> None:
        self.store = store
        self.issuer = issuer
        self.clock = clock
        self.pilot_client_factory = pilot_client_factory or (lambda url: PilotClient(url))
        if checkpoint_ttl_seconds <= 0:
            raise InvalidInput("checkpoint_ttl_seconds must be positive")
        self.checkpoint_ttl_seconds = checkpoint_ttl_seconds
        self.skew_seconds = skew_seconds
        #: When a preparation that could not reach its Pilot is tried again (preparation.py).
        self.retry_schedule = retry_schedule

    @classmethod
    def open(cls, home: HarbourHome, *,
             retry_schedule: RetrySchedule = DEFAULT_RETRY) -> Harbourmaster:
        """The Harbourmaster of a home: its store (opened, migrated) and its issuer key."""
        config = home.load()
        key = home.issuer_key()
        store = open_home_store(home, config)
        try:
            return cls(store, Issuer(key, config.issuer), retry_schedule=retry_schedule)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    def _now(self) -> float:
        return float(self.clock())

    # -- principals -----------------------------------------------------------------

    def authenticate(self, token: str | None) -> Principal:
        """The principal holding ``token``; ``Unauthenticated`` if none, unknown or revoked."""
        if not token:
            raise Unauthenticated("send `Authorization: Bearer <token>`: this endpoint needs "
                                  "a principal's token")
        if token.startswith(CLI_TOKEN_PREFIX):  # `marque login --oidc`: a short-lived session
            return self._signed_in(token)
        return self.store.authenticate(token)

    def _signed_in(self, token: str) -> Principal:
        """The principal of a command line's sign-in token, with the roles it was granted."""
        session, principal = self.store.get_session(
            hashlib.sha256(token.encode("utf-8")).hexdigest(), now=self._now())
        if session.via != "cli":
            raise Unauthenticated("the token is not one this Harbourmaster issued")
        return principal

    def whoami(self, principal: Principal) -> dict[str, Any]:
        """Whom a token authenticates: ``{name, roles, key_thumbprint, harbour_id}`` (never
        the token, nor anything only an admin may see)."""
        return {"name": principal.name, "roles": sorted(r.value for r in principal.roles),
                "key_thumbprint": principal.key_thumbprint,
                "harbour_id": self.store.harbour_id}

    # -- reading requests ---------------------------------------------------------------

    def _visible(self, principal: Principal, request: Request) -> bool:
        if any(principal.has(role) for role in _READERS):
            return True
        return any(principal.has(role) for role in _ASKERS) \
            and request.principal == principal.name

    def _find(self, principal: Principal, id_or_request_id: str) -> Request:
        """A request the caller may see, by ``rq_`` id or by the caller's own request id.

        A caller's request id resolves in the caller's scope to its active request if
        there is one, else to the most recent one in its history (failed, expired, …): an
        id keeps answering with its latest request whatever its state. Another
        requester's request is ``NotFound``, exactly like a missing one, so request ids
        never leak.
        """
        if not isinstance(id_or_request_id, str) or not id_or_request_id:
            raise NotFound("no such request")
        if id_or_request_id.startswith("rq_"):
            try:
                request = self.store.get_request(id_or_request_id)
            except NotFound:
                request = None
        else:
            try:
                scope = logical_request_scope(
                    authority_scope_cid(self.store.harbour_id, principal.name),
                    id_or_request_id)
            except MarqueError:
                scope = None
            request = None if scope is None else (
                self.store.find_active(scope) or next(
                    reversed(self.store.find_history(scope)), None))
        if request is None or not self._visible(principal, request):
            raise NotFound(f"no request {id_or_request_id[:64]!r} that you may see",
                           detail={"id": id_or_request_id[:64]})
        return request

    def _object(self, request: Request) -> dict[str, Any]:
        return request_object(self.store, request)

    def list_requests(self, principal: Principal, state: str | None = None) -> list[dict[str, Any]]:
        """Requests newest first (a requester sees only their own), optionally of one state."""
        _require(principal, *_ASKERS, *_READERS)
        only = None if any(principal.has(role) for role in _READERS) else principal.name
        return request_objects(self.store, self.store.list_requests(state, principal=only))

    def request_counts(self, principal: Principal) -> dict[str, int]:
        """How many of the requests this principal may see each state holds."""
        _require(principal, *_ASKERS, *_READERS)
        only = None if any(principal.has(role) for role in _READERS) else principal.name
        return self.store.count_requests(only)

    def requests_page(self, principal: Principal, state: str | None = None, *,
                      limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        """One page of :meth:`list_requests`: ``{requests, next}``, at most ``limit``
        requests after ``cursor`` (None: the newest); ``next`` is the cursor of the page
        after, or None on the last page."""
        _require(principal, *_ASKERS, *_READERS)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be at least 1")
        before = None if cursor is None else read_cursor(cursor)
        only = None if any(principal.has(role) for role in _READERS) else principal.name
        found = self.store.list_requests(state, principal=only, limit=limit + 1,
                                         before=before)
        shown = found[:limit]
        more = len(found) > limit
        return {"requests": request_objects(self.store, shown),
                "next": page_cursor(shown[-1]) if more else None}

    def get_request(self, principal: Principal, id_or_request_id: str) -> dict[str, Any]:
        """One request object: by ``rq_`` id, or the caller's own request id (its active
        request, else its most recent one)."""
        _require(principal, *_ASKERS, *_READERS)
        return self._object(self._find(principal, id_or_request_id))

    def marque_for(self, principal: Principal, id: str) -> dict[str, Any]:
        """The marque of the caller's own request, with where to execute it."""
        # Anyone but its requester is told there is no such request: ids never leak.
        if not any(principal.has(role) for role in _ASKERS):
            raise NotFound(f"no request {id[:64]!r} that you may see", detail={"id": id[:64]})
        request = self._find(principal, id)
        if request.principal != principal.name:
            raise NotFound(f"no request {id[:64]!r} that you may see", detail={"id": id[:64]})
        if request.marque is None:
            raise Conflict(f"request {request.id} is {request.state}: no marque has been issued "
                           "for it", detail={"id": request.id, "state": request.state.value})
        if request.state in TERMINAL:
            # A terminal request's marque is never handed out again: an execution of it could
            # change the target under a request whose state can no longer say so.
            failure = request.failure or {}
            raise Conflict(
                f"request {request.id} is {request.state}: its marque is not handed out again"
                + (f" ({failure.get('code')}: {failure.get('message')})" if failure else ""),
                detail={"id": request.id, "state": request.state.value,
                        "failure": request.failure})
        pilot = self.store.get_pilot(request.pilot_id)
        claims = unverified_claims(request.marque) or {}
        incarnation = (claims.get("pilot") or {}).get("incarnation")
        return {"marque": request.marque, "marque_id": request.marque_id,
                "expires_at": request.marque_expires_at,
                "pilot": {"id": pilot.pilot_id, "url": pilot.url, "incarnation": incarnation},
                "target": request.target}

    # -- submitting -----------------------------------------------------------------------

    def submit(self, principal: Principal, body: dict[str, Any],
               idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """Accept a request (DESIGN §11.2): ``(request object, created)``.

        A repeat of the active request's intent answers it (resuming a
        preparation left ``preparing``); another intent under the same id is
        ``IntentConflict``. Deny and no-match are stored ``failed`` and raised
        with ``detail["id"]``; so is a refused preview (``preview_failed``).
        """
        _require(principal, *_ASKERS)
        sub = read_submission(body, idempotency_key)
        if sub.rolls_back is not None:
            self._compensated(principal, sub.rolls_back)
        identity = sub.change.identity(self.store.harbour_id, principal.name, sub.request_id,
                                       sub.budget, sub.ttl_seconds, sub.pilot_id, sub.target)
        active = self.store.find_active(identity.logical_request_scope)
        if active is not None:
            return self._repeat(active, identity.intent_fingerprint, sub.request_id), False
        pilot = self._pilot(sub.pilot_id)
        if sub.target not in pilot.targets:
            raise UnknownTarget(f"Pilot {pilot.pilot_id} does not serve a target named "
                                f"{sub.target[:64]!r}", detail={"pilot_id": pilot.pilot_id,
                                                                "target": sub.target[:64]})
        requester = self.store.get_principal(principal.name)
        if requester.public_jwk is None:
            raise Forbidden(f"principal {principal.name} has no registered public key, so no "
                            "marque can be bound to it: an admin registers one first",
                            detail={"principal": principal.name})
        decision = self._route(principal.name, pilot, sub.target, sub.change, sub.budget)
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
        request, created = self.store.create_request(draft, actor=principal.name,
                                                     now=self._now())
        if not created:  # another submission of the same intent won the insert
            return self._repeat(request, identity.intent_fingerprint, sub.request_id), False
        try:
            return self._object(self._prepare(request, decision)), True
        except PilotUnavailable as exc:  # tried again by itself, then failed: say when
            raise defer(self, request, exc) from None

    def _compensated(self, principal: Principal, id: str) -> Request:
        """The request a compensation names (``rolls_back``), if its requester may see it.

        One they may not see is answered exactly like one that does not exist, so
        ``rolls_back`` can neither reach into another requester's requests nor
        probe for their ids. Whether it can be compensated (its state) is the
        store's check, made with the insert.
        """
        try:
            if not id.startswith("rq_"):
                raise NotFound("not an rq_ id")
            return self._find(principal, id)
        except NotFound:
            raise NotFound(f"rolls_back names no request {id[:64]!r} that you may see",
                           detail={"rolls_back": id[:64]}) from None

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
        _require(principal, Role.REQUESTER)
        original = self._compensated(principal, id)
        body = undo_submission(original, self._pilot(original.pilot_id),
                               reason=_bounded(reason), request_id=request_id, per_row=per_row)
        try:
            return self.submit(principal, body, None)
        except IntentConflict as exc:  # the same id holds the undo in its other mode
            raise undo_taken(exc, original.id, per_row) from None

    def _refuse_conflicts(self, request: Request, change: RequestChange,
                          preview: dict[str, Any], decision: Decision) -> None:
        """End ``request`` ``failed`` with ``undo_conflict`` (by key) when a fenced statement
        of it touched another number of rows than it expects in ``preview``."""
        if not isinstance(change, StatementRequest):
            return
        try:
            refuse_fences(change.change, preview)
        except UndoConflict as exc:
            message, rows = named_conflict(self.store, request, exc)
            failed = self._end(request, S.FAILED, exc.code, message, actor=request.principal,
                               conflicts=rows, routing=decision.to_dict(), preview=preview)
            raise UndoConflict(message, detail={"id": failed.id, "conflicts": rows}) from None

    def _repeat(self, active: Request, fingerprint: str, request_id: str) -> dict[str, Any]:
        if active.intent_fingerprint != fingerprint:
            raise IntentConflict(
                f"request id {request_id[:64]!r} is already used by request {active.id} with a "
                "different change; choose a new request id, or repeat that request's exact "
                "change", detail={"id": active.id, "request": active.id})
        if active.state is S.PREPARING:
            try:
                active = self._prepare(active, None)
            except PilotUnavailable as exc:
                raise defer(self, active, exc) from None
        return self._object(active)

    def retry_preparations(self) -> int:
        """Make every due attempt at a request left ``preparing`` (its Pilot could not be
        reached), each claimed by compare-and-set; how many were made (preparation.py)."""
        return retry_due(self)

    def _pilot(self, pilot_id: str) -> PilotRecord:
        try:
            return self.store.get_pilot(pilot_id)
        except NotFound:
            raise InvalidInput(f"no Pilot {pilot_id[:64]!r} is registered with this "
                               "Harbourmaster", detail={"pilot_id": pilot_id[:64]}) from None

    def _route(self, principal: str, pilot: PilotRecord, target: str,
               change: RequestChange, budget: Budget) -> Decision:
        """Route by the adopted config, re-derived from its source (never a stale parse);
        a budget over the routing's caps is denied (``within_caps``)."""
        adopted = self.store.current_routing_config()
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

    def _prepare(self, request: Request, decision: Decision | None) -> Request:
        """Take a ``preparing`` request on: refuse it, issue at once, or seek approval."""
        change = stored_change(request.change)
        pilot = self._pilot(request.pilot_id)
        if decision is None:  # resuming: route again, as nothing was sealed yet
            decision = self._route(request.principal, pilot, request.target, change,
                                   Budget.from_claim(request.budget))
            if decision.permitted and decision.all_read != change.read_only:
                return self._end(request, S.FAILED, "revalidation_failed",
                                 "the routing decision changed while the request was being "
                                 "prepared; ask again", actor=request.principal,
                                 routing=decision.to_dict())
        routing = decision.to_dict()
        if not decision.permitted:
            try:
                _require_permitted(decision)
            except (AccountDenied, AccountNoMatch) as refusal:
                failed = self._end(request, S.FAILED, refusal.code, refusal.message,
                                   actor=request.principal, routing=routing)
                raise type(refusal)(refusal.message,
                                    detail={"id": failed.id, "routing": routing}) from None
        if decision.outcome == ALLOW:
            preview = None
            if change.marque_names_preview:
                preview, _ = self._preview(request, change, pilot, decision)
            return self._issue(request, change.marque_change(preview),
                               approval=approval_for_allow(decision.config_cid),
                               max_ttl=decision.max_ttl_seconds, actor=request.principal,
                               routing=routing, preview=preview)
        preview, preview_cid = self._preview(request, change, pilot, decision)
        self._refuse_conflicts(request, change, preview, decision)
        return self._seal(request, pilot, decision, preview,
                          change.marque_change(preview).change_cid, preview_cid)

    def preview_token(self, request: Request, change: RequestChange, pilot: PilotRecord,
                      sample_rows: int) -> str:
        """A preview token for ``request``'s change on ``pilot``, bounded by its budget."""
        return self.issuer.preview_token(
            pilot_id=pilot.pilot_id, incarnation=pilot.incarnation, target=request.target,
            change=change.preview_change(request.logical_request_scope),
            sample_rows=sample_rows, max_rows=Budget.from_claim(request.budget).max_rows)

    def _preview(self, request: Request, change: RequestChange, pilot: PilotRecord,
                 decision: Decision) -> tuple[dict[str, Any], str]:
        """The change's preview from its Pilot, checked to be this request's:
        ``(the preview to store, the preview_cid to seal)``. A refusal in
        ``change.preview_refusals`` or a foreign preview ends the request ``failed``."""
        token = self.preview_token(request, change, pilot, PREVIEW_SAMPLE_ROWS)
        client = self.pilot_client_factory(pilot.url)
        try:
            return change.previewed(client.preview(token), pilot, request.target)
        except change.preview_refusals as exc:
            failed = self._end(request, S.FAILED, exc.code, exc.message,
                               actor=request.principal, routing=decision.to_dict())
            raise change.refused(exc, failed.id) from None
        finally:
            client.close()

    def _seal(self, request: Request, pilot: PilotRecord, decision: Decision,
              preview: dict[str, Any], change_cid: str, preview_cid: str) -> Request:
        """Seal the Checkpoint over ``preview`` (``awaiting_approval``), or lose the race."""
        decision = approvals_with_caveats(decision, preview)  # two_approvers, DESIGN §11.3
        now = self._now()
        checkpoint = seal_checkpoint(
            logical_request_scope=request.logical_request_scope,
            intent_fingerprint=request.intent_fingerprint, change_cid=change_cid,
            preview_cid=preview_cid, config_cid=decision.config_cid,
            approvals=decision.approvals, pilot_id=pilot.pilot_id,
            incarnation=pilot.incarnation, target=request.target,
            expires_at=now + self.checkpoint_ttl_seconds, diff_cid=sealed_diff_cid(preview))
        try:
            return self.store.seal_checkpoint(
                request.id, request.version, checkpoint_cid=checkpoint.cid,
                body=checkpoint.body, expires_at=float(checkpoint.expires_at_epoch),
                actor=request.principal, now=now, kind="checkpoint.sealed",
                routing=decision.to_dict(), preview=preview,
                **({"failure": None} if request.failure else {}))
        except StaleVersion:
            return self.store.get_request(request.id)

    def _end(self, request: Request, to: RequestState, code: str, message: str, *,
             actor: str, conflicts: list[dict[str, Any]] | None = None,
             **updates: Any) -> Request:
        """Move ``request`` to an end state with its ``failure``; a lost race re-reads."""
        try:
            return self.store.transition(request.id, request.version, to, actor=actor,
                                         now=self._now(), reason=message,
                                         failure=_failure(code, message, conflicts), **updates)
        except StaleVersion:
            return self.store.get_request(request.id)

    def _issue(self, request: Request, change: AnyChange, *, approval: dict[str, Any],
               max_ttl: int | None, actor: str, checkpoint: Checkpoint | None = None,
               routing: dict[str, Any] | None = None,
               preview: dict[str, Any] | None = None) -> Request:
        """Sign the request's marque and store it with ``prepared``, or lose the race."""
        requester = self.store.get_principal(request.principal)
        extra: dict[str, Any] = {} if routing is None else {"routing": routing}
        if preview is not None:
            extra["preview"] = preview
        if requester.revoked:
            return self._end(request, S.FAILED, "revalidation_failed",
                             f"the requester {requester.name} was revoked", actor=actor, **extra)
        pilot = self.store.get_pilot(request.pilot_id)
        try:
            token = self.issuer.marque(
                requester=requester.name, requester_jwk=requester.public_jwk,
                pilot_id=request.pilot_id,
                incarnation=checkpoint.incarnation if checkpoint else pilot.incarnation,
                target=request.target, change=change, budget=Budget.from_claim(request.budget),
                ttl_seconds=request.ttl_seconds, max_ttl_seconds=max_ttl,
                logical_request_scope=request.logical_request_scope, approval=approval,
                checkpoint=checkpoint)
        except (Forbidden, RevalidationFailed, InvalidInput) as exc:
            return self._end(request, S.FAILED, "revalidation_failed", exc.message, actor=actor,
                             **extra)
        claims = unverified_claims(token) or {}
        expires_at = float(claims["exp"])
        try:
            return self.store.transition(
                request.id, request.version, S.PREPARED, actor=actor, now=self._now(),
                kind="marque.issued",
                body={"marque_id": claims["jti"], "expires_at": expires_at,
                      "approval": approval},
                marque_id=claims["jti"], marque=token, marque_expires_at=expires_at, **extra,
                # A preparation that once could not reach its Pilot kept why; now it moved on.
                **({"failure": None} if request.failure and request.state is S.PREPARING
                   else {}))
        except StaleVersion:
            return self.store.get_request(request.id)

    # -- approvals --------------------------------------------------------------------------

    def approve(self, principal: Principal, id: str, reason: str | None) -> dict[str, Any]:
        """An approver's approval; completing the Checkpoint revalidates and issues."""
        return self._resolve(principal, id, "approve", _bounded(reason))

    def reject(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """An approver's rejection (a reason is required): the request ends ``rejected``."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("a reject needs a reason: say why, so the requester can act on it")
        return self._resolve(principal, id, "reject", _bounded(reason))

    def _sealed(self, request: Request) -> tuple[Checkpoint, list[Resolution]]:
        assert request.checkpoint_cid is not None
        stored = self.store.get_checkpoint(request.checkpoint_cid)
        checkpoint = Checkpoint.from_body(stored.body, stored.checkpoint_cid)
        resolutions = [Resolution.from_body(r.body, r.resolution_cid)
                       for r in self.store.resolutions(request.checkpoint_cid)]
        return checkpoint, resolutions

    def _resolve(self, principal: Principal, id: str, decision: str,
                 reason: str | None) -> dict[str, Any]:
        _require(principal, Role.APPROVER)
        request = self._find(principal, id)
        if request.checkpoint_cid is None:
            raise Conflict(f"request {request.id} is {request.state}, not awaiting approval",
                           detail={"id": request.id, "state": request.state.value})
        if reason is not None and not reason.strip():
            reason = None
        checkpoint, existing = self._sealed(request)
        mine = [r for r in existing if r.approver == principal.name]
        if mine:
            return self._already(principal, request, mine[0], decision, reason)
        if request.state is not S.AWAITING_APPROVAL:
            raise Conflict(f"request {request.id} is {request.state}, not awaiting approval",
                           detail={"id": request.id, "state": request.state.value})
        if decision == "approve":
            refuse_over_budget(request)
        now = self._now()
        if decision == "approve" and not self._self_approval(request):
            refuse_shared_key(principal.key_thumbprint, request.principal,
                              (self.store.get_principal(request.principal).key_thumbprint,
                               request.requester_jkt), checkpoint.cid)
        resolution = seal_resolution(checkpoint, decision=decision, approver=principal.name,
                                     reason=reason, at=now)
        try:
            check_resolution(checkpoint, resolution, requester=request.principal,
                             self_approval_allowed=self._self_approval(request),
                             existing=existing)
        except Conflict:
            # Others' Resolutions already decided it: this one is not counted. Finish what
            # their completion may have left undone (a crash between storing the deciding
            # Resolution and issuing), so a decided Checkpoint never stays waiting.
            self._settle(request, principal.name)
            raise
        except RequestExpired as exc:
            ended = self._end(request, S.EXPIRED, "request_expired", exc.message,
                              actor=principal.name)
            raise RequestExpired(exc.message, detail={"id": ended.id}) from None
        stored, created = self.store.add_resolution(
            checkpoint.cid, resolution_cid=resolution.cid, approver=principal.name,
            decision=decision, body=resolution.body, now=now,
            approver_jkt=principal.key_thumbprint)
        if not created:  # a concurrent submission of theirs won
            return self._already(principal, request,
                                 Resolution.from_body(stored.body, stored.resolution_cid),
                                 decision, reason)
        return self._decided(self._settle(self.store.get_request(request.id), principal.name))

    def _already(self, principal: Principal, request: Request, mine: Resolution,
                 decision: str, reason: str | None) -> dict[str, Any]:
        """A repeated resolution. The same decision with the same reason is a retry: it is
        answered (completing the Checkpoint if a crash interrupted that). Anything else —
        another reason, or the other decision — would be dropped, so it is refused with
        the stored Resolution (``already_approved`` / ``already_rejected``)."""
        if mine.decision.value != decision or mine.reason != reason:
            # ``at`` as the request object shows it (the stored instant), beside the CID.
            at = next((r.at for r in self.store.resolutions(mine.checkpoint_cid)
                       if r.resolution_cid == mine.cid), None)
            raise _already_decided(principal, request, mine, at)
        return self._decided(self._settle(request, principal.name))

    def _decided(self, request: Request) -> dict[str, Any]:
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
            return self._object(request)
        raise refusal(f"request {request.id} is now {request.state}: "
                      f"{failure.get('message')}",
                      detail={"id": request.id, "state": request.state.value,
                              "failure": request.failure})

    @staticmethod
    def _self_approval(request: Request) -> bool:
        return bool((request.routing or {}).get("self_approval"))

    def _settle(self, request: Request, actor: str) -> Request:
        """Act on the tally of an ``awaiting_approval`` request (else return it as it is)."""
        if request.state is not S.AWAITING_APPROVAL:
            return request
        checkpoint, resolutions = self._sealed(request)
        counted = tally(checkpoint, resolutions, requester=request.principal,
                        self_approval_allowed=self._self_approval(request))
        if counted.state is TallyState.PENDING:
            return request
        if counted.state is TallyState.REJECTED:
            return self._end(request, S.REJECTED, "delegation_rejected",
                             f"rejected by {counted.rejected_by}: {counted.reject_reason}",
                             actor=actor)
        check = self._revalidation_check(request)
        failed = revalidate(checkpoint, **check)
        if failed == [CHECKPOINT_EXPIRED]:
            return self._end(request, S.EXPIRED, "request_expired",
                             f"checkpoint {checkpoint.cid} expired at {checkpoint.expires_at} "
                             "before its approvals completed", actor=actor)
        if failed:
            try:
                require_revalidated(checkpoint, **check)
            except RevalidationFailed as exc:
                return self._end(request, S.FAILED, exc.code, exc.message, actor=actor)
        # The approvals are for the rows the approvers saw: if they moved since, none carries.
        try:
            moved = diff_changes(self, request, self.store.get_pilot(request.pilot_id),
                                 PREVIEW_SAMPLE_ROWS)
        except UndoConflict as exc:  # a row of this undo changed since its preview
            message, rows = named_conflict(self.store, request, exc)
            return self._end(request, S.FAILED, exc.code, message, actor=actor,
                             conflicts=rows)
        if moved is not None:
            return self._end(
                request, S.FAILED, RevalidationFailed.code,
                f"checkpoint {checkpoint.cid} no longer holds ({DIFF_CHANGED}: {moved}); no "
                "marque is issued — ask for the change again to get a new preview and "
                "Checkpoint", actor=actor)
        max_ttl = (request.routing or {}).get("max_ttl_seconds")
        return self._issue(request, marque_change(request.change, request.preview),
                           approval=approval_for_checkpoint(checkpoint, counted),
                           checkpoint=checkpoint, max_ttl=max_ttl, actor=actor)

    def _revalidation_check(self, request: Request) -> dict[str, Any]:
        """What a Checkpoint is revalidated against now (``checkpoint.revalidate``'s inputs)."""
        adopted = self.store.current_routing_config()
        try:
            pilot: PilotRecord | None = self.store.get_pilot(request.pilot_id)
        except NotFound:
            pilot = None
        return {"adopted_config_cid": None if adopted is None else adopted.config_cid,
                "pilot_id": request.pilot_id,
                "pilot_incarnation": None if pilot is None else pilot.incarnation,
                "target": request.target, "now": self._now(),
                "pilot_targets": None if pilot is None else pilot.targets}

    def no_longer_holds(self, id: str) -> list[str]:
        """What of an ``awaiting_approval`` request's Checkpoint no longer holds now
        (``checkpoint.revalidate``'s names; [] when an approval could still issue its
        marque). A request in any other state cannot be approved: ``["not_awaiting"]``."""
        request = self.store.get_request(id)
        if request.state is not S.AWAITING_APPROVAL or request.checkpoint_cid is None:
            return ["not_awaiting"]
        checkpoint, _ = self._sealed(request)
        return revalidate(checkpoint, **self._revalidation_check(request))

    # -- expiry and settlement ------------------------------------------------------------------

    def expire(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """The admin's expiry (ADR-038): of an expired Checkpoint's request, of a prepared
        request whose marque provably never ran (the Pilot's evidence), or settling a
        ``reconciliation`` request from stamps."""
        _require(principal, Role.ADMIN)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("expiring a request needs a reason")
        _bounded(reason)
        request = self._find(principal, id)
        now = self._now()
        if request.state is S.AWAITING_APPROVAL:
            assert request.checkpoint_cid is not None
            sealed = self.store.get_checkpoint(request.checkpoint_cid)
            if now < sealed.expires_at:
                raise Conflict(f"request {request.id}'s Checkpoint is open until "
                               f"{sealed.expires_at}: it cannot be expired yet",
                               detail={"id": request.id, "reason": "checkpoint_unexpired"})
            return self._object(self._end(request, S.EXPIRED, "request_expired", reason,
                                          actor=principal.name))
        if request.state is S.PREPARED:
            exp = request.marque_expires_at if request.marque_expires_at is not None \
                else math.inf
            # An unexpired marque is refused by the store before any evidence is read, so
            # the Pilot is asked only when its answer can matter.
            evidence = self._evidence(request) if now >= exp + self.skew_seconds else {}
            return self._object(self.store.expire_prepared(
                request.id, request.version, evidence=evidence, now=now,
                skew_seconds=self.skew_seconds, marque_exp=exp, reason=reason,
                actor=principal.name))
        if request.state is S.RECONCILIATION:
            return self.settle_from_stamps(request.id)
        raise Conflict(f"request {request.id} is {request.state}: there is nothing to expire",
                       detail={"id": request.id, "state": request.state.value,
                               "reason": "not_expirable"})

    def _evidence(self, request: Request) -> dict[str, Any]:
        """The Pilot's evidence for the request's marque, fetched with a query token."""
        assert request.marque_id is not None
        pilot = self.store.get_pilot(request.pilot_id)
        token = self.issuer.query_token(pilot_id=pilot.pilot_id, marque_id=request.marque_id)
        client = self.pilot_client_factory(pilot.url)
        try:
            return client.evidence(request.marque_id, token)
        finally:
            client.close()

    def settle_from_stamps(self, request_id: str) -> dict[str, Any]:
        """Settle a ``reconciliation`` request from the stamps its target holds (§11.5).

        A stamp of its marque → ``verified``; none on a reachable target and the
        marque past its ``exp`` (plus skew) → ``expired``; otherwise it stays.
        Any other state is answered as it is. ``PilotUnavailable`` if the Pilot
        cannot be asked.
        """
        request = self.store.get_request(request_id)
        if request.state is not S.RECONCILIATION or request.marque_id is None:
            return self._object(request)
        evidence = self._evidence(request)
        pilot = evidence.get("pilot")
        if evidence.get("marque_id") != request.marque_id or not isinstance(pilot, dict) \
                or pilot.get("id") != request.pilot_id:
            return self._object(request)
        stamps = [s for s in evidence.get("stamps") or []
                  if isinstance(s, dict) and s.get("marque_id", request.marque_id)
                  == request.marque_id]
        # Only an applied stamp (of a nonce, or of an Effect Set's row) says it ran; a
        # tombstone says that attempt, or that row, never did and now never can.
        applied = [s for s in stamps if s.get("kind", "applied") == "applied"]
        now = self._now()
        seen = {"stamps": len(stamps), "applied_stamps": len(applied),
                "target_reachable": evidence.get("target_reachable"), "pilot": pilot}
        updates: dict[str, Any] = {}
        if applied:
            to = S.VERIFIED
        elif (evidence.get("target_reachable") is True and request.marque_expires_at is not None
              and now >= request.marque_expires_at + self.skew_seconds):
            to = S.EXPIRED
            updates["failure"] = _failure("request_expired",
                                          "no stamp of its marque on a reachable target, and "
                                          "the marque has expired: it never ran")
        else:
            return self._object(request)
        try:
            moved = self.store.transition(request.id, request.version, to, actor="harbourmaster",
                                          now=now, reason="settled from the target's stamps",
                                          kind="reconciliation.settled",
                                          body={"evidence": seen}, **updates)
        except StaleVersion:
            moved = self.store.get_request(request.id)
        return self._object(moved)

    # -- Pilots ---------------------------------------------------------------------------------

    def register_pilot(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """A Pilot's (re-)registration, by the ``pilot`` principal of the same name."""
        _require(principal, Role.PILOT)
        found = read_registration(body)
        pilot_id = found.pilot_id
        if pilot_id != principal.name:
            raise Forbidden(f"principal {principal.name} may register only the Pilot "
                            f"{principal.name}, not {pilot_id[:64]!r}",
                            detail={"pilot_id": pilot_id[:64]})
        previous = self.store.register_pilot(pilot_id, found.url, found.incarnation,
                                             sorted(found.dialects), actor=principal.name,
                                             now=self._now(), dialects=found.dialects,
                                             report_key=found.report_key)
        return {"pilot_id": pilot_id, "registered": True, "previous_incarnation": previous,
                "issuer": {"jwks": self.issuer.jwks}}

    def list_pilots(self, principal: Principal) -> list[dict[str, Any]]:
        """Every registered Pilot."""
        _require(principal, *_READERS)
        return [pilot_object(p) for p in self.store.list_pilots()]

    def ingest_reports(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """A Pilot's execution reports: each stored once, moving its request (§11.2);
        taken whole or refused whole (see :func:`marque.harbour.reports.ingest`)."""
        _require(principal, Role.PILOT)
        return ingest(self.store, principal.name, body, now=self._now)

    # -- logbook and identity --------------------------------------------------------------------

    def logbook(self, principal: Principal, after: int = 0, limit: int = 100,
                kind: str = "") -> dict[str, Any]:
        """A page of the logbook: ``{entries, next_after}``."""
        _require(principal, Role.AUDITOR, Role.ADMIN)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
            raise InvalidInput(f"after must be a sequence number from 0 to {MAX_SEQ}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be at least 1")
        entries = self.store.logbook_entries(after=after, limit=min(limit, MAX_LOGBOOK_PAGE),
                                             kind_prefix=kind or "")
        return {"entries": [e.to_dict() for e in entries],
                "next_after": entries[-1].seq if entries else after}

    def request_logbook(self, principal: Principal, id_or_request_id: str, after: int = 0,
                        limit: int = MAX_LOGBOOK_PAGE) -> dict[str, Any]:
        """A page of the logbook entries about one request, for anyone who may see the
        request (its requester included): ``{id, entries, next_after}``, oldest first;
        ``next_after`` is None when no entry follows the page (never a silent cut)."""
        _require(principal, *_ASKERS, *_READERS)
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
            raise InvalidInput(f"after must be a sequence number from 0 to {MAX_SEQ}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be at least 1")
        request = self._find(principal, id_or_request_id)
        page = min(limit, MAX_LOGBOOK_PAGE)
        entries = self.store.logbook_of(request.id, limit=page + 1, after=after)
        more = len(entries) > page
        entries = entries[:page]
        return {"id": request.id, "entries": [e.to_dict() for e in entries],
                "next_after": entries[-1].seq if more else None}

    def logbook_head(self, principal: Principal) -> dict[str, Any]:
        """The logbook's head, signed with the issuer key: ``{seq, hash, at, signed}``."""
        _require(principal, Role.AUDITOR, Role.ADMIN)
        head = self.store.logbook_head()
        signed = None if head.get("at") is None else sign_head(head, self.issuer.key)
        return {**head, "signed": signed}

    def jwks(self) -> dict[str, Any]:
        """The issuer's public keys, which Pilots pin."""
        return self.issuer.jwks

    def health(self) -> dict[str, Any]:
        """``{harbour_id, store: "ok"}``; the store's own error if it cannot be read."""
        self.store.logbook_head()
        return {"harbour_id": self.store.harbour_id, "store": "ok"}


def _bounded(reason: str | None) -> str | None:
    """``reason``, if it is no longer than :data:`REASON_CHARS`; else ``input_invalid``."""
    if reason is not None and len(reason) > REASON_CHARS:
        raise InvalidInput(f"a reason is at most {REASON_CHARS} characters; this one has "
                           f"{len(reason)}", detail={"limit": REASON_CHARS})
    return reason


def _already_decided(principal: Principal, request: Request, mine: Resolution,
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

