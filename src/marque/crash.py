"""Named crash points, so fault tests can stop a Pilot exactly between two steps.

Setting ``MARQUE_CRASH_AT=<name>`` makes the process SIGKILL itself when it
first reaches that point; ``<name>@<n>`` waits for the n-th time (1-based),
so a long-running service can be killed in the middle of its work. No
cleanup, no flushed buffers: exactly like a power cut as far as the ledger
and the target can tell. The points, in the order an execution passes them
(DESIGN §3), then the reporter's, reconciliation's and the service stream's:

``after_verify``             marque and proof verified, nothing claimed yet
``after_claim``              the nonce is claimed, the target not yet touched
``after_begin``              the target transaction is open, the stamp not yet inserted
``after_stamp``              the stamp is inserted (fence checked), no statement run yet
``after_statement``          a statement ran (each one passes here), not yet asserted
``before_commit``            statements ran and asserted, COMMIT not yet sent
``after_commit``             the target committed, the ledger does not know yet (an Effect
                             Set passes it once per row: its row and row stamp committed,
                             the dispatch ledger not yet told — ``@n`` stops after row n)
``settle_behind``            an applied write was answered and its outcome is held for the
                             ledger (``settle_write_behind``), not yet recorded
``after_outcome_recorded``   the ledger holds the outcome, it is not yet reported
``before_report_ack``        reports delivered (logbook, Harbourmaster), the outbox not yet
                             acknowledged
``after_reconcile_evidence`` reconciliation has the target's evidence (a tombstone may have
                             committed), the ledger is not yet settled by it
``stream_before_outcome``    the service knows the outcome; the caller has not got its line
``stream_after_first_chunk`` the service sent the first events of a stream, not the rest
"""

from __future__ import annotations

import os
import threading

POINTS = frozenset({
    "after_verify", "after_claim", "after_begin", "after_stamp", "after_statement",
    "before_commit", "after_commit", "settle_behind", "after_outcome_recorded", "before_report_ack",
    "after_reconcile_evidence", "stream_before_outcome", "stream_after_first_chunk",
})


def _armed(spec: str | None) -> tuple[str | None, int]:
    """``(point, n)`` from ``MARQUE_CRASH_AT``; an unknown point arms nothing."""
    if not spec:
        return None, 0
    name, _, count = spec.partition("@")
    try:
        n = int(count) if count else 1
    except ValueError:
        return None, 0
    return (name, n) if name in POINTS and n >= 1 else (None, 0)


#: Chosen when the process starts (fault tests set it in the child's environment);
#: read once, as the execution path passes a dozen points per execution.
_ARMED, _AT = _armed(os.environ.get("MARQUE_CRASH_AT"))
_passes = 0
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here, at once, if the environment asks for this point (and this pass)."""
    assert name in POINTS, name
    if _ARMED != name:
        return
    global _passes
    with _lock:
        _passes += 1
        due = _passes >= _AT
    if due:
        import signal  # only a process that dies here pays for it

        os.kill(os.getpid(), signal.SIGKILL)
