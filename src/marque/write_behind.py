"""The thread behind an answer: it makes durable what a caller was already told.

Two things are answered before the ledger has them: proof ``jti``s of replays
(:mod:`marque.ledger.jtis`) and applied writes settled behind their answer
(:mod:`marque.pilot.settle_behind`). Each holds them in memory and owns one
:class:`WriteBehind`, which writes them when woken and, while the ledger refuses,
tries again with growing pauses. Nothing held is ever dropped by it: a write that
keeps failing is logged and tried again until the owner stops the thread and
decides what happens to what is left.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Seconds between tries of a refused write, growing to the last.
RETRY_DELAYS = (0.05, 0.2, 1.0, 5.0)


class WriteBehind:
    """One daemon thread that calls ``flush`` when woken.

    ``gather_seconds`` is waited after each wake, so that what arrives meanwhile goes
    in the same write. An exception in ``retry_on`` keeps the held things for a later
    try, after the next of :data:`RETRY_DELAYS`; a pause is cut short only by
    :meth:`stop`, never by more work arriving (which would turn the pause into a busy
    loop against a ledger that is away).
    """

    def __init__(self, flush: Callable[[], None], *, name: str, what: str,
                 gather_seconds: float = 0.0,
                 retry_on: tuple[type[BaseException], ...] = (Exception,)) -> None:
        self._flush = flush
        self._name = name
        self._what = what
        self._gather = gather_seconds
        self._retry_on = retry_on
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether the thread was ever started (it starts with the first wake)."""
        return self._thread is not None

    def wake(self) -> None:
        """Have the thread write soon, starting it the first time."""
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stopping.is_set():
                    self._thread = threading.Thread(target=self._loop, name=self._name,
                                                    daemon=True)
                    self._thread.start()
        # Set already: the thread has not cleared it yet, so the write it makes after
        # clearing sees whatever the caller held before calling (an Event.set notifies
        # under a lock each time; the settler is woken once per execution).
        if not self._wake.is_set():
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (a write in progress finishes first); the owner then writes or
        hands on what it still holds."""
        with self._lock:
            self._stopping.set()
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        failures = 0
        while True:
            self._wake.wait()
            if self._gather:
                # Waited on the stop event, as the retry pause is: a stop cuts it short,
                # and no sleep call can fail here and end the thread with what it holds
                # unrecorded (under libfaketime with a real monotonic clock, as the
                # clock-skew soak runs Pilots, Python's time.sleep fails with EINVAL).
                self._stopping.wait(self._gather)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._flush()
                failures = 0
            except self._retry_on:
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                log.warning("%s failed; retrying in %ss", self._what, delay, exc_info=True)
                self._stopping.wait(delay)
                self._wake.set()
