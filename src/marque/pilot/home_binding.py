"""Which home a ledger belongs to: a copied or moved home is never silently shared.

A ledger is one Pilot's memory of what it has spent. Two homes running on one
ledger, or on two copies of one ledger (the same incarnation), would each
honour the same marque: budgets and the nonce fence hold per ledger only. So
a ledger records the home it belongs to — a random ``home_id``, also kept in
``pilot.json``, and the home's resolved path — and a Pilot opened from
anywhere else is refused with ``home_mismatch`` until an operator says what
happened:

* a **move** (the whole home, ``mv``): ``marque pilot move --home NEW``
  rebinds the ledger to the new path, and only once the old path no longer
  holds this home — never two homes on one incarnation;
* a **copy**: the copy gets a ledger of its own (``pilot init`` after its
  copied ledger is removed, a new incarnation), or is deleted.

Ledgers made before homes were bound carry no binding; the first home that
opens one binds it, and writes its ``home_id`` into its ``pilot.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from marque.dsn import is_relative_sqlite, is_sqlite, redact, relative_to, sqlite_path
from marque.errors import Conflict, HomeMismatch, InvalidInput, LedgerMissing, LedgerNotDurable
from marque.ledger import Ledger, open_ledger
from marque.ledger.roles import HomeRole
from marque.pilot.config import DEFAULT_LEDGER_DSN, LEDGER_FILE, PilotConfig
from marque.pilot.home import PilotHome

log = logging.getLogger(__name__)


def new_home_id() -> str:
    """A fresh random home id (it names a home, never a secret)."""
    return "home_" + uuid.uuid4().hex


def open_bound_ledger(pilot_home: PilotHome, config: PilotConfig) -> Ledger:
    """The home's ledger, opened only if it belongs to this home (else ``HomeMismatch``)."""
    dsn = pilot_home.ledger_dsn(config)
    try:
        ledger = open_ledger(dsn)
    except LedgerMissing as exc:
        old = _legacy_moved_from(pilot_home, config)
        if old is not None:
            raise _moved(pilot_home, old) from exc
        raise
    try:
        check_binding(pilot_home, config, ledger)
        check_durability(ledger, config, redact(dsn))
    except BaseException:
        ledger.close()
        raise
    return ledger


def check_durability(ledger: HomeRole, config: PilotConfig, where: str) -> None:
    """Refuse a ledger whose engine would not keep a commit through a crash (DESIGN §5).

    ``ledger_not_durable`` names every setting that falls short and how to fix
    it; with ``"durability": "warn"`` in ``pilot.json`` the same words are
    logged as a warning (on stderr, at every start) and the Pilot runs.
    """
    found = ledger.durability()
    if found.durable:
        return
    settings = ", ".join(f"{name} = {value}" for name, value in found.settings.items())
    message = (f"the ledger {where} is not durable ({settings}): "
               + "; ".join(found.problems) + ". " + _FIX[found.engine])
    if config.durability == "warn":
        log.warning("warning: ledger_not_durable: %s (running anyway: pilot.json says "
                    '"durability": "warn")', message, extra={"code": "ledger_not_durable"})
        return
    raise LedgerNotDurable(
        message + ' To run on it anyway, set "durability": "warn" in pilot.json.',
        detail=found.to_dict())


_FIX = {
    "postgresql": ("Turn fsync on in postgresql.conf and make synchronous_commit on (or local) "
                   "for the ledger's database and role, e.g. ALTER DATABASE … SET "
                   "synchronous_commit = on, then start the Pilot again."),
    "sqlite": ("Put the ledger on a local file system that supports SQLite's WAL mode, then "
               "start the Pilot again."),
}


def check_binding(pilot_home: PilotHome, config: PilotConfig, ledger: HomeRole) -> None:
    """Refuse a ledger that belongs to another Pilot or another home (``HomeMismatch``)."""
    here = pilot_home.where()
    _same_pilot(pilot_home, config, ledger)
    binding = ledger.home_binding()
    if binding is None:  # a ledger made before homes were bound: the first home claims it
        binding = ledger.bind_home(config.home_id or new_home_id(), here, now=time.time())
    if config.home_id is not None and binding["home_id"] != config.home_id:
        raise _foreign(pilot_home, config, binding)
    if binding["home_path"] != here:
        if holds(binding["home_path"], binding["home_id"]):
            raise _copy(pilot_home, config, binding["home_path"])
        raise _moved(pilot_home, binding["home_path"])
    if config.home_id is None:
        _adopt_legacy(pilot_home, config, binding["home_id"])


def holds(path: str, home_id: str) -> bool:
    """Whether the home at ``path`` still holds home ``home_id`` with a ledger to run on.

    Read leniently: this looks at *another* home, whose problems are not this
    one's. A home whose ``pilot.json`` predates home ids is assumed to hold it.
    """
    other = PilotHome(path)
    try:
        data = json.loads(other.config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("home_id") not in (None, home_id):
        return False
    ledger = data.get("ledger", DEFAULT_LEDGER_DSN)
    if isinstance(ledger, str) and is_sqlite(ledger):
        return Path(sqlite_path(other.resolve(ledger))).exists()
    return True


def move_home(home: str | os.PathLike[str]) -> dict[str, Any]:
    """Acknowledge that the home now at ``home`` was moved there: rebind its ledger.

    Refused while the old path still holds this home (that is a copy, and two
    homes must never run on one incarnation). Moving an already bound home is a
    no-op (``moved_from`` is None). Returns ``{pilot_id, incarnation, home,
    moved_from, ledger}``.
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    here = pilot_home.where()
    legacy_from = _legacy_moved_from(pilot_home, config)
    if legacy_from is not None:
        config.ledger = DEFAULT_LEDGER_DSN  # an old home named its own ledger by absolute path
    dsn = pilot_home.ledger_dsn(config)
    ledger = open_ledger(dsn)
    try:
        _same_pilot(pilot_home, config, ledger)
        binding = ledger.home_binding()
        moved_from: str | None = None
        if binding is None:
            binding = ledger.bind_home(config.home_id or new_home_id(), here, now=time.time())
            moved_from = legacy_from
        if config.home_id is not None and binding["home_id"] != config.home_id:
            raise _foreign(pilot_home, config, binding)
        if binding["home_path"] != here:
            old = binding["home_path"]
            if holds(old, binding["home_id"]):
                raise HomeMismatch(
                    f"the Pilot home at {old} still holds this Pilot and its ledger; a move "
                    f"leaves one home behind, never two. Delete {old} (or give one of the two "
                    "homes a ledger of its own with `marque pilot init`), then move again"
                )
            binding = ledger.bind_home(binding["home_id"], here, now=time.time(), moved_from=old)
            if binding.get("home_path") != here:
                raise Conflict(f"the ledger was rebound to {binding.get('home_path')} while this "
                               "move ran; check which home is the Pilot's and move again")
            moved_from = old
        config.home_id = binding["home_id"]
        config.ledger = relative_to(config.ledger, here)
        pilot_home.save(config)
        return {"pilot_id": ledger.pilot_id, "incarnation": ledger.incarnation, "home": here,
                "moved_from": moved_from, "ledger": redact(config.ledger)}
    finally:
        ledger.close()


# -- what went wrong, and what to do ---------------------------------------------------


def _same_pilot(pilot_home: PilotHome, config: PilotConfig, ledger: HomeRole) -> None:
    if ledger.pilot_id != config.pilot_id:
        raise HomeMismatch(
            f"{pilot_home.config_path} is Pilot {config.pilot_id}'s, but its ledger "
            f"({redact(pilot_home.ledger_dsn(config))}) belongs to Pilot {ledger.pilot_id}: "
            "pilot.json points at another Pilot's ledger. Point \"ledger\" back at this "
            "Pilot's own ledger; nothing ran"
        )


def _foreign(pilot_home: PilotHome, config: PilotConfig, binding: dict[str, str]) -> HomeMismatch:
    return HomeMismatch(
        f"the ledger {redact(pilot_home.ledger_dsn(config))} belongs to the Pilot home at "
        f"{binding['home_path']}, not to {pilot_home.where()}: two homes must never run on one "
        f"ledger. Run this Pilot from {binding['home_path']}, or give this home its own ledger "
        f"with `marque pilot init --home {pilot_home.path} --pilot-id {config.pilot_id} "
        "--ledger DSN`; nothing ran",
        detail={"bound_home": binding["home_path"]},
    )


def _copy(pilot_home: PilotHome, config: PilotConfig, original: str) -> HomeMismatch:
    here = pilot_home.where()
    if is_relative_sqlite(config.ledger):
        ledger_file = sqlite_path(pilot_home.ledger_dsn(config))
        what = (f"{here} is a copy of the Pilot home at {original}: its ledger ({ledger_file}) is "
                "a clone of that home's ledger, the same incarnation, and running both would "
                "let one marque spend its budget twice.")
        fix = (f"Use {original}, or make this copy a Pilot of its own: delete {ledger_file} and "
               f"run `marque pilot init --home {pilot_home.path} --pilot-id {config.pilot_id}` "
               "(a new incarnation).")
    else:
        what = (f"{here} and the Pilot home at {original} use the same ledger "
                f"({redact(pilot_home.ledger_dsn(config))}); two homes must never run on one "
                "ledger.")
        fix = (f"Use {original}, or give this home its own ledger with `marque pilot init "
               f"--home {pilot_home.path} --pilot-id {config.pilot_id} --ledger DSN`.")
    return HomeMismatch(
        f"{what} {fix} If this home is to replace {original}, delete {original} first, then "
        f"run `marque pilot move --home {pilot_home.path}`. Nothing ran",
        detail={"bound_home": original},
    )


def _moved(pilot_home: PilotHome, old: str) -> HomeMismatch:
    return HomeMismatch(
        f"this Pilot home was moved (or restored) from {old} to {pilot_home.where()}, and its "
        f"ledger still names {old}. If the move was deliberate, acknowledge it with "
        f"`marque pilot move --home {pilot_home.path}`; nothing runs until then",
        detail={"bound_home": old},
    )


# -- homes made before ledgers were bound -----------------------------------------------


def refuse_unacknowledged_legacy_move(pilot_home: PilotHome, config: PilotConfig) -> None:
    """``HomeMismatch`` if this old-style home (absolute ledger path) was moved."""
    old = _legacy_moved_from(pilot_home, config)
    if old is not None:
        raise _moved(pilot_home, old)


def _legacy_moved_from(pilot_home: PilotHome, config: PilotConfig) -> str | None:
    """The old path of a moved home whose pilot.json names its own ledger absolutely."""
    if not is_sqlite(config.ledger) or is_relative_sqlite(config.ledger):
        return None
    old = Path(sqlite_path(config.ledger))
    if old.name != LEDGER_FILE or old.exists() or not pilot_home.default_ledger_path.exists():
        return None
    if str(old.parent) == pilot_home.where():
        return None
    return str(old.parent)


def _adopt_legacy(pilot_home: PilotHome, config: PilotConfig, home_id: str) -> None:
    """Write the home id (and a home-relative ledger path) into an old pilot.json."""
    config.home_id = home_id
    config.ledger = relative_to(config.ledger, pilot_home.where())
    # Best effort: the binding is already in the ledger, which is what refuses copies;
    # a read-only pilot.json only means the next open tries again.
    with contextlib.suppress(InvalidInput):
        pilot_home.save(config)
