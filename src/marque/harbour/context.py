"""What every part of the Harbourmaster's core works with (DESIGN §11).

The facade (:class:`marque.harbour.service.Harbourmaster`) builds one
:class:`HarbourContext` and hands it to each part — submission, preparation,
approvals, expiry, reading — so no part reaches back up into the facade and
every part sees the same store, issuer key, clock and way to a Pilot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from marque.clients.pilot import PilotQueries
from marque.errors import InvalidInput, NotFound
from marque.harbour.issuance import Issuer
from marque.harbour.store.base import HarbourStore, PilotRecord

__all__ = ["HarbourContext"]


@dataclass(frozen=True)
class HarbourContext:
    """The Harbourmaster's collaborators: its store, its issuer, its clock, and how it
    makes a client for a Pilot's URL (anything that asks what :class:`PilotQueries`
    asks: the HTTP client in service, an in-process Pilot in tests)."""

    store: HarbourStore
    issuer: Issuer
    clock: Callable[[], float]
    pilot_client_factory: Callable[[str], PilotQueries]

    def now(self) -> float:
        """The clock's time, as a float."""
        return float(self.clock())

    def pilot(self, pilot_id: str) -> PilotRecord:
        """The registered Pilot ``pilot_id``; ``input_invalid`` when none is registered."""
        try:
            return self.store.get_pilot(pilot_id)
        except NotFound:
            raise InvalidInput(f"no Pilot {pilot_id[:64]!r} is registered with this "
                               "Harbourmaster", detail={"pilot_id": pilot_id[:64]}) from None
