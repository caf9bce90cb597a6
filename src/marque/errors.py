"""Marque's errors: one class per stable code of DESIGN §9.

Every error a caller can act on carries a ``code`` that never changes, and a
``kind`` that says what it means for the execution:

    MarqueError
    ├── UsageError            bad input to a command (exit 2; HTTP 400)
    │   ├── InvalidInput         input_invalid
    │   ├── ConfigInvalid        config_invalid        pilot.json (or another config) is unusable
    │   ├── RowKeyInvalid        row_key_invalid       a declared row key the target cannot use
    │   ├── LedgerExists         ledger_exists
    │   ├── LedgerMissing        ledger_missing
    │   ├── HomeMismatch         home_mismatch         ledger opened from another home
    │   ├── LedgerNotDurable     ledger_not_durable    its engine would not keep commits
    │   ├── PostgresSupportMissing postgres_support_missing  a postgresql:// DSN, no driver
    │   ├── RequestIdInvalid     request_id_invalid
    │   ├── EffectDeclarationInvalid effect_declaration_invalid  an Effect Set declaration
    │   ├── EffectInputInvalid   effect_input_invalid  an Effect Set member's input relation
    │   │   └── EffectDuplicateIdentity effect_duplicate_identity  two rows, one mutation identity
    │   ├── EffectMaxItemsExceeded effect_max_items_exceeded  more items than max_items
    │   ├── EffectPreviewInvalid effect_preview_invalid  a preview whose CIDs do not verify
    │   ├── EffectReceiptInvalid effect_receipt_invalid  a receipt that breaks its closed shape
    │   ├── ReconciliationInvalid reconciliation_invalid  a receipt that does not extend its chain
    │   ├── OidcConfigInvalid    oidc_config_invalid   `harbour oidc set` input that cannot work
    │   ├── Unauthenticated      unauthenticated       (HTTP 401)
    │   │   └── OidcLoginRefused oidc_login_refused    a sign-in whose state or ID token fails
    │   ├── Forbidden            forbidden             (HTTP 403)
    │   │   ├── OidcSubjectUnknown oidc_subject_unknown  no principal for who signed in
    │   │   ├── TokenLoginDisabled token_login_disabled  console token login off (--require)
    │   │   ├── ReportSignatureInvalid report_signature_invalid  a report its Pilot did not sign
    │   │   └── ReportKeyChanged report_key_changed    a registration naming another report key
    │   ├── NotFound             not_found             (HTTP 404)
    │   │   └── NonceReaped      nonce_reaped          settled, reported, then reaped
    │   ├── MethodNotAllowed     method_not_allowed    (HTTP 405)
    │   ├── PayloadTooLarge      payload_too_large     (HTTP 413) a body over its endpoint's limit
    │   └── Conflict             conflict              (HTTP 409; 422 for a reused request id)
    │       ├── AlreadyApproved  already_approved      this approver's approval is stored
    │       ├── AlreadyRejected  already_rejected      this approver's rejection is stored
    │       └── TargetUnsettled  target_unsettled      a rebinding while attempts are unsettled
    ├── Refusal               nothing was claimed, no budget spent (exit 3; HTTP 403)
    │   ├── MarqueInvalid        marque_invalid
    │   ├── MarqueExpired        marque_expired
    │   ├── MarqueNotYetValid    marque_not_yet_valid
    │   ├── WrongPilot           wrong_pilot
    │   ├── WrongIncarnation     wrong_incarnation
    │   ├── UnknownTarget        unknown_target
    │   ├── TargetReplaced       target_replaced       the name points at another database
    │   ├── PopMissing           pop_missing
    │   ├── PopInvalid           pop_invalid
    │   ├── PopReplayed          pop_replayed
    │   ├── PopKeyMismatch       pop_key_mismatch
    │   ├── BudgetExhausted      budget_exhausted
    │   ├── AttemptsExhausted    attempts_exhausted
    │   ├── SelfApproval         self_approval
    │   ├── RevalidationFailed   revalidation_failed
    │   │   └── ResumeRevalidationFailed resume_revalidation_failed  (a Run's resume)
    │   ├── AccountDenied        account_denied
    │   ├── AccountNoMatch       account_no_match
    │   ├── AccountConfigInvalid account_config_invalid
    │   ├── DelegationRejected   delegation_rejected
    │   ├── RequestExpired       request_expired
    │   ├── PreviewOverBudget    preview_over_budget   its preview touched more than max_rows
    │   ├── UndoUnavailable      undo_unavailable      no sealed row images to derive an undo from
    │   └── EffectUnsupported    effect_unsupported    capability cannot realise the policy
    ├── NotApplied            an error received before or at COMMIT (exit 4)
    │   ├── MaxRowsExceeded      max_rows_exceeded
    │   ├── GuardFailed          guard_failed
    │   ├── StatementError       statement_error
    │   ├── SerializationFailure serialization_failure
    │   ├── StatementTimeout     statement_timeout
    │   ├── TargetUnavailable    target_unavailable    nothing sent: the nonce may run again
    │   ├── PreviewFailed        preview_failed
    │   ├── StalePreview         stale_preview         a row changed since its Effect preview
    │   └── UndoConflict         undo_conflict         a fenced row changed since it was written
    ├── Indeterminate         nobody can say yet whether it applied (exit 5)
    │   ├── LeaseExpired         lease_expired         the owner's lease ran out, no outcome
    │   ├── OwnerGone            owner_gone            the owning process died, no outcome
    │   ├── PilotLost            pilot_lost            a service lost mid-execution, not regained
    │   └── CommitUnknown        commit_unknown
    ├── LogbookBroken         logbook_broken        a logbook's chain does not hold (exit 8)
    ├── Internal              internal              a service's own fault, logged (HTTP 500)
    └── Unavailable           could not be reached before anything ran (exit 7; HTTP 503)
        ├── LedgerUnavailable    ledger_unavailable
        │   └── LedgerCorrupt    ledger_corrupt        the ledger file is not a ledger database
        ├── HarbourUnavailable   harbour_unavailable
        ├── PilotUnavailable     pilot_unavailable
        ├── WebhookDeliveryFailed webhook_delivery_failed  an endpoint did not accept a test
        └── OidcProviderUnavailable oidc_provider_unavailable  the identity provider

The CLI derives exit statuses and the HTTP layer derives bodies from these
classes; nothing else maps codes by hand.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


class MarqueError(Exception):
    """Base of every error Marque raises on purpose."""

    code: ClassVar[str] = "marque_error"
    kind: ClassVar[str] = "error"
    exit_status: ClassVar[int] = 1
    #: The HTTP status of the problem document a service answers with (DESIGN §10).
    http_status: ClassVar[int] = 500
    _registry: ClassVar[dict[str, type[MarqueError]]] = {}

    def __init_subclass__(cls, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            if code in MarqueError._registry:
                raise TypeError(f"error code {code!r} registered twice")
            cls.code = code
            MarqueError._registry[code] = cls

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.detail = detail or {}

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` object of an outcome: ``{code, message, sqlstate}``."""
        return {"code": self.code, "message": self.message, "sqlstate": self.sqlstate}

    def json_detail(self) -> dict[str, Any]:
        """The members of the detail that are JSON values: what a problem document or a
        ``--json`` error can carry (a value that is not JSON is left out, never mangled)."""
        safe: dict[str, Any] = {}
        for key, value in self.detail.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            safe[str(key)] = value
        return safe


#: The members of an RFC 9457 problem document that are the error itself — its class
#: (``type``, ``title``, ``code``), HTTP ``status``, message (``detail``) and SQLSTATE —
#: not its detail: a service never lets an extension member replace one, and a client
#: does not read one back into the error's detail (DESIGN §10).
PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "code", "sqlstate"})


def lookup(code: str) -> type[MarqueError]:
    """The error class registered for ``code``; ``KeyError`` if there is none."""
    return MarqueError._registry[code]


# -- usage ------------------------------------------------------------------


class UsageError(MarqueError):
    kind = "usage"
    exit_status = 2
    http_status = 400


class InvalidInput(UsageError, code="input_invalid"):
    """A command or request got input it cannot use."""


class LedgerExists(UsageError, code="ledger_exists"):
    """``pilot init`` would overwrite a ledger that already holds an incarnation."""


class LedgerMissing(UsageError, code="ledger_missing"):
    """A configured ledger is gone; re-initialising it is a deliberate act."""


class ConfigInvalid(UsageError, code="config_invalid"):
    """A configuration file (``pilot.json``) is malformed or holds a value out of range."""


class RowKeyInvalid(UsageError, code="row_key_invalid"):
    """A declared row key (``marque pilot target row-key``) cannot be used: a name that is
    not a plain identifier, no columns, a table or column the target does not have;
    ``detail["rule"]`` names which. Nothing was written."""


class HomeMismatch(UsageError, code="home_mismatch"):
    """A ledger was opened from a home it was not initialised for (a copy, or an
    unacknowledged move): two homes must never run on one incarnation."""


class LedgerNotDurable(UsageError, code="ledger_not_durable"):
    """The ledger's engine is set up so that a commit may not survive a crash (SQLite not in
    WAL with ``synchronous=FULL``, PostgreSQL without ``fsync`` or ``synchronous_commit``):
    the Pilot refuses to start on it unless ``pilot.json`` says ``"durability": "warn"``."""


class PostgresSupportMissing(UsageError, code="postgres_support_missing"):
    """A ``postgresql://`` DSN was given to an installation without PostgreSQL support
    (its driver, installed by the ``postgres`` extra, cannot be imported): nothing was
    connected to, created or changed."""


class RequestIdInvalid(UsageError, code="request_id_invalid"):
    """A caller request id breaks the rules of DESIGN §11.1; nothing was stored."""


class EffectDeclarationInvalid(UsageError, code="effect_declaration_invalid"):
    """An Effect Set declaration breaks a rule of ``marque.effects.declare``;
    ``detail["rule"]`` names it and ``detail["path"]`` where."""


class EffectInputInvalid(UsageError, code="effect_input_invalid"):
    """A member's input relation (JSON or CSV) cannot be used; ``detail["rule"]`` names why."""


class EffectDuplicateIdentity(EffectInputInvalid, code="effect_duplicate_identity"):
    """Two input rows carry one mutation identity: invalid, never collapsed (seed 002)."""


class EffectMaxItemsExceeded(UsageError, code="effect_max_items_exceeded"):
    """A member's items, counted as seed 002 says, exceed its ``max_items``."""


class EffectPreviewInvalid(UsageError, code="effect_preview_invalid"):
    """A transported Effect preview is malformed, or one of its CIDs or keys does not verify."""


class EffectReceiptInvalid(UsageError, code="effect_receipt_invalid"):
    """A member or set receipt breaks its closed shape or disagrees with what it references."""


class ReconciliationInvalid(UsageError, code="reconciliation_invalid"):
    """A reconciliation receipt breaks its closed fields, names other bindings than its
    unknown row, or does not extend the latest receipt of that row's chain."""


class Unauthenticated(UsageError, code="unauthenticated"):
    """No credential, or one nobody issued."""

    http_status = 401


class Forbidden(UsageError, code="forbidden"):
    """A known principal asked for something its roles do not allow."""

    http_status = 403


class ReportSignatureInvalid(Forbidden, code="report_signature_invalid"):
    """An execution report without a valid signature by its Pilot's registered report key
    (unsigned, forged, altered, or signed by another key): nothing of it is written."""


class ReportKeyChanged(Forbidden, code="report_key_changed"):
    """A Pilot's registration names a report key other than the one the Harbourmaster
    holds for it: refused (only an admin replaces a Pilot's report key, with
    ``marque harbour pilot accept-key``), so a stolen Pilot token cannot register a key
    of its own and sign outcomes in the Pilot's name."""


class OidcConfigInvalid(UsageError, code="oidc_config_invalid"):
    """``harbour oidc set`` was given a setting that cannot work (an issuer that is not
    https, a provider whose discovery document disagrees, a groups mapping to no known
    role, a client secret file others may read): nothing is written."""


class OidcLoginRefused(Unauthenticated, code="oidc_login_refused"):
    """An OpenID Connect sign-in that did not prove who is signing in: an unknown, used or
    expired ``state``, an ID token whose signature, issuer, audience, expiry or nonce does
    not hold (``detail["check"]`` names which). No session is made."""


class OidcSubjectUnknown(Forbidden, code="oidc_subject_unknown"):
    """The provider vouched for someone no unrevoked principal stands for, or whose groups
    map to no role: no session is made (an admin adds the principal, or the group)."""


class TokenLoginDisabled(Forbidden, code="token_login_disabled"):
    """The console's token login is off (``harbour oidc set --require``): sign in through
    the identity provider."""


class NotFound(UsageError, code="not_found"):
    """No such thing here (a nonce never claimed, an unknown request)."""

    http_status = 404


class MethodNotAllowed(UsageError, code="method_not_allowed"):
    """An endpoint that exists, asked with a method it does not answer (HTTP only)."""

    http_status = 405


class PayloadTooLarge(UsageError, code="payload_too_large"):
    """A request body longer than its endpoint's documented limit: refused before any of it
    was parsed or stored; ``detail["limit"]`` is the limit in bytes."""

    http_status = 413


class NonceReaped(NotFound, code="nonce_reaped"):
    """The nonce was claimed and settled here, then reaped once its marque expired."""


class Conflict(UsageError, code="conflict"):
    """Same idempotency key, different intent; or a lost compare-and-set."""

    http_status = 409


class AlreadyApproved(Conflict, code="already_approved"):
    """The approver already approved this Checkpoint: a second approval with another
    reason, or a reject after it, changes nothing. ``detail["resolution"]`` is the stored
    one (its reason, ``at`` and CID)."""


class AlreadyRejected(Conflict, code="already_rejected"):
    """The approver already rejected this Checkpoint: a second reject with another
    reason, or an approval after it, changes nothing. ``detail["resolution"]`` is the
    stored one (its reason, ``at`` and CID)."""


class TargetUnsettled(Conflict, code="target_unsettled"):
    """A rebinding refused: attempts on the name are unsettled in the database it left."""


# -- refusals: nothing claimed, no budget spent -------------------------------


class Refusal(MarqueError):
    kind = "refused"
    exit_status = 3
    http_status = 403


class MarqueInvalid(Refusal, code="marque_invalid"):
    """Bad signature, algorithm, header, claims or change CID."""


class MarqueExpired(Refusal, code="marque_expired"):
    pass


class MarqueNotYetValid(Refusal, code="marque_not_yet_valid"):
    pass


class WrongPilot(Refusal, code="wrong_pilot"):
    pass


class WrongIncarnation(Refusal, code="wrong_incarnation"):
    pass


class UnknownTarget(Refusal, code="unknown_target"):
    pass


class TargetReplaced(Refusal, code="target_replaced"):
    """The target name points at another database than the ledger bound it to."""


class PopMissing(Refusal, code="pop_missing"):
    pass


class PopInvalid(Refusal, code="pop_invalid"):
    pass


class PopReplayed(Refusal, code="pop_replayed"):
    pass


class PopKeyMismatch(Refusal, code="pop_key_mismatch"):
    pass


class BudgetExhausted(Refusal, code="budget_exhausted"):
    pass


class AttemptsExhausted(Refusal, code="attempts_exhausted"):
    pass


class SelfApproval(Refusal, code="self_approval"):
    """A requester tried to approve their own request where routing forbids it."""


class RevalidationFailed(Refusal, code="revalidation_failed"):
    pass


class PreviewOverBudget(Refusal, code="preview_over_budget"):
    """An approval of a request whose stored preview touched more rows than its budget's
    ``max_rows``: its execution could only claim an attempt and abort, so it is not
    approvable; a narrower change or a larger budget is a new request."""


class UndoUnavailable(Refusal, code="undo_unavailable"):
    """``marque undo`` of a request whose sealed preview cannot give a compensating change:
    rows previewed by count only, past the image cap, a table without a row key, an
    explain preview, no preview at all, or an Effect Set. Nothing is filed."""


class AccountDenied(Refusal, code="account_denied"):
    pass


class AccountNoMatch(Refusal, code="account_no_match"):
    pass


class AccountConfigInvalid(Refusal, code="account_config_invalid"):
    pass


class DelegationRejected(Refusal, code="delegation_rejected"):
    pass


class RequestExpired(Refusal, code="request_expired"):
    pass


class ResumeRevalidationFailed(RevalidationFailed, code="resume_revalidation_failed"):
    """A Run's bound authorization context or environment no longer revalidates at resume
    (seed 002's ``ACTQL_E_RESUME_REVALIDATION_FAILED``): its continuation was not dispatched."""

    #: The seed's ``terminal_error.code`` for this failure.
    actql_code: ClassVar[str] = "ACTQL_E_RESUME_REVALIDATION_FAILED"


class EffectUnsupported(Refusal, code="effect_unsupported"):
    """The connector's capability evidence cannot realise an Effect member's failure policy
    exactly (seed 002): apply is refused, never approximated; no row was dispatched."""


# -- provably not applied -----------------------------------------------------


class NotApplied(MarqueError):
    kind = "aborted_not_applied"
    exit_status = 4
    http_status = 422


class MaxRowsExceeded(NotApplied, code="max_rows_exceeded"):
    pass


class GuardFailed(NotApplied, code="guard_failed"):
    pass


class StatementError(NotApplied, code="statement_error"):
    pass


class SerializationFailure(NotApplied, code="serialization_failure"):
    pass


class StatementTimeout(NotApplied, code="statement_timeout"):
    pass


class TargetUnavailable(NotApplied, code="target_unavailable"):
    """The target refused the connection before any statement was sent."""


class PreviewFailed(NotApplied, code="preview_failed"):
    pass


class StalePreview(NotApplied, code="stale_preview"):
    """Apply admission found a row guard that no longer matches its Effect preview (or no
    evidence for it): every preview row stays unattempted (seed 002)."""


class UndoConflict(NotApplied, code="undo_conflict"):
    """A fenced statement (one with ``expect_rows``, as an undo's are) touched another
    number of rows than it expects: a row no longer holds what the original execution
    wrote. The whole transaction is rolled back; nothing of the undo is applied."""

    def to_dict(self) -> dict[str, Any]:
        """The outcome's ``error``, with ``detail: {statement}`` when it names the fenced
        statement: the execution report's structured conflict (docs/harbour.md "Undo"), so
        the Harbourmaster names the row by key without reading the message."""
        error = super().to_dict()
        statement = self.detail.get("statement")
        if isinstance(statement, int) and not isinstance(statement, bool):
            error["detail"] = {"statement": statement}
        return error


# -- not known yet --------------------------------------------------------------


class Indeterminate(MarqueError):
    kind = "indeterminate"
    exit_status = 5
    # Over HTTP an outcome is a 200 body; this is for a problem raised instead of one: the
    # answer from the target (upstream of the Pilot) did not arrive, so nobody can say yet.
    http_status = 504


class LeaseExpired(Indeterminate, code="lease_expired"):
    """The attempt's lease ran out before its owner recorded an outcome."""


class OwnerGone(Indeterminate, code="owner_gone"):
    """The process that claimed the attempt is provably dead (its run lock was released)
    and recorded no outcome; its lease had not run out yet."""


class PilotLost(Indeterminate, code="pilot_lost"):
    """A client lost its Pilot service after posting an execution and could not get back
    to it: the execution may have run. Not ``pilot_unavailable`` (exit 7 says nothing
    happened); ask again with the same nonce."""


class CommitUnknown(Indeterminate, code="commit_unknown"):
    pass


# -- a check found something wrong ------------------------------------------------


class LogbookBroken(MarqueError, code="logbook_broken"):
    """A logbook's hash chain does not hold: an entry was edited, removed, reordered, or
    the chain no longer reaches a saved head. ``detail`` names the first bad ``seq``."""

    kind = "broken"
    # Its own status: exit 1 is left to what nobody planned for (a bug), so a script
    # watching `logbook verify` never mistakes a crash for tampering, or the reverse.
    exit_status = 8


# -- a fault of ours --------------------------------------------------------------


class Internal(MarqueError, code="internal"):
    """A service met an exception that is no Marque error (a fault in Marque itself): it
    logged the exception with its traceback and answers this instead, without the
    exception's text. Exit 1, like any unplanned failure: nothing is said about whether
    an execution applied — its outcome, asked by the same nonce, says that."""


# -- could not be reached; nothing ran ---------------------------------------------


class Unavailable(MarqueError):
    """A ledger, target or service could not be reached before anything was sent to a
    target: nothing ran, and a retry with the same nonce is safe (a claim whose answer was
    lost may have been recorded; the retry answers it)."""

    kind = "unavailable"
    exit_status = 7
    http_status = 503


class LedgerUnavailable(Unavailable, code="ledger_unavailable"):
    pass


class LedgerCorrupt(LedgerUnavailable, code="ledger_corrupt"):
    """The ledger file exists but is not a ledger database (truncated, overwritten)."""


class HarbourUnavailable(Unavailable, code="harbour_unavailable"):
    pass


class PilotUnavailable(Unavailable, code="pilot_unavailable"):
    pass


class WebhookDeliveryFailed(Unavailable, code="webhook_delivery_failed"):
    """A webhook endpoint did not accept a delivery (``marque harbour webhooks test``)."""


class OidcProviderUnavailable(Unavailable, code="oidc_provider_unavailable"):
    """The identity provider's discovery document, keys or token endpoint could not be
    reached or answered nonsense: nobody was signed in (try again, or use break-glass)."""
