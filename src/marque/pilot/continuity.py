"""The ledger's continuity (DESIGN §5): the targets' stamps are the anchor outside it.

A ledger restored from an old copy keeps its incarnation but forgets
attempts. The stamps the targets hold for this incarnation remember them, so a
stamp the ledger does not know means the ledger went back in time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marque.pilot.core import Pilot


def check_continuity(pilot: Pilot) -> dict[str, Any] | None:
    """DESIGN §5: the targets' stamps are the anchor outside the ledger.

    A stamp of this incarnation, for a marque still live, that the ledger
    does not know means the ledger went back in time (restored from an
    old copy). Its budgets cannot be trusted, so the Pilot rotates to a
    new incarnation — refusing every outstanding marque — and records
    the finding. Returns the finding, or None.
    """
    live_after = pilot.clock() - pilot.options.skew_seconds
    unknown: list[dict[str, Any]] = []
    unchecked: list[str] = []
    for name, target in pilot.targets.items():
        try:
            stamps = target.stamps(pilot.incarnation, live_after)
        except Exception:  # an unreachable target cannot vouch either way
            unchecked.append(name)
            continue
        for stamp in stamps:
            if not _knows(pilot, stamp):
                unknown.append({"target": name, **stamp})
    if not unknown:
        return None
    old = pilot.incarnation
    new = pilot.ledger.rotate_incarnation(pilot.clock())
    finding = {"finding": "ledger_regressed", "old_incarnation": old,
               "new_incarnation": new, "pilot_id": pilot.pilot_id,
               "unknown_stamps": unknown, "unchecked_targets": unchecked}
    if pilot.logbook is not None:
        pilot.logbook.append("finding.ledger_regressed", f"finding/rotate/{old}", finding)
    return finding

def _knows(pilot: Pilot, stamp: dict[str, Any]) -> bool:
    """Whether the ledger holds the attempt a stamp names — or held it and reaped it.

    A reaped nonce keeps its final attempt number, so its stamps stay known
    (a reap is not a regression, even once a wider skew allowance makes the
    marque look live again); a ledger restored from before the reap has
    neither the entries nor the record, and is still caught.
    """
    held = {a.attempt for a in pilot.ledger.attempts(stamp["marque_id"], stamp["nonce"])}
    if held:
        return stamp["attempt"] in held
    reaped = pilot.ledger.reaped(stamp["marque_id"], stamp["nonce"])
    return reaped is not None and stamp["attempt"] <= reaped.attempt
