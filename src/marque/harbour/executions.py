"""What a request's execution reports say about it (DESIGN §11.2, §11.5).

A Pilot reports each attempt of each nonce once it settles, possibly more than
once as it learns more (``indeterminate`` first, ``applied`` after
reconciliation). A request's executions are therefore the *latest word* on
each ``(nonce, attempt)``: the status of highest rank (``outcome.Status.rank``
— a settled status outranks ``indeterminate``, and the ledger never moves a
settled attempt back), whatever order the reports arrived in.

From those, :func:`settled_state` is §11.2's rule, read in order: any attempt
indeterminate → ``reconciliation``; else any applied → ``verified``; else every
nonce provably not applied and the marque unable to run again (every nonce of
its budget used with every attempt spent, or past its ``exp``) → ``failed``;
else ``executing``.

An Effect Set attempt refused as ``stale_preview`` (a guarded row no longer
matches the approved preview) makes the marque unable to run under this
request for good: the marque names that one preview, and no attempt of any
nonce can apply a preview whose guards fail — the next step is a new request,
with a new preview and a new approval. So, with nothing applied and nothing
unknown, a stale preview is ``failed`` (:func:`can_run_again`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from marque.harbour.lifecycle import RequestState
from marque.outcome import Status

S = RequestState
#: The error an Effect Set attempt is refused with when its preview's guards no longer hold
#: (``marque.errors.StalePreview``): terminal for the request, see the module docstring.
STALE_PREVIEW = "stale_preview"
#: What a request ended by a stale preview says to do next (its ``failure.message``).
STALE_PREVIEW_NEXT_STEP = (
    "the approved Effect preview is stale (a row it guards changed since it was previewed, "
    "or can no longer be read), so no attempt of this marque can ever apply it; nothing was "
    "applied. Re-request: submit the change again (the same request id will do, this "
    "request no longer blocks it) so a new preview is taken from the rows as they are now "
    "and approved")

#: The error a fenced statement (an undo's ``expect_rows``) is refused with when its row
#: changed since (``marque.errors.UndoConflict``): like a stale preview, no attempt of the
#: marque can get past it, so the request ends ``failed``.
UNDO_CONFLICT = "undo_conflict"
#: Errors after which no attempt of the marque can apply it.
_FINAL_ERRORS = frozenset({STALE_PREVIEW, UNDO_CONFLICT})

#: Statuses a report may carry (a Pilot reports an attempt only once it has a word on it).
REPORTED_STATUSES = frozenset({
    Status.APPLIED.value, Status.ABORTED_NOT_APPLIED.value, Status.INDETERMINATE.value,
})


def latest_attempts(reports: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``(nonce, attempt)``: its highest-ranked report, as the request shows it.

    Each report is a payload ``{nonce, attempt, status, rows_affected, error, …}``;
    the rows come back ordered by nonce, then attempt.
    """
    best: dict[tuple[str, int], Mapping[str, Any]] = {}
    for report in reports:
        key = (str(report["nonce"]), int(report["attempt"]))
        held = best.get(key)
        if held is None or Status(report["status"]).rank > Status(held["status"]).rank:
            best[key] = report
    return [
        {"nonce": nonce, "attempt": attempt, "status": report["status"],
         "rows_affected": report.get("rows_affected"), "error": report.get("error")}
        for (nonce, attempt), report in sorted(best.items())
    ]


def can_run_again(attempts: list[dict[str, Any]], budget: Mapping[str, Any],
                  marque_expires_at: float | None, now: float) -> bool:
    """Whether the marque may still execute: unexpired, with a nonce or an attempt left,
    and no attempt refused for a stale Effect preview or an undo's conflict (which no
    attempt can get past)."""
    if marque_expires_at is not None and now >= marque_expires_at:
        return False
    if any((row.get("error") or {}).get("code") in _FINAL_ERRORS for row in attempts):
        return False
    nonces: dict[str, int] = {}
    for row in attempts:
        nonces[row["nonce"]] = max(nonces.get(row["nonce"], 0), int(row["attempt"]))
    if len(nonces) < int(budget.get("executions", 1)):
        return True  # an unused nonce may still be presented
    per_nonce = int(budget.get("attempts_per_nonce", 3))
    return any(last < per_nonce for last in nonces.values())


def settled_state(attempts: list[dict[str, Any]], budget: Mapping[str, Any],
                  marque_expires_at: float | None, now: float) -> RequestState | None:
    """§11.2's state for these executions (module docstring); None when there are none."""
    if not attempts:
        return None
    statuses = {row["status"] for row in attempts}
    if Status.INDETERMINATE.value in statuses:
        return S.RECONCILIATION
    if Status.APPLIED.value in statuses:
        return S.VERIFIED
    if not can_run_again(attempts, budget, marque_expires_at, now):
        return S.FAILED
    return S.EXECUTING


#: The states a report may move a request out of, and where the rule may take each.
MOVABLE: Mapping[RequestState, frozenset[RequestState]] = {
    S.PREPARED: frozenset({S.EXECUTING, S.VERIFIED, S.RECONCILIATION, S.FAILED}),
    S.EXECUTING: frozenset({S.VERIFIED, S.RECONCILIATION, S.FAILED}),
    # Only a report from the Pilot's current ledger (see the store's ingestion).
    S.RECONCILIATION: frozenset({S.VERIFIED, S.FAILED, S.EXECUTING}),
    # A later attempt of another nonce turning indeterminate.
    S.VERIFIED: frozenset({S.RECONCILIATION}),
}


def next_state(current: RequestState, attempts: list[dict[str, Any]],
               budget: Mapping[str, Any], marque_expires_at: float | None,
               now: float) -> RequestState | None:
    """Where ``current`` moves given these executions, or None to stay."""
    target = settled_state(attempts, budget, marque_expires_at, now)
    if target is None or target == current or target not in MOVABLE.get(current, frozenset()):
        return None
    return target
