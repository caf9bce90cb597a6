"""The Run state machine of seed 002 ("Run states and transitions"), its projection,
and resume revalidation.

A Run is the lifecycle of one Effect Set request's execution. Its public
state is exactly one of :class:`RunState`; every change goes through
:func:`transition` over :data:`TRANSITIONS`, which keys each legal
``(from, to)`` pair by the *causes* the seed's "required condition" column
allows for it:

* ``preparing → running``: admitted;
* ``preparing | running | resuming → waiting_checkpoint``: checkpoint_persisted;
* ``waiting_checkpoint → resuming``: resolution_approved;
* ``waiting_checkpoint → cancelled``: checkpoint_closed (rejected or expired);
* ``waiting_checkpoint → needs_reconciliation``: checkpoint_closed or
  cancellation_confirmed, while earlier Effect outcomes are unknown;
* ``preparing | running | waiting_checkpoint | resuming → cancelled``:
  cancellation_confirmed;
* ``preparing | running | resuming → succeeded | failed | needs_reconciliation``:
  continuation_ended;
* ``resuming → failed | needs_reconciliation``: resume_revalidation_failed;
* ``needs_reconciliation → needs_reconciliation | succeeded | failed``:
  effect_reconciled;
* ``needs_reconciliation → running | needs_reconciliation | succeeded | failed |
  cancelled``: execution_observed.

``succeeded``, ``failed`` and ``cancelled`` are terminal; a resumed Run never
returns to ``running``. :meth:`RunRecord.advance` adds the state-consistency
conditions: ``needs_reconciliation`` needs an unknown Effect or execution;
a terminal state needs none; ``waiting_checkpoint`` needs a Checkpoint; a
Run that carries a terminal error cannot succeed.

:func:`project` is the closed ``actql-run-state/0.1`` projection with its one
next action; :func:`revalidate_resume` ends a resume whose bound CIDs no
longer hold in ``failed`` (or ``needs_reconciliation`` while earlier Effect
outcomes are unknown) with ``ACTQL_E_RESUME_REVALIDATION_FAILED``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from marque.effects._frozen import FrozenJSON, freeze, thaw
from marque.errors import Conflict, ResumeRevalidationFailed

__all__ = [
    "RunState", "Cause", "TRANSITIONS", "TERMINAL", "IllegalRunTransition", "transition",
    "can_move", "RunRecord", "new_run", "project", "next_action", "RUN_STATE_VERSION",
    "RESUME_REVALIDATION_FAILED", "ResumeDecision", "revalidate_resume",
]

RUN_STATE_VERSION = "actql-run-state/0.1"
#: The seed's ``terminal_error`` of a failed resume revalidation.
RESUME_REVALIDATION_FAILED = {"phase": "admission",
                              "code": ResumeRevalidationFailed.actql_code}


class RunState(enum.StrEnum):
    """The public Run state (seed 002)."""

    PREPARING = "preparing"
    RUNNING = "running"
    WAITING_CHECKPOINT = "waiting_checkpoint"
    RESUMING = "resuming"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Cause(enum.StrEnum):
    """What made a Run move: the seed's required conditions, named."""

    ADMITTED = "admitted"
    CHECKPOINT_PERSISTED = "checkpoint_persisted"
    RESOLUTION_APPROVED = "resolution_approved"
    CHECKPOINT_CLOSED = "checkpoint_closed"  #: rejected or expired
    CANCELLATION_CONFIRMED = "cancellation_confirmed"
    CONTINUATION_ENDED = "continuation_ended"
    RESUME_REVALIDATION_FAILED = "resume_revalidation_failed"
    EFFECT_RECONCILED = "effect_reconciled"
    EXECUTION_OBSERVED = "execution_observed"


R, C = RunState, Cause

#: States nothing leaves.
TERMINAL: frozenset[RunState] = frozenset({R.SUCCEEDED, R.FAILED, R.CANCELLED})


def _table() -> dict[tuple[RunState, RunState], frozenset[Cause]]:
    rows: list[tuple[Iterable[RunState], Iterable[RunState], Iterable[Cause]]] = [
        ([R.PREPARING], [R.RUNNING], [C.ADMITTED]),
        ([R.PREPARING, R.RUNNING, R.RESUMING], [R.WAITING_CHECKPOINT], [C.CHECKPOINT_PERSISTED]),
        ([R.WAITING_CHECKPOINT], [R.RESUMING], [C.RESOLUTION_APPROVED]),
        ([R.WAITING_CHECKPOINT], [R.CANCELLED], [C.CHECKPOINT_CLOSED]),
        ([R.WAITING_CHECKPOINT], [R.NEEDS_RECONCILIATION],
         [C.CHECKPOINT_CLOSED, C.CANCELLATION_CONFIRMED]),
        ([R.PREPARING, R.RUNNING, R.WAITING_CHECKPOINT, R.RESUMING], [R.CANCELLED],
         [C.CANCELLATION_CONFIRMED]),
        ([R.PREPARING, R.RUNNING, R.RESUMING],
         [R.SUCCEEDED, R.FAILED, R.NEEDS_RECONCILIATION], [C.CONTINUATION_ENDED]),
        ([R.RESUMING], [R.FAILED, R.NEEDS_RECONCILIATION], [C.RESUME_REVALIDATION_FAILED]),
        ([R.NEEDS_RECONCILIATION], [R.NEEDS_RECONCILIATION, R.SUCCEEDED, R.FAILED],
         [C.EFFECT_RECONCILED]),
        ([R.NEEDS_RECONCILIATION],
         [R.RUNNING, R.NEEDS_RECONCILIATION, R.SUCCEEDED, R.FAILED, R.CANCELLED],
         [C.EXECUTION_OBSERVED]),
    ]
    table: dict[tuple[RunState, RunState], set[Cause]] = {}
    for sources, targets, causes in rows:
        for source in sources:
            for target in targets:
                table.setdefault((source, target), set()).update(causes)
    return {pair: frozenset(causes) for pair, causes in table.items()}


#: The one transition table: each legal ``(from, to)`` and the causes that allow it.
TRANSITIONS: Mapping[tuple[RunState, RunState], frozenset[Cause]] = _table()


class IllegalRunTransition(Conflict):
    """A Run move the table (or a state-consistency condition) does not allow."""


def can_move(current: RunState, to: RunState, cause: Cause) -> bool:
    """Whether the table allows ``current → to`` for ``cause``."""
    return Cause(cause) in TRANSITIONS.get((RunState(current), RunState(to)), frozenset())


def transition(current: RunState, to: RunState, cause: Cause) -> RunState:
    """Check ``current → to`` for ``cause`` against :data:`TRANSITIONS`; return ``to``.

    Raises :class:`IllegalRunTransition` (code ``conflict``) for a pair not in
    the table, or a cause the table does not list for it; any move out of a
    terminal state is illegal.
    """
    current, to, cause = RunState(current), RunState(to), Cause(cause)
    allowed = TRANSITIONS.get((current, to))
    if allowed is None or cause not in allowed:
        why = (f"it allows it only for {', '.join(sorted(allowed))}" if allowed
               else "the table has no such move")
        raise IllegalRunTransition(
            f"a Run cannot move from {current} to {to} on {cause}: {why}",
            detail={"from": current.value, "to": to.value, "cause": cause.value})
    return to


# -- the record and its projection ----------------------------------------------------

_KEEP: Any = object()


@dataclass(frozen=True)
class RunRecord:
    """A Run's current public record (immutable; :meth:`advance` makes the next one).

    ``unknown_effects`` are the Effect ids whose recorded outcomes are still
    unknown; ``execution_unknown`` whether the Run's own execution outcome is;
    ``revision`` is the state-level monotonic revision.
    """

    run_identity_cid: str
    state: RunState
    revision: int
    updated_at: str
    checkpoint_cid: str | None = None
    unknown_effects: tuple[str, ...] = ()
    execution_unknown: bool = False
    terminal_error: FrozenJSON = None

    def advance(self, to: RunState, cause: Cause, *, at: str,
                unknown_effects: Iterable[str] | None = None,
                execution_unknown: bool | None = None, checkpoint_cid: Any = _KEEP,
                terminal_error: Mapping[str, str] | None = None) -> RunRecord:
        """The record after ``state → to`` for ``cause`` at ``at``; the one way it changes.

        ``unknown_effects`` / ``execution_unknown`` / ``checkpoint_cid`` replace
        the current ones when given. Raises :class:`IllegalRunTransition` for a
        move the table refuses, or one inconsistent with the Run's unknowns.
        """
        to = transition(self.state, to, cause)
        effects = (self.unknown_effects if unknown_effects is None
                   else tuple(sorted(set(unknown_effects))))
        unknown_run = self.execution_unknown if execution_unknown is None else execution_unknown
        checkpoint = self.checkpoint_cid if checkpoint_cid is _KEEP else checkpoint_cid
        error = self.terminal_error if terminal_error is None else freeze(dict(terminal_error))
        unresolved = bool(effects) or unknown_run
        problem = None
        if to is R.NEEDS_RECONCILIATION and not unresolved:
            problem = "needs_reconciliation needs an unknown Effect or execution outcome"
        elif to in TERMINAL and unresolved:
            problem = f"{to} leaves no outcome unknown, and some are"
        elif to is R.WAITING_CHECKPOINT and not checkpoint:
            problem = "waiting_checkpoint needs the Checkpoint's identity"
        elif to is R.SUCCEEDED and error is not None:
            problem = "a Run that carries a terminal error cannot succeed"
        if problem:
            raise IllegalRunTransition(
                f"a Run cannot move from {self.state} to {to}: {problem}",
                detail={"from": self.state.value, "to": to.value, "cause": Cause(cause).value})
        return replace(self, state=to, revision=self.revision + 1, updated_at=at,
                       checkpoint_cid=checkpoint, unknown_effects=effects,
                       execution_unknown=unknown_run, terminal_error=error)


def new_run(run_identity_cid: str, *, at: str, admitted: bool = False) -> RunRecord:
    """A new Run's first record: ``preparing``, or ``running`` if admission completed."""
    return RunRecord(run_identity_cid, R.RUNNING if admitted else R.PREPARING, 1, at)


def next_action(record: RunRecord,
                availability: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The one next action consistent with the Run's state.

    ``needs_reconciliation`` → ``{kind: "reconcile", effects: [...]}`` over the
    unknown Effects (never empty), else ``{kind: "reconcile_run", reason:
    "execution_unknown"}``; ``waiting_checkpoint`` → ``{kind:
    "resolve_checkpoint", checkpoint_cid}``; ``preparing``, ``running``,
    ``resuming`` → ``{kind: "wait", reason: <state>}``; ``succeeded`` with
    available Results → ``{kind: "read_result", results}``, with Results of
    unknown availability → ``{kind: "refresh_availability", results}``;
    otherwise ``{kind: "none"}``.
    """
    state = record.state
    if state is R.NEEDS_RECONCILIATION:
        if record.unknown_effects:
            return {"kind": "reconcile", "effects": list(record.unknown_effects)}
        return {"kind": "reconcile_run", "reason": "execution_unknown"}
    if state is R.WAITING_CHECKPOINT:
        return {"kind": "resolve_checkpoint", "checkpoint_cid": record.checkpoint_cid}
    if state in (R.PREPARING, R.RUNNING, R.RESUMING):
        return {"kind": "wait", "reason": state.value}
    if state is R.SUCCEEDED and availability:
        readable = sorted(n for n, a in availability.items() if a["state"] == "available")
        if readable:
            return {"kind": "read_result", "results": readable}
        unsure = sorted(n for n, a in availability.items() if a["state"] == "unknown")
        if unsure:
            return {"kind": "refresh_availability", "results": unsure}
    return {"kind": "none"}


def project(record: RunRecord,
            availability: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The closed ``actql-run-state/0.1`` projection of ``record``.

    ``{version, run_identity_cid, state, updated_at, revision, checkpoint_cid,
    result_availability, result_available, next_action, terminal_error}``. An
    Effect-only Run has an empty availability map and ``result_available:
    false``; ``result_available`` is true only when at least one Result is
    declared and every one is confirmed available.
    """
    results = {name: thaw(entry) for name, entry in (availability or {}).items()}
    return {
        "version": RUN_STATE_VERSION, "run_identity_cid": record.run_identity_cid,
        "state": record.state.value, "updated_at": record.updated_at,
        "revision": record.revision, "checkpoint_cid": record.checkpoint_cid,
        "result_availability": results,
        "result_available": bool(results) and all(
            entry["state"] == "available" for entry in results.values()),
        "next_action": next_action(record, availability),
        "terminal_error": thaw(record.terminal_error),
    }


# -- resume revalidation --------------------------------------------------------------------


@dataclass(frozen=True)
class ResumeDecision:
    """What a resume revalidation decided: dispatch the continuation, or not (and the
    Run's exit record with its error)."""

    dispatch: bool
    record: RunRecord
    changed: tuple[str, ...] = ()

    def error(self) -> ResumeRevalidationFailed | None:
        """The error to report when the continuation was refused, else ``None``."""
        if self.dispatch:
            return None
        return ResumeRevalidationFailed(
            f"the Run's bound {', '.join(self.changed)} no longer revalidate(s); the "
            f"continuation was not dispatched and the Run is {self.record.state}",
            detail={"changed": list(self.changed), "state": self.record.state.value})


def revalidate_resume(record: RunRecord, bound: Mapping[str, str],
                      current: Mapping[str, str], *, at: str) -> ResumeDecision:
    """Revalidate a resuming Run's bound CIDs before it dispatches its continuation.

    ``bound`` are the CIDs the Checkpoint bound (authorization context,
    environment binding, admitted configuration, …), ``current`` the same
    names now; a name missing from ``current`` is a difference. All equal →
    dispatch, the record unchanged. Otherwise the Run exits ``resuming`` to
    ``failed`` — or to ``needs_reconciliation`` when earlier Effect outcomes
    are still unknown — with terminal error ``{phase: "admission", code:
    "ACTQL_E_RESUME_REVALIDATION_FAILED"}``, and nothing is dispatched.
    """
    if record.state is not R.RESUMING:
        raise IllegalRunTransition(f"only a resuming Run is revalidated, not a {record.state} "
                                   "one", detail={"from": record.state.value})
    changed = tuple(sorted(n for n in set(bound) | set(current)
                           if bound.get(n) != current.get(n)))
    if not changed:
        return ResumeDecision(True, record)
    to = (R.NEEDS_RECONCILIATION if record.unknown_effects or record.execution_unknown
          else R.FAILED)
    exited = record.advance(to, C.RESUME_REVALIDATION_FAILED, at=at,
                            terminal_error=RESUME_REVALIDATION_FAILED)
    return ResumeDecision(False, exited, changed)
