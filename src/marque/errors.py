"""Marque's errors: one class per stable code of DESIGN §9.

Every error a caller can act on carries a ``code`` that never changes, and a
``kind`` that says what it means for the execution:

    MarqueError
    ├── UsageError            bad input to a command (exit 2)
    │   ├── InvalidInput         input_invalid
    │   ├── LedgerExists         ledger_exists
    │   ├── LedgerMissing        ledger_missing
    │   └── Conflict             conflict
    ├── Refusal               nothing was claimed, no budget spent (exit 3)
    │   ├── MarqueInvalid        marque_invalid
    │   ├── MarqueExpired        marque_expired
    │   ├── MarqueNotYetValid    marque_not_yet_valid
    │   ├── WrongPilot           wrong_pilot
    │   ├── WrongIncarnation     wrong_incarnation
    │   ├── UnknownTarget        unknown_target
    │   ├── PopMissing           pop_missing
    │   ├── PopInvalid           pop_invalid
    │   ├── PopReplayed          pop_replayed
    │   ├── PopKeyMismatch       pop_key_mismatch
    │   ├── BudgetExhausted      budget_exhausted
    │   └── AttemptsExhausted    attempts_exhausted
    ├── NotApplied            an error received before or at COMMIT (exit 4)
    │   ├── MaxRowsExceeded      max_rows_exceeded
    │   ├── GuardFailed          guard_failed
    │   ├── StatementError       statement_error
    │   ├── SerializationFailure serialization_failure
    │   └── StatementTimeout     statement_timeout
    └── Indeterminate         nobody can say yet whether it applied (exit 5)
        ├── LeaseExpired         lease_expired
        └── CommitUnknown        commit_unknown

The CLI derives exit statuses and the HTTP layer derives bodies from these
classes; nothing else maps codes by hand.
"""

from __future__ import annotations

from typing import Any, ClassVar


class MarqueError(Exception):
    """Base of every error Marque raises on purpose."""

    code: ClassVar[str] = "marque_error"
    kind: ClassVar[str] = "error"
    exit_status: ClassVar[int] = 1
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


def lookup(code: str) -> type[MarqueError]:
    """The error class registered for ``code``; ``KeyError`` if there is none."""
    return MarqueError._registry[code]


# -- usage ------------------------------------------------------------------


class UsageError(MarqueError):
    kind = "usage"
    exit_status = 2


class InvalidInput(UsageError, code="input_invalid"):
    """A command or request got input it cannot use."""


class LedgerExists(UsageError, code="ledger_exists"):
    """``pilot init`` would overwrite a ledger that already holds an incarnation."""


class LedgerMissing(UsageError, code="ledger_missing"):
    """A configured ledger is gone; re-initialising it is a deliberate act."""


class Conflict(UsageError, code="conflict"):
    """Same idempotency key, different intent."""


# -- refusals: nothing claimed, no budget spent -------------------------------


class Refusal(MarqueError):
    kind = "refused"
    exit_status = 3


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


# -- provably not applied -----------------------------------------------------


class NotApplied(MarqueError):
    kind = "aborted_not_applied"
    exit_status = 4


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


# -- not known yet --------------------------------------------------------------


class Indeterminate(MarqueError):
    kind = "indeterminate"
    exit_status = 5


class LeaseExpired(Indeterminate, code="lease_expired"):
    pass


class CommitUnknown(Indeterminate, code="commit_unknown"):
    pass
