"""The events of an execution, as they happen: for the caller and for everyone following.

An execution streams one event per step of DESIGN §3. Callers of the same
nonce in the same process follow the one execution (:class:`Inflight`), never
start another; the events of an attempt also go to the ledger with its outcome
(:class:`AttemptStream`), so a caller in another process can read them later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marque.outcome import Outcome, Status
from marque.target import TargetAttempt

if TYPE_CHECKING:
    from marque.errors import MarqueError

EventSink = Callable[[dict[str, Any]], None]


def _at(now: float) -> float:
    """An event's time, to the microsecond: ``round(now, 6)`` rounds through a decimal
    string (≈5× the cost); this may differ from it by a microsecond in the last digit."""
    return round(now * 1_000_000) / 1_000_000


class Done:
    """Set once, when an execution ends; waited on by the callers that follow it.

    A lock held from the start and released once: every execution makes one, and
    a ``threading.Event`` (a Python condition over a lock) costs ~15 times as much
    to make and set, for the rare call that follows another one.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._held.acquire()

    def set(self) -> None:
        """The execution ended (call once)."""
        self._held.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it is set, at most ``timeout`` seconds; whether it was."""
        if not self._held.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            return False
        self._held.release()  # the next waiter goes through too
        return True


@dataclass
class Inflight:
    """An execution running in this process, for callers of the same nonce."""

    done: Done = field(default_factory=Done)
    outcome: Outcome | None = None
    refusal: MarqueError | None = None
    followers: list[EventSink] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, event: dict[str, Any]) -> None:
        """Record an event and pass it to every caller following this execution."""
        with self.lock:
            self.events.append(event)
            if not self.followers:  # the common case: nobody else asked for this nonce
                return
            followers = list(self.followers)
        for sink in followers:
            sink(event)

    def follow(self, sink: EventSink | None) -> None:
        """Replay the events so far to ``sink``, then pass it the ones still to come."""
        if sink is None:
            return
        # Under the lock, so no live event can overtake the replayed ones.
        with self.lock:
            for event in self.events:
                sink(event)
            self.followers.append(sink)
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Observation:
    """What one look at an attempt established: its status and what goes with it."""

    target_attempt: TargetAttempt
    status: Status
    rows_affected: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class AttemptStream:
    """The events of one attempt: kept for the ledger, passed to every follower."""

    def __init__(self, clock: Callable[[], float], marque_id: str, nonce: str, attempt: int,
                 inflight: Inflight, sink: EventSink | None) -> None:
        self._clock = clock
        self._base = {"marque_id": marque_id, "nonce": nonce, "attempt": attempt}
        self._inflight = inflight
        self._sink = sink
        self.events: list[dict[str, Any]] = []

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        """A new event of this attempt (not yet sent anywhere)."""
        return {"event": kind, **self._base, "at": _at(self._clock()), **data}

    def emit(self, kind: str, **data: Any) -> None:
        """An event that goes to the ledger with the outcome, and to every follower now."""
        # event() and Inflight.publish(), inline: an execution emits seven of these.
        event = {"event": kind, **self._base, "at": _at(self._clock()), **data}
        self.events.append(event)
        inflight = self._inflight
        with inflight.lock:
            inflight.events.append(event)
            followers = list(inflight.followers) if inflight.followers else None
        if followers is not None:
            for follower in followers:
                follower(event)
        if self._sink is not None:
            self._sink(event)

    def publish(self, event: dict[str, Any]) -> None:
        """Send an event to the followers and the caller, without keeping it."""
        self._inflight.publish(event)
        if self._sink is not None:
            self._sink(event)


def send_event(sink: EventSink | None, event: dict[str, Any]) -> None:
    if sink is not None:
        sink(event)


def recorded_event(target_attempt: TargetAttempt, status: Status, at: float) -> dict[str, Any]:
    """The ``outcome_recorded`` event of an outcome recorded after its caller was answered
    (the ledger was away, or the settle went behind the answer)."""
    return {"event": "outcome_recorded", "marque_id": target_attempt.marque_id,
            "nonce": target_attempt.nonce, "attempt": target_attempt.number,
            "at": _at(at), "status": status.value}
