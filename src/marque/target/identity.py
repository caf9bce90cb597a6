"""Whether a tombstone may be written in the database a target name points at now.

Reconciliation settles an unsettled attempt by writing a tombstone for its
nonce (or an Effect Set row's key): inserted, it proves the attempt never
committed and now never can. That proof holds only in the database the attempt
was sent to. If the name was re-pointed meanwhile, the new database holds no
stamp because it never saw the attempt, and a tombstone there would let the
nonce run a second time. So the tombstone's own transaction first reads the
database's identity (stamp table migration 5) and compares it with the one the
attempt was sent to (the ledger's binding, or a rebinding's pin).
"""

from __future__ import annotations

from typing import Any


def refuses_tombstone(name: str, location: str, found: Any, expected: str | None) -> str | None:
    """Why no tombstone may be written in this database, or None if it may.

    ``found`` is the identity row read in the tombstone's transaction (None when the
    table holds none); ``expected`` the identity the attempt was sent to, or None when
    this Pilot does not know it (then no tombstone either: nothing proves where it went).
    """
    here = found[0] if found else None
    if expected is None:
        return (f"target_replaced: the identity of the database target {name} was sent to "
                "is not known to this Pilot, so no tombstone is written")
    if here != expected:
        return (f"target_replaced: target {name} ({location}) is the database of identity "
                f"{here}, not {expected}, where the attempt was sent; no tombstone is "
                "written here. Point the name back at that database to settle it")
    return None
