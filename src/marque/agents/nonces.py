"""The execution nonce an agent's ``execute`` uses: derived, never chosen per call.

An agent that loses an answer calls ``execute`` again. If each call chose a
fresh nonce, that retry would be a second execution (spending budget, and
possibly applying twice). So the nonce is a function of what the agent names
— the request, its marque, and the agent's attempt number — and the same call
always carries the same nonce: the Pilot's ledger answers a repeat with the
recorded outcome (``replayed: true``), and the target's stamp fence refuses a
second apply whatever happens in between (DESIGN §3).

``nonce = "agent-" + hex(SHA-256(JCS({version, request, marque_id, attempt})))[:40]``
(160 bits: far inside the Pilot's 256-byte limit, and collision-free in practice).
The marque id is part of it, so a request asked for again (a new request, a new
marque) never meets the old request's nonces.
"""

from __future__ import annotations

from marque.cid import cid
from marque.errors import InvalidInput

__all__ = ["NONCE_VERSION", "MAX_ATTEMPT", "execution_nonce"]

NONCE_VERSION = "marque-agent-nonce/0.1"
#: The highest attempt number an agent may name (each new one is a new execution).
MAX_ATTEMPT = 1000


def execution_nonce(request: str, marque_id: str, attempt: int) -> str:
    """The nonce of the agent's ``attempt`` (1, 2, …) at executing ``request``'s marque."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) \
            or not 1 <= attempt <= MAX_ATTEMPT:
        raise InvalidInput(f"attempt must be an integer from 1 to {MAX_ATTEMPT}",
                           detail={"attempt": str(attempt)[:20]})
    digest = cid({"version": NONCE_VERSION, "request": request, "marque_id": marque_id,
                  "attempt": attempt})
    return "agent-" + digest.removeprefix("sha256:")[:40]
