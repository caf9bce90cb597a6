"""The Pilot: the executor that sits next to the target database.

:func:`open_pilot` is the one place that wires a Pilot from its home: ledger,
targets, trusted issuer keys, process registry and logbook go into its
:class:`~marque.pilot.context.PilotContext`, and :class:`~marque.pilot.core.Pilot`
(the facade) builds its parts over that context.
"""

from __future__ import annotations

import os

from marque.logbook.embedded import Logbook
from marque.pilot.background import start_background
from marque.pilot.config import PilotConfig, Settings
from marque.pilot.context import PilotContext, PilotOptions
from marque.pilot.core import Pilot
from marque.pilot.execution import check_nonce
from marque.pilot.home import PilotHome
from marque.pilot.home_binding import open_bound_ledger
from marque.pilot.processes import ProcessRegistry
from marque.target import open_target
from marque.token import TrustedKeys

__all__ = [
    "Pilot",
    "PilotConfig",
    "PilotContext",
    "PilotHome",
    "PilotOptions",
    "Settings",
    "check_nonce",
    "open_pilot",
]


def open_pilot(
    home: str | os.PathLike[str], *, recover: bool = True, background: bool = False
) -> Pilot:
    """A Pilot wired from its home directory; by default runs start-up recovery.

    ``pilot.json`` is checked in full first, and the ledger must belong to this
    home (:mod:`marque.pilot.home_binding`): a bad configuration or a copied home is
    refused before anything can be claimed.

    A home joined to a Harbourmaster (``pilot join``) reports there too, whatever
    opens it: its outbox entries are acknowledged only once the Harbourmaster
    took them.

    ``background=True`` is for long-running Pilots: outcome reports leave the
    execution path for a reporter thread, and a reconciler thread settles
    what it can with backoff. Both stop when the Pilot is closed.
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    ledger = open_bound_ledger(pilot_home, config)
    try:
        settings = config.settings
        targets = {
            name: open_target(name, pilot_home.resolve(dsn),
                              lock_timeout_ms=settings.lock_timeout_ms,
                              statement_timeout_ms=settings.statement_timeout_ms,
                              row_keys=config.row_keys.get(name))
            for name, dsn in config.targets.items()
        }
        pilot = Pilot(PilotContext(
            ledger,
            targets,
            TrustedKeys(config.issuers),
            options=PilotOptions(**settings.to_dict()),
            processes=ProcessRegistry(pilot_home.processes_dir),
            logbook=Logbook(str(pilot_home.logbook_path), actor=config.pilot_id),
        ))
    except BaseException:
        ledger.close()
        raise
    if config.harbour is not None:
        # A joined Pilot's outbox is the Harbourmaster's too: every report sink attached
        # before anything reports, or an outcome acknowledged to the logbook alone (a
        # `marque reconcile` while the Harbourmaster is away) would never reach it.
        from marque.pilot.harbour_link import attach_harbour
        from marque.pilot.report_key import load_report_key

        attach_harbour(pilot, config, report_key=load_report_key(pilot_home))
    if recover:
        pilot.check_continuity()
        pilot.recover()
    if background:
        start_background(pilot)
    return pilot
