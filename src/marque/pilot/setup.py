"""Setting up a Pilot's home: init, trust, targets. The CLI and the demo share these."""

from __future__ import annotations

import os
import re
from typing import Any

from marque.errors import InvalidInput, LedgerExists
from marque.ledger import create_ledger
from marque.pilot.config import PilotConfig, PilotHome
from marque.target import check_dsn
from marque.token import TrustedKeys

_TARGET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def init_home(
    home: str | os.PathLike[str], pilot_id: str, ledger_dsn: str | None = None
) -> dict[str, str]:
    """Create a Pilot's ledger (a fresh incarnation); returns ``{pilot_id, incarnation}``.

    Refuses a ledger that already exists, and a home that belongs to another
    Pilot id. A home whose ledger was lost keeps its targets and trust and gets
    a new incarnation — which every marque pinned to the old one will notice.
    """
    if not pilot_id.strip() or len(pilot_id) > 128:
        raise InvalidInput("pilot id must be 1..128 characters")
    pilot_home = PilotHome(home)
    config = pilot_home.load() if pilot_home.exists() else None
    if config is not None and config.pilot_id != pilot_id:
        raise LedgerExists(
            f"{home} belongs to Pilot {config.pilot_id!r}; refusing to re-initialise it as "
            f"{pilot_id!r}"
        )
    pilot_home.path.mkdir(parents=True, exist_ok=True)
    dsn = ledger_dsn or (config.ledger if config else pilot_home.default_ledger_dsn())
    ledger = create_ledger(dsn, pilot_id)
    result = {"pilot_id": ledger.pilot_id, "incarnation": ledger.incarnation}
    ledger.close()
    config = config or PilotConfig(pilot_id=pilot_id, ledger=dsn)
    config.ledger = dsn
    pilot_home.save(config)
    return result


def trust_issuer(home: str | os.PathLike[str], jwk: dict[str, Any]) -> str:
    """Trust an issuer key (its public part only); returns its kid."""
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    trusted = TrustedKeys(config.issuers)
    kid = trusted.add(jwk)
    config.issuers = trusted.to_jwks()["keys"]
    pilot_home.save(config)
    return kid


def add_target(home: str | os.PathLike[str], name: str, dsn: str) -> None:
    """Add or repoint a target this Pilot serves."""
    if not _TARGET_NAME.fullmatch(name):
        raise InvalidInput("target names are 1..64 of A-Z a-z 0-9 _ . -")
    check_dsn(dsn)
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    config.targets[name] = dsn
    pilot_home.save(config)
