"""The per-row dispatch ledger's states, and which row may go next (seed 002).

Before a row is sent, the Pilot reserves it under its keys in the state
``prepared``; every later move goes through :func:`transition` over
:data:`TRANSITIONS`:

============  ==========================================  =========================
from          to                                          why
============  ==========================================  =========================
prepared      dispatching                                 a fenced owner sends it
dispatching   applied, accepted, failed                   the target answered
dispatching   unknown                                     the answer was lost after
                                                          the row was possibly sent
dispatching   prepared                                    provably never sent (the
                                                          target refused the
                                                          connection first)
unknown       applied, accepted, failed                   reconciliation evidence
                                                          (never a resend)
============  ==========================================  =========================

``applied``, ``accepted`` and ``failed`` are terminal; ``unknown`` never goes
back to ``dispatching``. A move out of ``dispatching`` must present the fence
of the owner that began it (:class:`FencedOut` otherwise); moves out of
``unknown`` are evidence, not an owner's.

:func:`plan_member` is the seed's halt/continue table as a pure planner:

=====================  ======================================  ==========================
current row outcome    halt                                    continue
=====================  ======================================  ==========================
applied or accepted    dispatch next row                       dispatch next row
failed                 later rows unattempted                  dispatch next row
unknown                later rows unattempted; reconcile the   dispatch other rows only;
                       current row                             reconcile it, never resend
=====================  ======================================  ==========================

Members are attempted in declared order and each is attempted whatever
another's rows did (the seed's ``attempt_all``); rows go one at a time.
:func:`check_capability` is apply admission's proof that the connector can
realise a member's policy exactly (:class:`~marque.errors.EffectUnsupported`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from marque.cid import cid
from marque.effects.declare import FailurePolicy
from marque.errors import Conflict, EffectUnsupported

__all__ = [
    "DispatchState", "TRANSITIONS", "TERMINAL", "IllegalDispatchTransition", "FencedOut",
    "transition", "DispatchRecord", "prepare", "advance", "Plan", "PlanReason", "plan_member",
    "SetPlan", "plan_set", "Capability", "check_capability", "SQL_ROW_CAPABILITY",
    "DISPATCH_ENTRY_VERSION", "LEDGER_HEAD_VERSION",
]

DISPATCH_ENTRY_VERSION = "marque-effect-dispatch-entry/0.1"
LEDGER_HEAD_VERSION = "marque-effect-ledger-head/0.1"


class DispatchState(enum.StrEnum):
    """A row's state in the dispatch ledger."""

    PREPARED = "prepared"
    DISPATCHING = "dispatching"
    APPLIED = "applied"
    ACCEPTED = "accepted"
    FAILED = "failed"
    UNKNOWN = "unknown"


D = DispatchState

#: The one transition table.
TRANSITIONS: Mapping[DispatchState, frozenset[DispatchState]] = {
    D.PREPARED: frozenset({D.DISPATCHING}),
    D.DISPATCHING: frozenset({D.APPLIED, D.ACCEPTED, D.FAILED, D.UNKNOWN, D.PREPARED}),
    D.UNKNOWN: frozenset({D.APPLIED, D.ACCEPTED, D.FAILED}),
    D.APPLIED: frozenset(),
    D.ACCEPTED: frozenset(),
    D.FAILED: frozenset(),
}

#: States nothing leaves.
TERMINAL: frozenset[DispatchState] = frozenset({D.APPLIED, D.ACCEPTED, D.FAILED})
_SUCCESS = frozenset({D.APPLIED, D.ACCEPTED})


class IllegalDispatchTransition(Conflict):
    """A move the dispatch table does not allow (code ``conflict``); nothing changed."""


class FencedOut(Conflict):
    """An owner whose fence is not the row's current one tried to settle it."""


def transition(current: DispatchState, to: DispatchState) -> DispatchState:
    """Check ``current → to`` against :data:`TRANSITIONS`; return ``to`` or raise
    :class:`IllegalDispatchTransition` (a move to the same state included)."""
    current, to = DispatchState(current), DispatchState(to)
    if to not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (terminal)"
        raise IllegalDispatchTransition(
            f"a row cannot move from {current} to {to}; from {current} it may move to "
            f"{allowed}", detail={"from": current.value, "to": to.value})
    return to


@dataclass(frozen=True)
class DispatchRecord:
    """One row's durable dispatch-ledger record (immutable; :func:`advance` makes the next).

    ``attempt`` counts dispatches (0 before the first); ``fence`` is the
    current owner's token while ``dispatching``; ``revision`` counts moves;
    ``was_unknown`` stays true once the row has been ``unknown`` (so that a
    halt on it holds after reconciliation settles it).
    """

    row_preview_cid: str
    effect_apply_key: str
    row_idempotency_key: str
    state: DispatchState = D.PREPARED
    attempt: int = 0
    fence: str | None = None
    revision: int = 0
    was_unknown: bool = False

    def to_json(self) -> dict[str, Any]:
        """The record as stored: its fields and ``version``."""
        return {"version": LEDGER_HEAD_VERSION, "row_preview_cid": self.row_preview_cid,
                "effect_apply_key": self.effect_apply_key,
                "row_idempotency_key": self.row_idempotency_key, "state": self.state.value,
                "attempt": self.attempt, "fence": self.fence, "revision": self.revision,
                "was_unknown": self.was_unknown}

    @property
    def ledger_head_cid(self) -> str:
        """The CID of this record: what an unknown row's receipt entry references."""
        return cid(self.to_json())

    @property
    def dispatch_entry_cid(self) -> str | None:
        """``CID({version: "marque-effect-dispatch-entry/0.1", effect_apply_key,
        row_idempotency_key, row_preview_cid, attempt})`` of the latest dispatch, or
        ``None`` if the row was never dispatched."""
        if self.attempt == 0:
            return None
        return cid({"version": DISPATCH_ENTRY_VERSION, "effect_apply_key": self.effect_apply_key,
                    "row_idempotency_key": self.row_idempotency_key,
                    "row_preview_cid": self.row_preview_cid, "attempt": self.attempt})


def prepare(row_preview_cid: str, effect_apply_key: str,
            row_idempotency_key: str) -> DispatchRecord:
    """The reservation of one row before anything is sent: state ``prepared``."""
    return DispatchRecord(row_preview_cid, effect_apply_key, row_idempotency_key)


def advance(record: DispatchRecord, to: DispatchState, *,
            fence: str | None = None) -> DispatchRecord:
    """The record after ``record.state → to``; the one way a record changes.

    ``prepared → dispatching`` takes the new owner's ``fence`` and counts an
    attempt; a move out of ``dispatching`` must present that same fence
    (:class:`FencedOut`); a move out of ``unknown`` is reconciliation evidence
    and takes no fence. Illegal moves raise :class:`IllegalDispatchTransition`.
    """
    to = transition(record.state, to)
    if record.state is D.PREPARED:
        if not fence:
            raise FencedOut("dispatching a row needs the owner's fence",
                            detail={"row_preview_cid": record.row_preview_cid})
        return replace(record, state=to, attempt=record.attempt + 1, fence=fence,
                       revision=record.revision + 1)
    if record.state is D.DISPATCHING and fence != record.fence:
        raise FencedOut(
            f"row {record.row_preview_cid} is being dispatched by another owner (fence "
            f"{record.fence!r}, not {fence!r})", detail={"row_preview_cid": record.row_preview_cid})
    return replace(record, state=to, fence=None, revision=record.revision + 1,
                   was_unknown=record.was_unknown or to is D.UNKNOWN)


# -- the planner ---------------------------------------------------------------------


class PlanReason(enum.StrEnum):
    """Why a plan says what it says."""

    DISPATCH = "dispatch"            #: ``next`` may be dispatched now
    IN_FLIGHT = "in_flight"          #: a row is dispatching; wait for it
    COMPLETE = "complete"            #: every row was attempted
    HALTED_FAILED = "halted_failed"  #: halt: a row failed; later rows stay unattempted
    HALTED_UNKNOWN = "halted_unknown"  #: halt: a row is (or was) unknown; later rows too


@dataclass(frozen=True)
class Plan:
    """A member's plan: the row that may go next (or none, and why), the rows that stay
    unattempted by the policy, and the unknown rows to reconcile (never to resend)."""

    reason: PlanReason
    next: int | None = None
    unattempted: tuple[int, ...] = ()
    reconcile: tuple[int, ...] = ()


def _status(row: DispatchRecord | DispatchState) -> tuple[DispatchState, bool]:
    if isinstance(row, DispatchRecord):
        return row.state, row.was_unknown
    state = DispatchState(row)
    return state, state is D.UNKNOWN


def plan_member(rows: Sequence[DispatchRecord | DispatchState],
                policy: FailurePolicy) -> Plan:
    """Which of a member's rows (in canonical order) may be dispatched next under ``policy``.

    ``rows`` are the rows' ledger records (or bare states). A row that is or
    was ``unknown`` is never offered again; under ``halt`` it, like a failed
    row, leaves every later row unattempted.
    """
    statuses = [_status(row) for row in rows]
    unknown = tuple(i for i, (state, _) in enumerate(statuses) if state is D.UNKNOWN)
    if FailurePolicy(policy) is FailurePolicy.HALT:
        for index, (state, was_unknown) in enumerate(statuses):
            later = tuple(range(index + 1, len(statuses)))
            if state is D.DISPATCHING:
                return Plan(PlanReason.IN_FLIGHT, reconcile=unknown)
            if state is D.PREPARED:
                return Plan(PlanReason.DISPATCH, next=index, reconcile=unknown)
            if state is D.UNKNOWN or was_unknown:
                return Plan(PlanReason.HALTED_UNKNOWN, unattempted=later, reconcile=unknown)
            if state is D.FAILED:
                return Plan(PlanReason.HALTED_FAILED, unattempted=later, reconcile=unknown)
        return Plan(PlanReason.COMPLETE, reconcile=unknown)
    if any(state is D.DISPATCHING for state, _ in statuses):
        return Plan(PlanReason.IN_FLIGHT, reconcile=unknown)
    for index, (state, _) in enumerate(statuses):
        if state is D.PREPARED:
            return Plan(PlanReason.DISPATCH, next=index, reconcile=unknown)
    return Plan(PlanReason.COMPLETE, reconcile=unknown)


@dataclass(frozen=True)
class SetPlan:
    """The whole set's plan: the ``(member index, row index)`` to dispatch next, if any,
    whether a row is in flight, and every member's own plan."""

    next: tuple[int, int] | None
    in_flight: bool
    members: tuple[Plan, ...]

    @property
    def done(self) -> bool:
        """Nothing may be dispatched any more: the apply phase is over."""
        return self.next is None and not self.in_flight


def plan_set(members: Sequence[tuple[FailurePolicy, Sequence[DispatchRecord | DispatchState]]]
             ) -> SetPlan:
    """Plan every member (``(policy, rows)`` in declared order); one row goes at a time,
    members in order, each member attempted whatever the others' rows did."""
    plans = tuple(plan_member(rows, policy) for policy, rows in members)
    for index, plan in enumerate(plans):
        if plan.reason is PlanReason.IN_FLIGHT:
            return SetPlan(None, True, plans)
        if plan.next is not None:
            return SetPlan((index, plan.next), False, plans)
    return SetPlan(None, False, plans)


# -- capability evidence ---------------------------------------------------------------

_ATOMICITY = ("per_item", "provider_batch_atomic", "unknown")
_IDEMPOTENCY = ("native", "emulated", "unavailable")
_RECOVERY = ("native", "stamped", "natural_key", "unavailable")


@dataclass(frozen=True)
class Capability:
    """A connector's advertised mutation capability (seed 002, apply admission)."""

    atomicity: str
    row_error_identity: bool
    request_order: bool
    idempotency: str
    recovery: str

    def __post_init__(self) -> None:
        for name, allowed in (("atomicity", _ATOMICITY), ("idempotency", _IDEMPOTENCY),
                              ("recovery", _RECOVERY)):
            if getattr(self, name) not in allowed:
                raise EffectUnsupported(
                    f"capability {name} must be one of {', '.join(allowed)}; got "
                    f"{getattr(self, name)!r}", detail={"rule": name})
        for name in ("row_error_identity", "request_order"):
            if not isinstance(getattr(self, name), bool):
                raise EffectUnsupported(f"capability {name} must be true or false",
                                        detail={"rule": name})

    def to_json(self) -> dict[str, Any]:
        """The evidence object."""
        return {"version": "marque-connector-capability/0.1", "atomicity": self.atomicity,
                "row_error_identity": self.row_error_identity,
                "request_order": self.request_order, "idempotency": self.idempotency,
                "recovery": self.recovery}

    @property
    def capability_cid(self) -> str:
        """The CID of :meth:`to_json` (apply admission's capability evidence CID)."""
        return cid(self.to_json())


#: What Marque's PostgreSQL and SQLite targets offer: one commit unit per row holding the
#: row's change and its stamp, an error per row, rows sent in order.
SQL_ROW_CAPABILITY = Capability(atomicity="per_item", row_error_identity=True,
                                request_order=True, idempotency="emulated", recovery="stamped")


def check_capability(policy: FailurePolicy, capability: Capability) -> None:
    """Raise :class:`EffectUnsupported` unless ``capability`` realises ``policy`` exactly.

    ``continue`` needs exact per-row outcomes from independent commit units
    (``atomicity: per_item`` and row-error identity); ``halt`` needs exact
    per-row outcomes (``per_item`` or ``provider_batch_atomic``, with row-error
    identity) and also preserved request order. Nothing is approximated.
    """
    policy = FailurePolicy(policy)
    missing = []
    if policy is FailurePolicy.CONTINUE:
        if capability.atomicity != "per_item":
            missing.append("atomicity per_item")
    elif capability.atomicity == "unknown":
        missing.append("atomicity per_item or provider_batch_atomic")
    if not capability.row_error_identity:
        missing.append("row-error identity")
    if policy is FailurePolicy.HALT and not capability.request_order:
        missing.append("preserved request order")
    if missing:
        raise EffectUnsupported(
            f"failure policy {policy} needs {', '.join(missing)}; the connector advertises "
            f"atomicity {capability.atomicity}, row-error identity "
            f"{capability.row_error_identity}, request order {capability.request_order}",
            detail={"policy": policy.value, "missing": missing})
