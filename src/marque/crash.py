"""Named crash points, so fault tests can stop a Pilot exactly between two steps.

Setting ``MARQUE_CRASH_AT=<name>`` makes the process SIGKILL itself when it
reaches that point: no cleanup, no flushed buffers, exactly like a power cut
as far as the ledger and the target can tell. Points:

``after_claim``          the nonce is claimed, the target not yet touched
``before_commit``        statements ran and asserted, COMMIT not yet sent
``after_commit``         the target committed, the ledger does not know yet
"""

from __future__ import annotations

import os
import signal

POINTS = frozenset({"after_claim", "before_commit", "after_commit"})
#: Chosen when the process starts (fault tests set it in the child's environment);
#: read once, as the execution path passes three points per execution.
_ARMED = os.environ.get("MARQUE_CRASH_AT")


def crash_point(name: str) -> None:
    """Die here, at once, if the environment asks for this point."""
    assert name in POINTS, name
    if _ARMED == name:
        os.kill(os.getpid(), signal.SIGKILL)
