"""Proof ``jti``s remembered *behind* a replay's answer.

A proof of possession names one marque and one nonce. When that nonce is
already ``applied`` — absorbing: nothing can run under it again — a proof can
only re-read the recorded outcome. Waiting for an fsync before answering such
a replay buys nothing, so its ``jti`` is held here in memory (checked by every
later call in this process at once) and written to the ledger's ``pop_jtis``
table by a background thread, in batches, moments later.

What this trades, and only for replays of applied nonces: if the process dies
in the few milliseconds between the answer and the write, the proof may be
accepted once more after a restart (within its window) — and it will again
only read the same applied outcome. A proof that can still make something
happen (a fresh nonce, a new attempt) has its ``jti`` recorded in the claim
transaction, before anything touches the target.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from marque.write_behind import WriteBehind

log = logging.getLogger(__name__)


class PendingJtis:
    """Jtis accepted but not yet durable, and the thread that makes them durable.

    ``write`` stores a batch of ``(jti, forget_after)`` in one ledger
    transaction (an already-stored jti is not an error). A jti stays in
    :meth:`__contains__` until its batch has committed, so a replay in this
    process is refused whether or not the write has happened yet.
    """

    def __init__(self, write: Callable[[list[tuple[str, float]]], None]) -> None:
        self._write = write
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()
        self._writer = WriteBehind(self.flush, name="marque-jti-writer",
                                   what="writing proof jtis to the ledger")

    def __contains__(self, jti: object) -> bool:
        with self._lock:
            return jti in self._pending

    def add(self, jti: str, forget_after: float) -> bool:
        """Hold ``jti`` for writing; False if it is already held (a replayed proof)."""
        with self._lock:
            if jti in self._pending:
                return False
            self._pending[jti] = forget_after
        self._writer.wake()
        return True

    def flush(self) -> None:
        """Write every held jti now; raises if the ledger refuses the write."""
        with self._lock:
            batch = list(self._pending.items())
        if not batch:
            return
        self._write(batch)
        with self._lock:
            for jti, _ in batch:
                self._pending.pop(jti, None)

    def close(self) -> None:
        """Stop the writer and write what it still holds (logged if that fails)."""
        self._writer.stop()
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - closing: report, never mask the caller's exit
            log.warning("proof jtis of %d replays were not written at close", len(self._pending),
                        exc_info=True)
