"""What every part of a Pilot works with: its collaborators, in one object.

A Pilot is a facade (:mod:`marque.pilot.core`) over parts that each own one
concern and their own state — execution (:mod:`marque.pilot.execution`),
recording what an execution observed (:mod:`marque.pilot.recording`),
continuity (:mod:`marque.pilot.continuity`), reconciliation
(:mod:`marque.pilot.reconciliation`), reporting (:mod:`marque.pilot.reporting`),
Effect Sets (:mod:`marque.pilot.effects`) and settle-behind
(:mod:`marque.pilot.settle_behind`). None of them knows the facade: each is given
a :class:`PilotContext`, and the parts it calls, when :func:`marque.pilot.open_pilot`
wires the Pilot together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from marque.ledger import Ledger
from marque.pilot.config import Settings
from marque.pilot.processes import ProcessRegistry
from marque.target import Target
from marque.token import TrustedKeys


class PilotLogbook(Protocol):
    """What the Pilot's parts write to its logbook (``marque.logbook.embedded.Logbook``):
    entries, each once per key."""

    def append(self, kind: str, key: str, body: dict[str, Any]) -> bool:
        """Append one entry once per ``key``; False if that key is already there."""

    def append_all(self, entries: list[tuple[str, str, dict[str, Any]]]) -> int:
        """Append entries ``(kind, key, body)`` in one transaction; how many were new."""

    def close(self) -> None:
        """Close it."""


@dataclass
class PilotOptions(Settings):
    """How strict and how patient a Pilot is: its :class:`Settings` (the one definition,
    read from ``pilot.json``), plus how this process runs it."""

    #: Report each outcome before ``execute`` returns (CLI); else a background
    #: reporter delivers the outbox off the execution path (long-running Pilots).
    report_inline: bool = True


@dataclass(eq=False)
class PilotContext:
    """A Pilot's collaborators: its ledger, targets, trusted issuer keys, settings, process
    registry, logbook and clock, and the identity each target name stands for.

    Not frozen: ``clock`` and ``logbook`` may be replaced on a running Pilot (tests hold a
    clock still; every part reads them from here on each use, never keeps a copy).
    """

    ledger: Ledger
    targets: dict[str, Target]
    trusted: TrustedKeys
    options: PilotOptions = field(default_factory=PilotOptions)
    processes: ProcessRegistry = field(default_factory=lambda: ProcessRegistry(None))
    logbook: PilotLogbook | None = None
    clock: Callable[[], float] = time.time
    #: The identity each target name stands for in the ledger (ledger/bindings.py); kept
    #: current by the continuity check, read by everything that addresses a target.
    target_ids: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.target_ids:
            self.target_ids = {binding.target: binding.target_id
                               for binding in self.ledger.target_bindings()}

    @property
    def pilot_id(self) -> str:
        """This Pilot's id (its ledger's)."""
        return self.ledger.pilot_id

    @property
    def incarnation(self) -> str:
        """The ledger's incarnation now (a continuity rotation changes it)."""
        return self.ledger.incarnation

    def target_id_for(self, target: str, marque_id: str, nonce: str) -> str | None:
        """The identity of the database a nonce's attempts on ``target`` were sent to: the
        pin a rebinding left on it, else the ledger's binding of the name (None: unknown)."""
        pinned = self.ledger.pinned_attempt(marque_id, nonce)
        return pinned.target_id if pinned is not None else self.target_ids.get(target)
