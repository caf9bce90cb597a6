"""The Harbourmaster's store: its records and its one interface (DESIGN §11).

Everything the Harbourmaster knows lives here — principals, requests and
their lifecycle, Checkpoints and Resolutions, registered Pilots, adopted
routing configs, execution reports and the logbook. Every invariant is a
constraint or a compare-and-set inside one store transaction, never a lock in
one process, because several ``harbour serve`` processes may share one
PostgreSQL store (§11). SQLite (the default, a file in the Harbourmaster's
home) and PostgreSQL are siblings behind :class:`HarbourStore` and run one
behaviour suite.

Every operation is synchronous and is one store transaction; each request
transition appends its logbook entry in that same transaction, so the journal
and the state can never disagree.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marque.harbour.lifecycle import RequestState
from marque.harbour.principals import Principal, Role
from marque.harbour.store.outbox import NotificationStore

#: A Resolution's decisions.
DECISIONS = ("approve", "reject")
#: Fields of a request a transition may set alongside its new state.
UPDATABLE_FIELDS = frozenset({"routing", "preview", "checkpoint_cid", "marque_id", "failure",
                              "marque", "marque_expires_at"})


@dataclass(frozen=True)
class RequestDraft:
    """A request as accepted, before it is stored (DESIGN §11.1's identities computed)."""

    request_id: str
    principal: str
    pilot_id: str
    target: str
    change: dict[str, Any]
    budget: dict[str, Any]
    ttl_seconds: int
    change_cid: str
    authority_scope_cid: str
    logical_request_scope: str
    intent_fingerprint: str
    reason: str | None = None
    #: The ``id`` of the verified request this one compensates, if any.
    rolls_back: str | None = None
    #: The RFC 7638 thumbprint of the requester's key when they asked (self-approval
    #: is judged against it as well as against their key at approval time).
    requester_jkt: str | None = None


@dataclass(frozen=True)
class StoredRequest:
    """One stored request: one attempt at a logical request (DESIGN §11.2)."""

    id: str
    request_id: str
    principal: str
    reason: str | None
    pilot_id: str
    target: str
    change: dict[str, Any]
    budget: dict[str, Any]
    ttl_seconds: int
    change_cid: str
    authority_scope_cid: str
    logical_request_scope: str
    intent_fingerprint: str
    routing: dict[str, Any] | None
    preview: dict[str, Any] | None
    checkpoint_cid: str | None
    marque_id: str | None
    rolls_back: str | None
    state: RequestState
    version: int
    created_at: float
    updated_at: float
    #: Why the request ended ``failed``/``expired``/``rejected``: ``{code, message}``.
    failure: dict[str, Any] | None = None
    #: The marque issued for the request (bound to its requester's key), and its ``exp``.
    marque: str | None = field(default=None, repr=False)
    marque_expires_at: float | None = None
    #: The requester's key thumbprint when the request was made (None before schema 6).
    requester_jkt: str | None = None
    #: While ``preparing``: attempts at its preview started so far, and when the next one
    #: may start (None: no attempt recorded yet).
    prepare_attempts: int = 0
    prepare_due: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stored fields as JSON."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["state"] = self.state.value
        return out


@dataclass(frozen=True)
class Checkpoint:
    """A sealed Checkpoint (DESIGN §11.4) as stored: its body and CID."""

    checkpoint_cid: str
    request: str
    body: dict[str, Any]
    expires_at: float
    created_at: float


@dataclass(frozen=True)
class Resolution:
    """One approver's decision on a Checkpoint, with its CID."""

    resolution_cid: str
    checkpoint_cid: str
    approver: str
    decision: str
    body: dict[str, Any]
    at: float


@dataclass(frozen=True)
class PilotRecord:
    """A registered Pilot and the ledger incarnation it last reported."""

    pilot_id: str
    url: str
    incarnation: str
    targets: list[str]
    registered_at: float
    last_seen: float
    #: Each target's SQL dialect as the Pilot registered it (empty for a registration
    #: made before dialects were recorded).
    dialects: dict[str, str] = field(default_factory=dict)
    #: The public JWK the Pilot signs its execution reports with; None for a Pilot that
    #: never registered one (its reports are accepted unsigned until it does).
    report_key: dict[str, Any] | None = None


@dataclass(frozen=True)
class AdoptedConfig:
    """An adopted account routing config: its CID and its exact source text."""

    config_cid: str
    source: str
    adopted_at: float
    adopted_by: str


@dataclass(frozen=True)
class Report:
    """One execution report from a Pilot, unique on ``(marque_id, nonce, attempt, status)``."""

    marque_id: str
    nonce: str
    attempt: int
    status: str
    body: dict[str, Any]
    request: str | None
    received_at: float


@dataclass(frozen=True)
class RequestParts:
    """Several requests' Checkpoints (by CID), Resolutions (by Checkpoint CID), reports
    (by marque id) and the requests their compensations roll back (by id); what is not
    there has none."""

    checkpoints: dict[str, Checkpoint]
    resolutions: dict[str, list[Resolution]]
    reports: dict[str, list[Report]]
    originals: dict[str, StoredRequest] = field(default_factory=dict)


@dataclass(frozen=True)
class LogbookEntry:
    """One logbook entry (DESIGN §11.6)."""

    seq: int
    at: float
    kind: str
    actor: str
    subject: str
    body: dict[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON: exactly the fields its hash covers, and the hash."""
        return {"seq": self.seq, "at": self.at, "kind": self.kind, "actor": self.actor,
                "subject": self.subject, "body": self.body, "prev_hash": self.prev_hash,
                "hash": self.hash}


@dataclass(frozen=True)
class ConsoleSession:
    """A web console session (DESIGN §12), as stored: never its id, only the id's SHA-256."""

    session_hash: str
    principal: str
    #: The secret this session's CSRF tokens are derived from (see ``console/csrf.py``).
    csrf_secret: str = field(repr=False)
    created_at: float
    expires_at: float
    revoked_at: float | None = None
    #: How it was opened: ``token`` (a principal's token), ``oidc`` (the console, through
    #: the identity provider) or ``cli`` (a command line's sign-in, used as a bearer token).
    via: str = "token"
    #: The roles granted at sign-in (None for a token session: the principal's, live).
    roles: tuple[str, ...] | None = None
    #: Where ``roles`` came from: ``principal`` or ``groups`` (None for a token session).
    roles_from: str | None = None
    #: The provider's subject and session id (``sid``) it was opened for, if any.
    oidc_subject: str | None = None
    oidc_sid: str | None = None
    #: When it was last checked at the provider (``oidc_session_checks``), as read with
    #: the session; None when no check is recorded (or the session was not read back).
    oidc_checked_at: float | None = None


@dataclass(frozen=True)
class OidcLogin:
    """One sign-in started at the console, as stored until its callback uses it (once)."""

    browser_hash: str
    nonce: str = field(repr=False)
    code_verifier: str = field(repr=False)
    next_path: str
    issuer: str
    created_at: float
    expires_at: float


@dataclass(frozen=True)
class OidcCheck:
    """A session's check at the provider, claimed by this process: the refresh token it
    uses (None when the provider gave none, or the session predates checks)."""

    refresh_token: str | None = field(repr=False)


class HarbourStore(NotificationStore, abc.ABC):
    """The Harbourmaster's store. All methods are safe to call from threads.

    Times (``now``) are epoch seconds; when omitted, the store's clock is read.
    """

    harbour_id: str
    schema_version: int

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    # -- principals -----------------------------------------------------------

    @abc.abstractmethod
    def add_principal(self, name: str, roles: list[str] | list[Role], *,
                      public_jwk: dict[str, Any] | None = None, actor: str,
                      now: float | None = None) -> tuple[Principal, str]:
        """Add a principal; returns it and its token, which is never shown again.

        A name an unrevoked principal holds is ``Conflict``, and so is a key
        whose RFC 7638 thumbprint an unrevoked principal holds (both decided by
        partial unique indexes); a revoked name may be added again, as a new
        principal with its own ``id``. Writes ``principal.added``.
        """

    @abc.abstractmethod
    def rotate_principal(self, name: str, *, public_jwk: dict[str, Any] | None = None,
                         actor: str, now: float | None = None) -> tuple[Principal, str]:
        """A new token for an unrevoked principal (returned once); the old one stops
        working and the principal's console sessions end, in one transaction.

        With ``public_jwk`` its key is replaced too (a key another unrevoked
        principal holds is ``Conflict``). ``NotFound`` for an unknown or revoked
        name. Writes ``principal.rotated``.
        """

    @abc.abstractmethod
    def set_roles(self, name: str, roles: list[str] | list[Role], *, actor: str,
                  now: float | None = None) -> Principal:
        """Replace an unrevoked principal's roles; writes ``principal.roles_set`` when they
        change. ``NotFound`` for an unknown or revoked name."""

    @abc.abstractmethod
    def authenticate(self, token: str) -> Principal:
        """The principal holding ``token``; ``Unauthenticated`` if unknown or revoked."""

    @abc.abstractmethod
    def revoke_principal(self, name: str, *, actor: str, now: float | None = None) -> Principal:
        """Revoke a principal's token (idempotent); ``NotFound`` for an unknown name."""

    @abc.abstractmethod
    def get_principal(self, name: str) -> Principal:
        """The unrevoked principal of that name, else the latest revoked one; ``NotFound``
        if there was never one by that name."""

    @abc.abstractmethod
    def list_principals(self) -> list[Principal]:
        """Every principal, revoked ones included, by name and then age."""

    @abc.abstractmethod
    def set_public_key(self, name: str, public_jwk: dict[str, Any] | None, *, actor: str,
                       now: float | None = None) -> Principal:
        """Register (or clear) an unrevoked principal's public key; a key another unrevoked
        principal holds is ``Conflict``. Writes ``principal.key_set``."""

    # -- routing configs ---------------------------------------------------------

    @abc.abstractmethod
    def adopt_routing_config(self, config_cid: str, source: str, *, actor: str,
                             now: float | None = None) -> bool:
        """Make ``config_cid`` the current config; False if it already was (no entry)."""

    @abc.abstractmethod
    def current_routing_config(self) -> AdoptedConfig | None:
        """The config adopted last, or None before any."""

    @abc.abstractmethod
    def get_routing_config(self, config_cid: str) -> AdoptedConfig:
        """An adopted config by CID; ``NotFound`` if never adopted."""

    # -- pilots -------------------------------------------------------------------

    @abc.abstractmethod
    def register_pilot(self, pilot_id: str, url: str, incarnation: str, targets: list[str], *,
                       actor: str | None = None, now: float | None = None,
                       dialects: dict[str, str] | None = None,
                       report_key: dict[str, Any] | None = None) -> str | None:
        """Record a Pilot's registration; returns its previous incarnation, or None.

        ``dialects`` maps each of ``targets`` to its SQL dialect (it must name
        exactly the targets; ``InvalidInput`` otherwise). ``report_key`` is the
        public JWK the Pilot signs its reports with; None keeps the one held.

        Every registration updates ``last_seen``; only one that changes what is
        known of the Pilot (a first one, or another URL, incarnation, targets,
        dialects) appends ``pilot.registered``. A registration naming a report
        key other than the one held is refused (``ReportKeyChanged``), leaving
        only a ``finding.pilot_report_key_refused`` entry. A changed
        incarnation writes ``finding.ledger_incarnation_changed`` and moves the
        Pilot's ``prepared``, ``executing`` and ``reconciliation`` requests to
        ``reconciliation``. All in the same transaction.
        """

    @abc.abstractmethod
    def accept_report_key(self, pilot_id: str, report_key: dict[str, Any], *, actor: str,
                          reason: str, now: float | None = None) -> PilotRecord:
        """An admin replaces a registered Pilot's report key (``NotFound`` for an unknown
        Pilot), appending ``pilot.report_key_accepted`` with the previous key and the
        reason. A registration naming another key than the one held is refused
        (``ReportKeyChanged``) and only recorded, as ``finding.pilot_report_key_refused``."""

    @abc.abstractmethod
    def get_pilot(self, pilot_id: str) -> PilotRecord:
        """A registered Pilot; ``NotFound`` otherwise."""

    @abc.abstractmethod
    def list_pilots(self) -> list[PilotRecord]:
        """Every registered Pilot, by id."""

    # -- requests ----------------------------------------------------------------

    @abc.abstractmethod
    def create_request(self, draft: RequestDraft, *, actor: str | None = None,
                       now: float | None = None) -> tuple[StoredRequest, bool]:
        """Store a new request in ``preparing``, or find the one it repeats.

        Returns ``(request, True)`` when inserted. When a blocking request holds
        the scope, the partial unique index refuses the insert: the same intent
        fingerprint returns ``(that request, False)``; another raises
        ``IntentConflict`` (code ``conflict``).
        """

    @abc.abstractmethod
    def get_request(self, id: str) -> StoredRequest:
        """A request by its ``rq_`` id; ``NotFound`` otherwise."""

    @abc.abstractmethod
    def find_active(self, logical_request_scope: str) -> StoredRequest | None:
        """The one blocking request of a scope, or None."""

    @abc.abstractmethod
    def find_history(self, logical_request_scope: str) -> list[StoredRequest]:
        """Every request ever stored for a scope, oldest first."""

    @abc.abstractmethod
    def list_requests(self, state: RequestState | str | None = None,
                      principal: str | None = None, *, limit: int | None = None,
                      before: tuple[float, str] | None = None) -> list[StoredRequest]:
        """Requests, newest first (by ``created_at``, then ``id``), optionally of one state
        and one principal; at most ``limit`` of them, and only those that come after
        ``before`` — the ``(created_at, id)`` of the last request of the page before —
        in that order (a page of a keyset walk: requests added meanwhile never shift it)."""

    @abc.abstractmethod
    def get_requests(self, ids: Sequence[str]) -> dict[str, StoredRequest]:
        """The stored requests of ``ids`` by id (an id no request has is left out), in a
        fixed number of queries whatever their number."""

    @abc.abstractmethod
    def count_requests(self, principal: str | None = None) -> dict[str, int]:
        """How many requests each state holds (states with none left out), optionally of
        one principal: one query, whatever the number of requests."""

    @abc.abstractmethod
    def transition(self, id: str, expected_version: int, to: RequestState | str, *,
                   actor: str, now: float | None = None, reason: str | None = None,
                   body: dict[str, Any] | None = None, kind: str | None = None,
                   **updates: Any) -> StoredRequest:
        """Move a request to ``to`` by compare-and-set on its version.

        ``updates`` may set ``routing``, ``preview``, ``checkpoint_cid`` and
        ``marque_id``. A stale version raises ``StaleVersion``; an illegal move
        ``IllegalTransition``, as does a move only a primitive makes
        (``lifecycle.PRIMITIVE_ONLY``: ``prepared → expired`` and the
        original's side of a compensation). Writes ``request.<state>`` (or
        ``kind``) in the same transaction.

        A compensating request (``rolls_back`` set) carries its original in the
        same transaction: moving to ``prepared`` (its approval) takes the
        original from ``verified`` or ``rollback_failed`` to ``rolling_back``;
        once approved, reaching ``verified`` takes it to ``rolled_back``,
        ``failed`` to ``rollback_failed``, and ``expired`` (it never ran) back
        to ``verified``. If the original cannot move so, neither moves.
        """

    @abc.abstractmethod
    def note_preparation(self, id: str, expected_version: int, *, attempts: int, due: float,
                         failure: dict[str, Any] | None, actor: str,
                         now: float | None = None, kind: str | None = None) -> StoredRequest:
        """Record the bookkeeping of a ``preparing`` request's attempts by compare-and-set
        on its version (which it bumps): ``attempts`` started, the next ``due`` (epoch
        seconds), and the last attempt's ``failure`` (``None`` clears it).

        Claiming the next attempt is this call: of several processes holding the same
        version, exactly one claims it; the others get ``StaleVersion``. A request not
        ``preparing`` is ``IllegalTransition``. With ``kind`` a logbook entry of that kind
        is appended in the same transaction.
        """

    @abc.abstractmethod
    def preparations_due(self, now: float, *, untouched_since: float) -> list[StoredRequest]:
        """``preparing`` requests whose next attempt is due at ``now``: ``prepare_due`` has
        passed, or none was ever recorded and the request has not changed since
        ``untouched_since``. Oldest first."""

    @abc.abstractmethod
    def seal_checkpoint(self, id: str, expected_version: int, *, checkpoint_cid: str,
                        body: dict[str, Any], expires_at: float, actor: str,
                        now: float | None = None, kind: str | None = None,
                        **updates: Any) -> StoredRequest:
        """Store a sealed Checkpoint and move its request to ``awaiting_approval``.

        ``updates`` may set the request's ``routing`` and ``preview`` in the same
        move; ``kind`` names its logbook entry (default ``request.awaiting_approval``).
        """

    @abc.abstractmethod
    def get_checkpoint(self, checkpoint_cid: str) -> Checkpoint:
        """A Checkpoint by CID; ``NotFound`` otherwise."""

    @abc.abstractmethod
    def add_resolution(self, checkpoint_cid: str, *, resolution_cid: str, approver: str,
                       decision: str, body: dict[str, Any], now: float | None = None,
                       approver_jkt: str | None = None) -> tuple[Resolution, bool]:
        """Store an approver's Resolution once; a second one by them returns the first.

        ``approver_jkt`` (the approver's key thumbprint) counts once per Checkpoint too:
        another name resolving with a key that already resolved it is ``Conflict``.
        """

    @abc.abstractmethod
    def resolutions(self, checkpoint_cid: str) -> list[Resolution]:
        """A Checkpoint's Resolutions, in the order they arrived."""

    @abc.abstractmethod
    def expire_prepared(self, id: str, expected_version: int, *, evidence: dict[str, Any],
                        now: float, skew_seconds: float, marque_exp: float, reason: str,
                        actor: str) -> StoredRequest:
        """ADR-038's narrow primitive: ``prepared → expired``, or refuse and change nothing."""

    @abc.abstractmethod
    def record_report(self, marque_id: str, nonce: str, attempt: int, status: str,
                      body: dict[str, Any], *, now: float | None = None) -> bool:
        """Store a Pilot's execution report once; False if it was already stored."""

    @abc.abstractmethod
    def ingest_report(self, report: dict[str, Any], *, actor: str,
                      now: float | None = None) -> tuple[bool, StoredRequest | None]:
        """Store a Pilot's report and move its request per DESIGN §11.2, in ONE transaction.

        ``report`` is the Pilot's outbox payload ``{marque_id, nonce, attempt,
        status, rows_affected, error, pilot, cause}`` (checked by the caller).
        Idempotent on ``(marque_id, nonce, attempt, status)``: a repeat returns
        ``(False, request)`` and writes nothing. A new report appends
        ``execution.<status>`` and, when the executions so far (the latest word
        per nonce and attempt, ``executions.latest_attempts``) call for it,
        moves the request (``executions.next_state``) — a request in
        ``reconciliation`` only by a report from its Pilot's current ledger.
        A report for a marque no request holds (not one this Harbourmaster
        issued) is not stored: ``(False, None)``, nothing written. A report for
        a marque issued to another Pilot than the report's ``pilot.id`` is
        ``Forbidden``, nothing written. A ``signature`` member (the Pilot's
        compact JWS, checked by the caller) is kept in the ``execution.*``
        entry's body.
        """

    @abc.abstractmethod
    def marque_pilots(self, marque_ids: list[str]) -> dict[str, str]:
        """For each of ``marque_ids`` this Harbourmaster issued, the Pilot it was issued to
        (a marque no request holds is left out)."""

    @abc.abstractmethod
    def reports(self, marque_id: str) -> list[Report]:
        """The reports received for a marque, in arrival order."""

    @abc.abstractmethod
    def request_parts(self, requests: Sequence[StoredRequest]) -> RequestParts:
        """What the request objects of ``requests`` show besides their rows — their
        Checkpoints, Resolutions and reports, and the originals of those that roll one
        back — read together, in a fixed number of queries whatever the number of
        requests (a listing page is one read, not three per request). The same lists, in
        the same order, as :meth:`get_checkpoint`, :meth:`resolutions`, :meth:`reports`
        and :meth:`get_request` give."""

    # -- logbook -----------------------------------------------------------------

    @abc.abstractmethod
    def append(self, kind: str, actor: str, subject: str, body: dict[str, Any],
               now: float | None = None) -> LogbookEntry:
        """Append one entry to the logbook in its own transaction."""

    @abc.abstractmethod
    def logbook_entries(self, after: int = 0, limit: int = 100,
                        kind_prefix: str = "") -> list[LogbookEntry]:
        """Entries with ``seq > after``, in order, at most ``limit``."""

    @abc.abstractmethod
    def logbook_of(self, subject: str, limit: int = 1000, *,
                   after: int = 0) -> list[LogbookEntry]:
        """The entries about ``subject`` (a request id, a Pilot id…) after ``seq`` ``after``,
        in order, at most ``limit`` (a page: the caller continues from the last one)."""

    @abc.abstractmethod
    def logbook_head(self) -> dict[str, Any]:
        """The chain's head: ``{seq, hash, at}`` (``seq`` 0 and the genesis hash when empty)."""

    # -- console sessions ----------------------------------------------------------

    @abc.abstractmethod
    def create_session(self, session_hash: str, principal: str, *, csrf_secret: str,
                       expires_at: float, now: float | None = None, via: str = "token",
                       roles: tuple[str, ...] | None = None, roles_from: str | None = None,
                       oidc_subject: str | None = None, oidc_sid: str | None = None,
                       replaces: str | None = None) -> ConsoleSession:
        """Store a new console session for a principal that exists and is not revoked.

        ``session_hash`` is the SHA-256 of the session id the browser holds; a
        revoked or unknown principal is ``Unauthenticated`` and nothing is stored.
        A session opened through the identity provider carries the roles it was
        granted and where from (``principal`` or ``groups``). A command line's renewal
        (``via`` ``cli``) names the session it ``replaces``, which ends in the same
        transaction (a compare-and-set) if it is a live command line's sign-in of the
        same principal; anything else it names is left alone.
        """

    @abc.abstractmethod
    def get_session(self, session_hash: str, *,
                    now: float | None = None) -> tuple[ConsoleSession, Principal]:
        """A live session and its principal, read in one statement.

        ``Unauthenticated`` for an unknown, expired or logged-out session, and for
        one whose principal has been revoked since; ``detail["reason"]`` says which
        (``unknown``, ``expired``, ``revoked``, ``principal_revoked``, and
        ``role_revoked`` for a sign-in granted a role its principal no longer holds).
        A session whose roles came from the provider's groups returns the principal
        with those roles; one opened through the provider carries when it was last checked
        there (``oidc_checked_at``), read in the same statement.
        """

    @abc.abstractmethod
    def revoke_session(self, session_hash: str, *, now: float | None = None) -> bool:
        """End a session (logout); False if it was unknown or already ended."""

    @abc.abstractmethod
    def end_cli_session(self, session_hash: str, *, now: float | None = None) -> bool:
        """End a command line's sign-in (``marque logout``, ``POST /v1/oidc/logout``): one
        compare-and-set on a live session opened ``via`` ``cli``; False when there is none
        to end (unknown, already ended, expired, or not a command line's)."""

    @abc.abstractmethod
    def purge_sessions(self, *, before: float) -> int:
        """Delete sessions that expired before ``before``; how many went."""

    # -- signing in through an identity provider (store/oidc_sql.py) --------------

    @abc.abstractmethod
    def set_oidc_settings(self, body: dict[str, Any], *, actor: str,
                          now: float | None = None) -> int:
        """Keep the OIDC settings (logged as ``oidc.configured``); with ``require`` on, end
        every console session opened with a token in the same transaction (how many)."""

    @abc.abstractmethod
    def clear_oidc_settings(self, *, actor: str, now: float | None = None) -> bool:
        """Forget the OIDC settings (logged as ``oidc.cleared``); False if there were none."""

    @abc.abstractmethod
    def oidc_settings(self) -> dict[str, Any] | None:
        """The stored OIDC settings, or None."""

    @abc.abstractmethod
    def begin_oidc_login(self, state_hash: str, login: OidcLogin) -> None:
        """Keep a sign-in's state until its callback (one row per state)."""

    @abc.abstractmethod
    def finish_oidc_login(self, state_hash: str, *, now: float | None = None) -> OidcLogin:
        """Use a sign-in's state, once: ``OidcLoginRefused`` (``detail["check"]`` =
        ``state_unknown``, ``state_used`` or ``state_expired``) otherwise."""

    @abc.abstractmethod
    def note_exchanged_token(self, token_hash: str, *, expires_at: float,
                             now: float | None = None, session_hash: str | None = None) -> bool:
        """Record that an ID token was exchanged (for the session ``session_hash``, about
        to be opened); False if it already was (a replay)."""

    @abc.abstractmethod
    def renew_exchanged_token(self, token_hash: str, *, renewing: str, session_hash: str,
                              now: float | None = None) -> float | None:
        """Accept an ID token exchanged before as the renewal of the session it opened: only
        when ``renewing`` is that session, live and a command line's, in one compare-and-set
        that moves the token to ``session_hash`` and ends ``renewing``. The ended session's
        expiry (the renewal must not outlast it); None when refused (a replay)."""

    @abc.abstractmethod
    def end_oidc_sessions(self, *, subject: str | None = None, sid: str | None = None,
                          now: float | None = None) -> int:
        """End the live sessions opened for a provider session id or subject (back-channel
        logout); how many."""

    @abc.abstractmethod
    def note_oidc_check(self, session_hash: str, *, refresh_token: str | None,
                        checked_at: float) -> None:
        """Record that a session opened through the provider was checked at ``checked_at``
        (at sign-in, or at a check), with the refresh token its next check uses."""

    @abc.abstractmethod
    def take_oidc_refresh_token(self, session_hash: str) -> str | None:
        """Remove a session's check and answer the refresh token it kept (at logout, for
        the provider to revoke); None when it kept none."""

    @abc.abstractmethod
    def claim_oidc_check(self, session_hash: str, *, due_before: float,
                         now: float | None = None) -> OidcCheck | None:
        """Claim a session's check if it was last checked at or before ``due_before`` (one
        compare-and-set: of several processes, one claims it); None when it is not due or
        another process claimed it. A session with no check row is due, with no token."""
