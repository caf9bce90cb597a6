"""What a caller may read (DESIGN §11.7): requests, a page at a time, and the logbook.

Every read checks the caller's roles first; a requester (or agent) reads only
their own requests, an approver, auditor or admin every one. A listing page is
a fixed number of store queries whatever its size
(:func:`marque.harbour.views.request_objects`).
"""

from __future__ import annotations

from typing import Any

from marque.errors import Conflict, InvalidInput, NotFound
from marque.harbour.access import ASKERS, READERS, find, only_own, require
from marque.harbour.context import HarbourContext
from marque.harbour.lifecycle import TERMINAL
from marque.harbour.principals import Principal, Role
from marque.harbour.views import page_cursor, read_cursor, request_object, request_objects
from marque.logbook.heads import sign_head
from marque.token import unverified_claims

__all__ = ["MAX_LOGBOOK_PAGE", "MAX_SEQ", "Reading"]

#: The most logbook entries one page holds.
MAX_LOGBOOK_PAGE = 1000
#: The largest sequence number a logbook read may start after (the stores' 64-bit column).
MAX_SEQ = 2**63 - 1


class Reading:
    """Requests and logbook pages, for whoever may see them."""

    def __init__(self, ctx: HarbourContext) -> None:
        self.ctx = ctx

    # -- requests --------------------------------------------------------------------------

    def list_requests(self, principal: Principal, state: str | None = None
                      ) -> list[dict[str, Any]]:
        """Requests newest first (a requester sees only their own), optionally of one state."""
        require(principal, *ASKERS, *READERS)
        store = self.ctx.store
        return request_objects(store, store.list_requests(state, principal=only_own(principal)))

    def request_counts(self, principal: Principal) -> dict[str, int]:
        """How many of the requests this principal may see each state holds."""
        require(principal, *ASKERS, *READERS)
        return self.ctx.store.count_requests(only_own(principal))

    def requests_page(self, principal: Principal, state: str | None = None, *,
                      limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        """One page of :meth:`list_requests`: ``{requests, next}``, at most ``limit``
        requests after ``cursor`` (None: the newest); ``next`` is the cursor of the page
        after, or None on the last page."""
        require(principal, *ASKERS, *READERS)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be at least 1")
        before = None if cursor is None else read_cursor(cursor)
        store = self.ctx.store
        found = store.list_requests(state, principal=only_own(principal), limit=limit + 1,
                                    before=before)
        shown = found[:limit]
        more = len(found) > limit
        return {"requests": request_objects(store, shown),
                "next": page_cursor(shown[-1]) if more else None}

    def get_request(self, principal: Principal, id_or_request_id: str) -> dict[str, Any]:
        """One request object: by ``rq_`` id, or the caller's own request id (its active
        request, else its most recent one)."""
        require(principal, *ASKERS, *READERS)
        return request_object(self.ctx.store, find(self.ctx.store, principal,
                                                    id_or_request_id))

    def marque_for(self, principal: Principal, id: str) -> dict[str, Any]:
        """The marque of the caller's own request, with where to execute it."""
        # Anyone but its requester is told there is no such request: ids never leak.
        if not any(principal.has(role) for role in ASKERS):
            raise NotFound(f"no request {id[:64]!r} that you may see", detail={"id": id[:64]})
        request = find(self.ctx.store, principal, id)
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
        pilot = self.ctx.store.get_pilot(request.pilot_id)
        claims = unverified_claims(request.marque) or {}
        incarnation = (claims.get("pilot") or {}).get("incarnation")
        return {"marque": request.marque, "marque_id": request.marque_id,
                "expires_at": request.marque_expires_at,
                "pilot": {"id": pilot.pilot_id, "url": pilot.url, "incarnation": incarnation},
                "target": request.target}

    # -- the logbook -------------------------------------------------------------------------

    def logbook(self, principal: Principal, after: int = 0, limit: int = 100,
                kind: str = "") -> dict[str, Any]:
        """A page of the logbook: ``{entries, next_after}``."""
        require(principal, Role.AUDITOR, Role.ADMIN)
        _check_page(after, limit)
        entries = self.ctx.store.logbook_entries(
            after=after, limit=min(limit, MAX_LOGBOOK_PAGE), kind_prefix=kind or "")
        return {"entries": [e.to_dict() for e in entries],
                "next_after": entries[-1].seq if entries else after}

    def request_logbook(self, principal: Principal, id_or_request_id: str, after: int = 0,
                        limit: int = MAX_LOGBOOK_PAGE) -> dict[str, Any]:
        """A page of the logbook entries about one request, for anyone who may see the
        request (its requester included): ``{id, entries, next_after}``, oldest first;
        ``next_after`` is None when no entry follows the page (never a silent cut)."""
        require(principal, *ASKERS, *READERS)
        _check_page(after, limit)
        request = find(self.ctx.store, principal, id_or_request_id)
        page = min(limit, MAX_LOGBOOK_PAGE)
        entries = self.ctx.store.logbook_of(request.id, limit=page + 1, after=after)
        more = len(entries) > page
        entries = entries[:page]
        return {"id": request.id, "entries": [e.to_dict() for e in entries],
                "next_after": entries[-1].seq if more else None}

    def logbook_head(self, principal: Principal) -> dict[str, Any]:
        """The logbook's head, signed with the issuer key: ``{seq, hash, at, signed}``."""
        require(principal, Role.AUDITOR, Role.ADMIN)
        head = self.ctx.store.logbook_head()
        signed = None if head.get("at") is None else sign_head(head, self.ctx.issuer.key)
        return {**head, "signed": signed}


def _check_page(after: Any, limit: Any) -> None:
    """``input_invalid`` unless ``after`` is a sequence number and ``limit`` at least 1."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
        raise InvalidInput(f"after must be a sequence number from 0 to {MAX_SEQ}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInput("limit must be at least 1")
