"""The Harbourmaster's synchronous core (DESIGN §11): every endpoint's behaviour, once.

The HTTP service, the console, the CLI, agents and tests call
:class:`Harbourmaster`, a facade over the parts that do the work, each one
concept and each taking the same :class:`~marque.harbour.context.HarbourContext`:

* :mod:`~marque.harbour.access` — who is calling, and what they may see;
* :mod:`~marque.harbour.submission` — accepting a request, a repeat, an undo;
* :mod:`~marque.harbour.preparation` — routing, preview, issue or seal, retries;
* :mod:`~marque.harbour.approvals` — Resolutions and the tally they complete;
* :mod:`~marque.harbour.expiry` — the admin's expiry, settlement from stamps;
* :mod:`~marque.harbour.reading` — requests a page at a time, the logbook;
* :mod:`~marque.harbour.moves` — the end states and the marque every path ends in.

Each method checks the caller's roles itself (§11.7), so every caller gets the
same rules, and raises only :class:`~marque.errors.MarqueError` subclasses.

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

import time
from collections.abc import Callable, Sequence
from typing import Any

from marque.clients.pilot import PilotClient, PilotQueries
from marque.errors import Forbidden
from marque.harbour.access import READERS, authenticate, require
from marque.harbour.approvals import Approvals, DecisionFacts
from marque.harbour.context import HarbourContext
from marque.harbour.expiry import SKEW_SECONDS, Expiry
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.intake import read_registration
from marque.harbour.issuance import Issuer
from marque.harbour.preparation import (
    CHECKPOINT_TTL_SECONDS,
    DEFAULT_RETRY,
    Preparation,
    RetrySchedule,
)
from marque.harbour.principals import Principal, Role
from marque.harbour.reading import MAX_LOGBOOK_PAGE, Reading
from marque.harbour.reports import ingest
from marque.harbour.store.base import HarbourStore, StoredRequest
from marque.harbour.submission import Submissions
from marque.harbour.views import pilot_object

__all__ = ["Harbourmaster"]


class Harbourmaster:
    """One Harbourmaster: its store, its issuer, and the flow of DESIGN §11."""

    def __init__(self, store: HarbourStore, issuer: Issuer, *,
                 clock: Callable[[], float] = time.time,
                 pilot_client_factory: Callable[[str], PilotQueries] | None = None,
                 checkpoint_ttl_seconds: int = CHECKPOINT_TTL_SECONDS,
                 skew_seconds: float = SKEW_SECONDS,
                 retry_schedule: RetrySchedule = DEFAULT_RETRY) -> None:
        self.ctx = HarbourContext(
            store=store, issuer=issuer, clock=clock,
            pilot_client_factory=pilot_client_factory or (lambda url: PilotClient(url)))
        self.preparation = Preparation(self.ctx, checkpoint_ttl_seconds=checkpoint_ttl_seconds,
                                       retry_schedule=retry_schedule)
        self.submissions = Submissions(self.ctx, self.preparation)
        self.approvals = Approvals(self.ctx)
        self.expiry = Expiry(self.ctx, skew_seconds=skew_seconds)
        self.reading = Reading(self.ctx)

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

    @property
    def store(self) -> HarbourStore:
        """The Harbourmaster's store."""
        return self.ctx.store

    @property
    def issuer(self) -> Issuer:
        """The issuer key every marque and service token is signed with."""
        return self.ctx.issuer

    @property
    def clock(self) -> Callable[[], float]:
        """The clock every decision here is made by."""
        return self.ctx.clock

    @property
    def retry_schedule(self) -> RetrySchedule:
        """When a preparation that could not reach its Pilot is tried again."""
        return self.preparation.retry_schedule

    # -- principals -----------------------------------------------------------------

    def authenticate(self, token: str | None) -> Principal:
        """The principal holding ``token``; ``Unauthenticated`` if none, unknown or revoked."""
        return authenticate(self.store, token, self.ctx.now())

    def whoami(self, principal: Principal) -> dict[str, Any]:
        """Whom a token authenticates: ``{name, roles, key_thumbprint, harbour_id}`` (never
        the token, nor anything only an admin may see)."""
        return {"name": principal.name, "roles": sorted(r.value for r in principal.roles),
                "key_thumbprint": principal.key_thumbprint,
                "harbour_id": self.store.harbour_id}

    # -- reading requests (reading.py) ----------------------------------------------------

    def list_requests(self, principal: Principal, state: str | None = None) -> list[dict[str, Any]]:
        """Requests newest first (a requester sees only their own), optionally of one state."""
        return self.reading.list_requests(principal, state)

    def request_counts(self, principal: Principal) -> dict[str, int]:
        """How many of the requests this principal may see each state holds."""
        return self.reading.request_counts(principal)

    def requests_page(self, principal: Principal, state: str | None = None, *,
                      limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        """One page of :meth:`list_requests`: ``{requests, next}`` (reading.py)."""
        return self.reading.requests_page(principal, state, limit=limit, cursor=cursor)

    def get_request(self, principal: Principal, id_or_request_id: str) -> dict[str, Any]:
        """One request object: by ``rq_`` id, or the caller's own request id."""
        return self.reading.get_request(principal, id_or_request_id)

    def marque_for(self, principal: Principal, id: str) -> dict[str, Any]:
        """The marque of the caller's own request, with where to execute it."""
        return self.reading.marque_for(principal, id)

    # -- submitting (submission.py, preparation.py) ------------------------------------------

    def submit(self, principal: Principal, body: dict[str, Any],
               idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """Accept a request (DESIGN §11.2): ``(request object, created)``."""
        return self.submissions.submit(principal, body, idempotency_key)

    def undo(self, principal: Principal, id: str, *, reason: str | None = None,
             request_id: str | None = None, per_row: bool = False
             ) -> tuple[dict[str, Any], bool]:
        """File the undo of request ``id`` (docs/harbour.md "Undo"; ``per_row`` for the
        row-by-row Effect Set): ``(request object, created)``."""
        return self.submissions.undo(principal, id, reason=reason, request_id=request_id,
                                     per_row=per_row)

    def retry_preparations(self) -> int:
        """Make every due attempt at a request left ``preparing`` (its Pilot could not be
        reached), each claimed by compare-and-set; how many were made (preparation.py)."""
        return self.preparation.retry_due()

    # -- approvals (approvals.py) --------------------------------------------------------------

    def approve(self, principal: Principal, id: str, reason: str | None) -> dict[str, Any]:
        """An approver's approval; completing the Checkpoint revalidates and issues."""
        return self.approvals.approve(principal, id, reason)

    def reject(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """An approver's rejection (a reason is required): the request ends ``rejected``."""
        return self.approvals.reject(principal, id, reason)

    def no_longer_holds(self, id: str) -> list[str]:
        """What of an ``awaiting_approval`` request's Checkpoint no longer holds now
        ([] when an approval could still issue its marque)."""
        return self.approvals.no_longer_holds(id)

    def decision_facts(self, ids: Sequence[str]) -> dict[str, DecisionFacts]:
        """What deciding on each of these requests depends on besides its object (its
        self-approval, its requester's keys, what of its Checkpoint no longer holds), read
        for all at once: the console's queue of what waits for an approver."""
        return self.approvals.decision_facts(ids)

    def settle(self, request: StoredRequest, actor: str) -> StoredRequest:
        """Act on the tally of an ``awaiting_approval`` request (else return it as it is)."""
        return self.approvals.settle(request, actor)

    # -- expiry and settlement (expiry.py) ------------------------------------------------------

    def expire(self, principal: Principal, id: str, reason: str) -> dict[str, Any]:
        """The admin's expiry (ADR-038)."""
        return self.expiry.expire(principal, id, reason)

    def settle_from_stamps(self, id: str) -> dict[str, Any]:
        """Settle a ``reconciliation`` request from the stamps its target holds (§11.5)."""
        return self.expiry.settle_from_stamps(id)

    # -- Pilots -----------------------------------------------------------------------------------

    def register_pilot(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """A Pilot's (re-)registration, by the ``pilot`` principal of the same name."""
        require(principal, Role.PILOT)
        found = read_registration(body)
        pilot_id = found.pilot_id
        if pilot_id != principal.name:
            raise Forbidden(f"principal {principal.name} may register only the Pilot "
                            f"{principal.name}, not {pilot_id[:64]!r}",
                            detail={"pilot_id": pilot_id[:64]})
        previous = self.store.register_pilot(pilot_id, found.url, found.incarnation,
                                             sorted(found.dialects), actor=principal.name,
                                             now=self.ctx.now(), dialects=found.dialects,
                                             report_key=found.report_key)
        return {"pilot_id": pilot_id, "registered": True, "previous_incarnation": previous,
                "issuer": {"jwks": self.issuer.jwks}}

    def list_pilots(self, principal: Principal) -> list[dict[str, Any]]:
        """Every registered Pilot."""
        require(principal, *READERS)
        return [pilot_object(p) for p in self.store.list_pilots()]

    def ingest_reports(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """A Pilot's execution reports: each stored once, moving its request (§11.2);
        taken whole or refused whole (see :func:`marque.harbour.reports.ingest`)."""
        require(principal, Role.PILOT)
        return ingest(self.store, principal.name, body, now=self.ctx.now)

    # -- logbook and identity (reading.py) ---------------------------------------------------------

    def logbook(self, principal: Principal, after: int = 0, limit: int = 100,
                kind: str = "") -> dict[str, Any]:
        """A page of the logbook: ``{entries, next_after}``."""
        return self.reading.logbook(principal, after, limit, kind)

    def request_logbook(self, principal: Principal, id_or_request_id: str, after: int = 0,
                        limit: int = MAX_LOGBOOK_PAGE) -> dict[str, Any]:
        """A page of the logbook entries about one request: ``{id, entries, next_after}``."""
        return self.reading.request_logbook(principal, id_or_request_id, after, limit)

    def logbook_head(self, principal: Principal) -> dict[str, Any]:
        """The logbook's head, signed with the issuer key: ``{seq, hash, at, signed}``."""
        return self.reading.logbook_head(principal)

    def jwks(self) -> dict[str, Any]:
        """The issuer's public keys, which Pilots pin."""
        return self.issuer.jwks

    def health(self) -> dict[str, Any]:
        """``{harbour_id, store: "ok"}``; the store's own error if it cannot be read."""
        self.store.logbook_head()
        return {"harbour_id": self.store.harbour_id, "store": "ok"}
