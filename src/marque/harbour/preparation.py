"""Trying a request's preparation again when its Pilot could not be reached (DESIGN §11.2).

A request is ``preparing`` until its Pilot has previewed it. When the Pilot
cannot be reached the request would wait there forever unless its requester
repeated it under the same request id — which someone who let the CLI
generate the id never knows to do. So the Harbourmaster tries again by itself
on a bounded schedule (:class:`RetrySchedule`) and then ends the request
``failed`` with ``pilot_unavailable``, saying the next step. Nothing ran: a
preview always rolls back, so failing the request is the truth.

Several ``harbour serve`` processes may share one store, and any of them may
die mid-attempt. The bookkeeping therefore lives in the request's row
(``prepare_attempts``, ``prepare_due``): a process *claims* the next attempt by
a compare-and-set on the request's version that also pushes ``prepare_due`` a
lease ahead, so exactly one process makes each attempt, and an attempt whose
process died is claimed again by another once the lease has passed. A request
no attempt was ever recorded for (its process died before the first answer)
is due once it has been untouched for a lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marque.errors import InvalidInput, MarqueError
from marque.harbour.lifecycle import IllegalTransition, RequestState, StaleVersion
from marque.harbour.store.base import Request
from marque.timefmt import iso_time

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["DEFAULT_RETRY", "RetrySchedule", "defer", "retry_due"]

#: Logbook kind of an attempt that could not reach the Pilot and will be tried again.
DEFERRED = "request.preparation_deferred"
_ACTOR = "harbourmaster"


@dataclass(frozen=True)
class RetrySchedule:
    """When a preparation is tried again: ``delays[i]`` seconds after failed attempt
    ``i + 1``; after ``len(delays) + 1`` failed attempts the request ends ``failed``.
    ``lease`` is how long one attempt may take before another process may take it over."""

    delays: tuple[float, ...]
    lease: float = 60.0

    def __post_init__(self) -> None:
        if any(not d > 0 for d in self.delays) or not self.lease > 0:
            raise InvalidInput("preview retry delays and their lease must be positive")

    @classmethod
    def of(cls, delays: Sequence[float], lease: float | None = None) -> RetrySchedule:
        """A schedule of ``delays``; the lease defaults to the longer of 60 s and the
        longest delay."""
        delays = tuple(float(d) for d in delays)
        return cls(delays, max((60.0, *delays)) if lease is None else float(lease))

    @property
    def attempts(self) -> int:
        """Attempts in all, the first (made while the request is submitted) included."""
        return len(self.delays) + 1


#: A few tries over about two minutes: 15 s, 30 s, then 60 s after each failed attempt.
DEFAULT_RETRY = RetrySchedule.of((15, 30, 60))


def defer(hm: Harbourmaster, request: Request, exc: MarqueError, *,
          claimed: bool = False) -> MarqueError:
    """Record an attempt at preparing ``request`` that left it ``preparing`` because of
    ``exc``; the error to answer for it (``exc``'s class, naming the request).

    ``claimed``: the attempt was claimed (already counted); otherwise it is counted
    now (a submission's own attempt). Past the schedule the request ends ``failed``
    with ``exc``'s code and a message saying to ask again once the Pilot is up.
    """
    schedule = hm.retry_schedule
    attempts = request.prepare_attempts if claimed else request.prepare_attempts + 1
    now = float(hm.clock())
    kind = type(exc)
    if attempts >= schedule.attempts:
        message = (f"the preview could not be made after {attempts} attempt(s) "
                   f"({exc.message}); nothing ran. Once Pilot {request.pilot_id} is up, "
                   "ask for the change again (`marque request …`, a new request)")
        ended = hm._end(request, RequestState.FAILED, exc.code, message, actor=_ACTOR)
        return kind(message, detail={"id": ended.id, "state": ended.state.value,
                                     "attempt": attempts})
    due = now + schedule.delays[attempts - 1]
    left = schedule.attempts - attempts
    failure = {"code": exc.code,
               "message": f"attempt {attempts} of {schedule.attempts} at the preview failed "
                          f"({exc.message}); the Harbourmaster tries again at "
                          f"{iso_time(due)} ({left} more attempt(s)), then fails the request"}
    try:
        noted = hm.store.note_preparation(request.id, request.version, attempts=attempts,
                                          due=due, failure=failure, actor=_ACTOR, now=now,
                                          kind=DEFERRED)
    except (StaleVersion, IllegalTransition):  # another attempt moved it meanwhile
        noted = hm.store.get_request(request.id)
    detail: dict[str, Any] = {"id": noted.id, "state": noted.state.value,
                              "attempt": attempts, "next_attempt_at": due}
    return kind(f"{exc.message}; request {request.id} waits `preparing`: the Harbourmaster "
                f"tries its preview again at {iso_time(due)} ({left} more attempt(s)), then "
                f"fails it (`marque requests show {request.id}`)", detail=detail)


def retry_due(hm: Harbourmaster) -> int:
    """Claim and make every due attempt at a ``preparing`` request; how many were made.

    A claim lost to another process (or to the request moving on) is skipped. An
    attempt that fails again is recorded by :func:`defer`; one the core stored
    as refused (``preview_failed``, a deny) is left as it is.
    """
    schedule = hm.retry_schedule
    now = float(hm.clock())
    made = 0
    for request in hm.store.preparations_due(now, untouched_since=now - schedule.lease):
        try:
            mine = hm.store.note_preparation(
                request.id, request.version, attempts=request.prepare_attempts + 1,
                due=now + schedule.lease, failure=request.failure, actor=_ACTOR, now=now)
        except (StaleVersion, IllegalTransition):
            continue
        made += 1
        try:
            hm._prepare(mine, None)
        except MarqueError as exc:
            current = hm.store.get_request(mine.id)
            if current.state is RequestState.PREPARING and current.version == mine.version:
                defer(hm, mine, exc, claimed=True)
    return made
