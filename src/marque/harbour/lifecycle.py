"""The request lifecycle (DESIGN §11.2, ADR-038's shape): states, one table, one function.

A request's state says what is known about its real-world effect, and whether
it still *blocks* a fresh request with the same logical scope. Every change of
state goes through :func:`transition` over :data:`TRANSITIONS`; the store adds
the optimistic version and writes the logbook entry in the same transaction.

Why each move exists (the table, read row by row):

``preparing``
    Routing and the preview run here. An ``allow`` goes straight to
    ``prepared`` (the marque is issued at once); a ``delegate`` seals a
    Checkpoint and goes to ``awaiting_approval``; a deny, a no-match or a
    failed preview is ``failed``. Nothing has reached a Pilot yet, so it can
    never be ``executing`` or ``verified`` directly.
``awaiting_approval``
    Resolutions decide it: enough approvals plus a passing revalidation →
    ``prepared``; one reject → ``rejected``; the Checkpoint's ``expires_at``
    passing → ``expired``; a failed revalidation → ``failed``. No marque
    exists yet, so no execution state is reachable.
``prepared``
    A marque exists. A Pilot's report of a claim → ``executing``; a report
    that already says applied → ``verified``; an indeterminate report or the
    Pilot's ledger changing incarnation → ``reconciliation``; every nonce
    provably not applied and the marque unable to run again → ``failed``;
    ``expire_prepared`` (ADR-038) proving the marque never ran → ``expired``.
    ``expired`` is reached from here *only* through that primitive (see
    :data:`PRIMITIVE_ONLY`): a plain transition cannot release the scope of
    a request whose marque may still be in someone's hands.
``executing``
    Reports settle it: applied (none indeterminate) → ``verified``; an
    indeterminate attempt or a lost ledger → ``reconciliation``; all provably
    not applied and unable to run → ``failed``. It cannot expire: something
    ran. Staying ``executing`` across more reports is not a transition.
``reconciliation``
    Evidence settles it (stamps on the target): applied → ``verified``;
    provably not applied and unable to run → ``failed``; no stamp on a
    reachable target and an expired marque → ``expired`` (§11.5); an attempt
    known to be running again → ``executing``. Until then it blocks.
``verified``
    Blocks on purpose (ADR-038): re-applying a verified change goes through a
    compensating request. Its approval → ``rolling_back``. A later attempt of
    another nonce turning indeterminate → ``reconciliation``.
``rolling_back``
    The compensating request decides: verified → ``rolled_back``; failed →
    ``rollback_failed``; expired without running → back to ``verified`` (the
    original's effect was never touched, and saying otherwise would lie).
``rollback_failed``
    Blocks until a human acts; a new compensating request's approval →
    ``rolling_back`` again.
``failed``, ``rejected``, ``expired``, ``rolled_back``
    Terminal: nothing leaves them, and they do not block a fresh request.

A move from a state to itself is not a transition and is refused like any
other move missing from the table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from marque.errors import Conflict


class RequestState(enum.StrEnum):
    """Where a request stands (DESIGN §11.2)."""

    PREPARING = "preparing"
    AWAITING_APPROVAL = "awaiting_approval"
    PREPARED = "prepared"
    EXECUTING = "executing"
    VERIFIED = "verified"
    RECONCILIATION = "reconciliation"
    ROLLING_BACK = "rolling_back"
    ROLLBACK_FAILED = "rollback_failed"
    FAILED = "failed"
    REJECTED = "rejected"
    EXPIRED = "expired"
    ROLLED_BACK = "rolled_back"


S = RequestState

#: States whose request blocks a fresh one with the same logical scope (ADR-038).
BLOCKING: frozenset[RequestState] = frozenset({
    S.PREPARING, S.AWAITING_APPROVAL, S.PREPARED, S.EXECUTING, S.VERIFIED,
    S.RECONCILIATION, S.ROLLING_BACK, S.ROLLBACK_FAILED,
})

#: States nothing leaves.
TERMINAL: frozenset[RequestState] = frozenset({S.FAILED, S.REJECTED, S.EXPIRED, S.ROLLED_BACK})

#: The one transition table: each state and the states it may move to.
TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = {
    S.PREPARING: frozenset({S.AWAITING_APPROVAL, S.PREPARED, S.FAILED}),
    S.AWAITING_APPROVAL: frozenset({S.PREPARED, S.REJECTED, S.EXPIRED, S.FAILED}),
    S.PREPARED: frozenset({S.EXECUTING, S.VERIFIED, S.RECONCILIATION, S.FAILED, S.EXPIRED}),
    S.EXECUTING: frozenset({S.VERIFIED, S.RECONCILIATION, S.FAILED}),
    S.RECONCILIATION: frozenset({S.VERIFIED, S.FAILED, S.EXPIRED, S.EXECUTING}),
    S.VERIFIED: frozenset({S.ROLLING_BACK, S.RECONCILIATION}),
    S.ROLLING_BACK: frozenset({S.ROLLED_BACK, S.ROLLBACK_FAILED, S.VERIFIED}),
    S.ROLLBACK_FAILED: frozenset({S.ROLLING_BACK}),
    S.FAILED: frozenset(),
    S.REJECTED: frozenset(),
    S.EXPIRED: frozenset(),
    S.ROLLED_BACK: frozenset(),
}

#: Legal moves that only a named store primitive may make, never a plain transition:
#: ``prepared → expired`` is ``expire_prepared`` (it needs the Pilot's evidence), and the
#: original's side of a compensating request moves with that request, in its transaction.
PRIMITIVE_ONLY: frozenset[tuple[RequestState, RequestState]] = frozenset({
    (S.PREPARED, S.EXPIRED),
    (S.VERIFIED, S.ROLLING_BACK),
    (S.ROLLBACK_FAILED, S.ROLLING_BACK),
    (S.ROLLING_BACK, S.ROLLED_BACK),
    (S.ROLLING_BACK, S.ROLLBACK_FAILED),
    (S.ROLLING_BACK, S.VERIFIED),
})


class IllegalTransition(Conflict):
    """A move the lifecycle table does not allow (code ``conflict``); nothing changed."""


class StaleVersion(Conflict):
    """A compare-and-set on a request's version lost: someone moved it first."""


class IntentConflict(Conflict):
    """The caller's request id is taken in this scope by a request of another intent."""

    http_status = 422


class ExpiryRefused(Conflict):
    """``expire_prepared`` found a reason the marque may have run, or may still run.

    ``detail["reason"]`` names it: ``not_prepared``, ``marque_unexpired``,
    ``report_recorded``, ``claim_seen``, ``stamp_seen``, ``evidence_incomplete``.
    """


def can_move(current: RequestState, to: RequestState) -> bool:
    """Whether the table allows ``current → to``."""
    return to in TRANSITIONS[current]


def transition(current: RequestState, to: RequestState) -> RequestState:
    """Check ``current → to`` against the table and return ``to``; raise if illegal.

    Raises :class:`IllegalTransition` (code ``conflict``) for any move not in
    :data:`TRANSITIONS`, a move from a state to itself included.
    """
    current, to = RequestState(current), RequestState(to)
    if to not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        raise IllegalTransition(
            f"a request cannot move from {current} to {to}; from {current} it may move to "
            f"{allowed}",
            detail={"from": current.value, "to": to.value},
        )
    return to
