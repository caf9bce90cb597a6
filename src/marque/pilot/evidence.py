"""The evidence a Pilot holds for one marque (DESIGN §10, ``GET /v1/marques/{id}``).

A bearer of a query token (``typ: marque-query+jwt``, signed by a trusted
issuer, naming this Pilot and the marque) may read what the ledger holds for
that marque — its budget, every nonce claimed and every attempt — and the
stamps its target holds for it. The Harbourmaster needs this to expire a
prepared request (no claim and no stamp) or to verify one.
"""

from __future__ import annotations

from typing import Any

from marque.errors import MarqueError, MarqueInvalid
from marque.pilot.core import Pilot
from marque.token.service_tokens import verify_query_token


def marque_evidence(pilot: Pilot, query_token: str, marque_id: str) -> dict[str, Any]:
    """Verify ``query_token`` for ``marque_id`` and return the evidence object.

    The token's ``marque_id`` must be the one asked for (else ``marque_invalid``);
    the other refusals are those of a marque, and the token's ``jti`` is spent
    (``pop_replayed`` on reuse). The stamps are read from the target the
    ledger's budget row names, or from every served target when the marque
    was never claimed here; an Effect Set's row stamps are listed among them
    (``row: true``). ``target_reachable`` is False when a target could not be
    asked (then ``stamps`` proves nothing), None when there is none.
    """
    read = verify_query_token(
        query_token, pilot.trusted, pilot_id=pilot.pilot_id,
        remember_jti=pilot.ledger.remember_pop_jti, now=pilot.clock(),
        skew_seconds=pilot.options.skew_seconds,
    )
    if read.marque_id != marque_id:
        raise MarqueInvalid(
            f"the query token is for marque {read.marque_id[:64]}, not {marque_id[:64]}: "
            "ask the issuer for a query token naming the marque you are reading")
    budget = pilot.ledger.budget(marque_id)
    claims = []
    for nonce in pilot.ledger.nonces(marque_id):
        attempts = [
            {"attempt": a.attempt, "status": a.status.value, "rows_affected": a.rows_affected,
             "error": a.error, "started_at": a.started_at, "settled_at": a.settled_at}
            for a in pilot.ledger.attempts(marque_id, nonce)
        ]
        claims.append({"nonce": nonce, "attempts": attempts})
    stamps: list[dict[str, Any]] = []
    reachable: bool | None = None
    # The budget row names the marque's target; without it (never claimed, or reaped),
    # every target this Pilot serves is asked.
    names = ([budget["target"]] if budget is not None and budget["target"] in pilot.targets
             else sorted(pilot.targets))
    for name in names:
        target = pilot.targets[name]
        try:
            stamps.extend(dict(s, target=name) for s in target.stamps_of(marque_id))
            # An Effect Set leaves a stamp per row and none per nonce: its rows are evidence
            # too, or a marque whose rows applied would look as if it never ran.
            stamps.extend(dict(s, target=name, row=True)
                          for s in target.row_stamps_of_marque(marque_id))
        except MarqueError:
            reachable = False
        else:
            reachable = True if reachable is None else reachable
    return {
        "marque_id": marque_id,
        "pilot": {"id": pilot.pilot_id, "incarnation": pilot.incarnation},
        "budget": budget,
        "claims": claims,
        "stamps": stamps,
        "target_reachable": reachable,
    }
