"""Setting up and inspecting a Pilot's home: init, trust, targets, show, move.

The CLI (``marque pilot …``) and the demo share these. Each one either does
all of its work or leaves the home as it found it: a failed ``init`` removes
what it created (never what was there before).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from marque.dsn import (
    check_shape,
    redact,
    relative_to,
    require_postgres_support,
    resolve_sqlite,
)
from marque.errors import HomeMismatch, InvalidInput, LedgerExists, NotFound, RowKeyInvalid
from marque.ledger import Ledger, create_ledger, open_ledger
from marque.ledger.roles import HomeRole
from marque.madedirs import MadeDirectories
from marque.pilot.config import (
    DEFAULT_LEDGER_DSN,
    PilotConfig,
    check_name,
    check_row_key,
    sqlite_file,
)
from marque.pilot.home import PilotHome
from marque.pilot.home_binding import (
    holds,
    move_home,
    new_home_id,
    open_bound_ledger,
    refuse_unacknowledged_legacy_move,
)
from marque.pilot.join import join
from marque.pilot.reach import check_reachable, probe_table
from marque.pilot.report_key import ensure_report_key

__all__ = [
    "add_target",
    "init_home",
    "join",
    "list_targets",
    "move_home",
    "rebind_target",
    "remove_target",
    "show_pilot",
    "trust_issuer",
    "untrust_issuer",
]

#: Files SQLite may leave next to a database it created.
_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def init_home(
    home: str | os.PathLike[str], pilot_id: str, ledger_dsn: str | None = None
) -> dict[str, Any]:
    """Create a Pilot's ledger (a fresh incarnation); returns ``{pilot_id, incarnation, adopted}``.

    Refuses a ledger that already exists, and a home that belongs to another
    Pilot id. A home whose ledger was lost keeps its targets and trust and gets
    a new incarnation — which every marque pinned to the old one will notice.
    A home whose ``pilot.json`` was lost while its ledger was not is re-adopted
    (``adopted: true``: same incarnation, nothing spent is forgotten) once the
    pilot id matches the ledger's; its targets and issuers must be added again.

    A relative ``--ledger`` SQLite path is the caller's working directory's;
    one inside the home is stored relative to it, so the home can move.
    """
    check_name(pilot_id, "pilot id")
    if ledger_dsn is not None:
        check_shape(ledger_dsn, "the ledger DSN")
        require_postgres_support(ledger_dsn)  # before anything is made
        ledger_dsn = resolve_sqlite(ledger_dsn, Path.cwd())
    pilot_home = PilotHome(home)
    config = _existing_config(pilot_home, home, pilot_id, moving=ledger_dsn is None)
    stored, dsn, ledger_file = _ledger_location(pilot_home, config, ledger_dsn)
    made = _Made(pilot_home, ledger_file)
    try:
        made.home_dir()
        result = _make_ledger(pilot_home, pilot_id, config, stored, dsn)
    except BaseException:
        made.undo()
        raise
    return result


def _existing_config(pilot_home: PilotHome, home: str | os.PathLike[str], pilot_id: str, *,
                     moving: bool) -> PilotConfig | None:
    """The home's ``pilot.json`` if it has one, refused if it is another Pilot's (or, when
    no ``--ledger`` is given, if its old ledger moved without being acknowledged)."""
    config = pilot_home.load() if pilot_home.exists() else None
    if config is not None and config.pilot_id != pilot_id:
        raise LedgerExists(
            f"{home} belongs to Pilot {config.pilot_id}; refusing to re-initialise it as "
            f"{pilot_id}"
        )
    if config is not None and moving:
        # Its old ledger is in the home under a new path: a move to acknowledge, not to init.
        refuse_unacknowledged_legacy_move(pilot_home, config)
    return config


def _ledger_location(pilot_home: PilotHome, config: PilotConfig | None,
                     ledger_dsn: str | None) -> tuple[str, str, Path | None]:
    """Where the ledger goes: its DSN as stored in ``pilot.json`` (relative to the home when
    inside it), resolved, and its SQLite file (None for PostgreSQL)."""
    here = pilot_home.where()
    if ledger_dsn is not None:
        stored = relative_to(ledger_dsn, here)
    else:
        stored = config.ledger if config is not None else DEFAULT_LEDGER_DSN
    dsn = pilot_home.resolve(stored)
    ledger_file = sqlite_file(dsn)
    if (ledger_file is not None and not ledger_file.parent.is_dir()
            and ledger_file.parent != Path(here)):
        raise InvalidInput(
            f"the ledger's directory {ledger_file.parent} does not exist; create it first, or "
            "leave out --ledger for a ledger inside the home"
        )
    return stored, dsn, ledger_file


def _make_ledger(pilot_home: PilotHome, pilot_id: str, config: PilotConfig | None,
                 stored: str, dsn: str) -> dict[str, Any]:
    """Create (or adopt) the ledger, bind it to the home and save ``pilot.json``."""
    ledger, adopted = _create_or_adopt(dsn, pilot_id, config, pilot_home)
    try:
        home_id = _bind(ledger, pilot_home, adopted)
        result = {"pilot_id": ledger.pilot_id, "incarnation": ledger.incarnation,
                  "adopted": adopted}
    finally:
        ledger.close()
    config = config or PilotConfig(pilot_id=pilot_id)
    config.ledger = stored
    config.home_id = home_id
    pilot_home.save(config)
    ensure_report_key(pilot_home)
    return result


def _create_or_adopt(
    dsn: str, pilot_id: str, config: PilotConfig | None, pilot_home: PilotHome
) -> tuple[Ledger, bool]:
    """A new ledger at ``dsn``, or the existing one when only pilot.json was lost."""
    try:
        return create_ledger(dsn, pilot_id), False
    except LedgerExists as exc:
        if config is not None:
            raise LedgerExists(
                f"{pilot_home.path} already has a ledger ({redact(dsn)}); `pilot init` never "
                "overwrites one. Its identity is in `marque pilot show`"
            ) from exc
        found = exc
    ledger = open_ledger(dsn)
    if ledger.pilot_id != pilot_id:
        ledger.close()
        raise LedgerExists(
            f"the ledger {redact(dsn)} belongs to Pilot {ledger.pilot_id}, not {pilot_id}; to "
            f"re-adopt it, run `marque pilot init --home {pilot_home.path} --pilot-id "
            f"{ledger.pilot_id}`"
        ) from found
    return ledger, True


def _bind(ledger: HomeRole, pilot_home: PilotHome, adopted: bool) -> str:
    """Bind the ledger to this home; returns the home id for pilot.json."""
    here = pilot_home.where()
    now = time.time()
    if not adopted:
        return ledger.bind_home(new_home_id(), here, now=now)["home_id"]
    binding = ledger.home_binding()
    if binding is None:
        binding = ledger.bind_home(new_home_id(), here, now=now)
    if binding["home_path"] != here:
        if holds(binding["home_path"], binding["home_id"]):
            raise HomeMismatch(
                f"this ledger belongs to the Pilot home at {binding['home_path']}, which still "
                f"uses it; two homes must never run on one ledger. Run the Pilot from "
                f"{binding['home_path']}, or give {pilot_home.path} a ledger of its own",
                detail={"bound_home": binding["home_path"]},
            )
        binding = ledger.bind_home(binding["home_id"], here, now=now,
                                   moved_from=binding["home_path"])
    return binding["home_id"]


class _Made:
    """What ``init`` created, so that a failed init removes exactly that."""

    def __init__(self, pilot_home: PilotHome, ledger_file: Path | None) -> None:
        self._home = pilot_home
        self._ledger_file = ledger_file
        self._ledger_existed = ledger_file is not None and any(
            Path(f"{ledger_file}{suffix}").exists() for suffix in _SQLITE_SIDE_FILES)
        self._dirs = MadeDirectories(pilot_home.path)

    def home_dir(self) -> None:
        """Create the home directory (and missing parents), remembering the topmost one."""
        top = self._dirs.note()
        if self._home.make_dir():
            self._dirs.created(top)

    def undo(self) -> None:
        """Remove the ledger file and directories this init created, nothing else."""
        if self._ledger_file is not None and not self._ledger_existed:
            for suffix in _SQLITE_SIDE_FILES:
                # Cleaning up must never hide why init failed.
                with contextlib.suppress(OSError):
                    Path(f"{self._ledger_file}{suffix}").unlink(missing_ok=True)
        # Only directories made by this init, and only if nothing else landed in them.
        self._dirs.undo()


def trust_issuer(home: str | os.PathLike[str], jwk: dict[str, Any]) -> str:
    """Trust an issuer key (its public part only); returns its kid."""
    from marque.token import TrustedKeys

    pilot_home = PilotHome(home)
    config = pilot_home.load()
    trusted = TrustedKeys(config.issuers)
    kid = trusted.add(jwk)
    config.issuers = trusted.to_jwks()["keys"]
    pilot_home.save(config)
    return kid


def untrust_issuer(home: str | os.PathLike[str], kid: str) -> dict[str, Any]:
    """Stop trusting the issuer key ``kid``; returns ``{kid, trusted: [kids left]}``.

    Marques that key signed are refused from now on (``marque_invalid``); what
    already ran stays recorded. An unknown kid is ``not_found``.
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    kept = [jwk for jwk in config.issuers if jwk.get("kid") != kid]
    if len(kept) == len(config.issuers):
        known = ", ".join(str(jwk.get("kid")) for jwk in config.issuers) or "none"
        raise NotFound(f"no trusted issuer key {kid} in {pilot_home.path} (trusted: {known})")
    config.issuers = kept
    pilot_home.save(config)
    return {"kid": kid, "trusted": [jwk.get("kid") for jwk in kept]}


def add_target(
    home: str | os.PathLike[str], name: str, dsn: str, *, check: bool = True
) -> dict[str, Any]:
    """Add or repoint a target this Pilot serves; returns what was stored.

    A relative SQLite path is resolved against the caller's working directory
    and stored absolute (``resolved_from`` then holds what was given). With
    ``check`` (the default) the target must answer first — the file exists and
    is a database, or PostgreSQL accepts a connection — else
    ``TargetUnavailable``; ``check=False`` is for a target down on purpose.
    Returns ``{target, dsn, checked, resolved_from}`` with passwords redacted.
    """
    check_name(name, "a target name")
    check_shape(dsn, f"target {name}'s DSN")
    require_postgres_support(dsn)  # even unchecked: no Pilot here could ever reach it
    stored = resolve_sqlite(dsn, Path.cwd())
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    if check:
        check_reachable(name, stored)
    config.targets[name] = stored
    pilot_home.save(config)
    return {"target": name, "dsn": redact(stored), "checked": check,
            "resolved_from": redact(dsn) if stored != dsn else None}


def set_row_key(home: str | os.PathLike[str], target: str, table: str,
                columns: list[str] | None, *, check: bool = True) -> dict[str, Any]:
    """Declare (or, with ``columns`` None, withdraw) the row key of ``table`` on ``target``.

    Previews then key that table's row images by ``columns`` when the table has no
    key of its own (``pilot.json``'s ``row_keys``). With ``check`` (the default) the
    target is asked first: the table and every column must exist (``row_key_invalid``
    otherwise), and a column is stored as the target spells it. Nothing is written
    unless every check passed. Returns ``{target, table, columns, checked, own_key,
    own_key_source, used}``: ``used`` is False when the table has a key of its own,
    which previews keep using (or after a withdrawal).
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    if target not in config.targets:
        known = ", ".join(sorted(config.targets)) or "none"
        raise NotFound(f"{pilot_home.path} has no target {target} (targets: {known})")
    declared = config.row_keys.get(target, {})
    if columns is None:
        if table not in declared:
            listed = ", ".join(sorted(declared)) or "none"
            raise NotFound(f"target {target} has no row key declared for {table} "
                           f"(declared: {listed})")
        del declared[table]
        if not declared:
            config.row_keys.pop(target, None)
        pilot_home.save(config)
        return {"target": target, "table": table, "columns": None, "checked": False,
                "own_key": None, "own_key_source": None, "used": False}
    table, columns = check_row_key(table, columns, "the row key")
    shape = None
    if check:
        shape = probe_table(target, pilot_home.resolve(config.targets[target]), table)
        if shape is None:
            raise RowKeyInvalid(f"target {target} has no table {table}; nothing was written",
                                detail={"rule": "table_missing", "table": table})
        columns = _as_spelled(target, table, columns, shape["columns"])
    declared[table] = columns
    config.row_keys[target] = declared
    pilot_home.save(config)
    own = shape["key"] if shape else None
    return {"target": target, "table": table, "columns": columns, "checked": check,
            "own_key": own or None, "own_key_source": shape["key_source"] if shape else None,
            "used": not own}


def _as_spelled(target: str, table: str, columns: list[str], known: list[str]) -> list[str]:
    """``columns`` as the table spells them: exactly, else the one column equal but for
    case; any other is ``row_key_invalid`` naming what is missing."""
    spelled: list[str] = []
    missing: list[str] = []
    for column in columns:
        if column in known:
            spelled.append(column)
            continue
        alike = [k for k in known if k.lower() == column.lower()]
        if len(alike) == 1:
            spelled.append(alike[0])
        else:
            missing.append(column)
    if missing:
        raise RowKeyInvalid(
            f"table {table} on target {target} has no column {', '.join(missing)} (its "
            f"columns: {', '.join(known)}); nothing was written",
            detail={"rule": "column_missing", "missing": missing, "columns": known})
    return spelled


def remove_target(home: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """Stop serving target ``name``; returns ``{target, dsn}``. Unknown name → ``not_found``.

    Marques for it are refused from then on (``unknown_target``); its stamp
    table and data stay where they are.
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    if name not in config.targets:
        known = ", ".join(sorted(config.targets)) or "none"
        raise NotFound(f"{pilot_home.path} has no target {name} (targets: {known})")
    dsn = config.targets.pop(name)
    # What pilot.json says of the target goes with it (a load refuses a name without one).
    config.row_keys.pop(name, None)
    config.previews.pop(name, None)
    pilot_home.save(config)
    return {"target": name, "dsn": redact(dsn)}


def list_targets(home: str | os.PathLike[str]) -> dict[str, str]:
    """The targets this Pilot serves: ``{name: DSN}``, resolved, passwords redacted."""
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    return {name: redact(pilot_home.resolve(dsn)) for name, dsn in sorted(config.targets.items())}


def show_pilot(home: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything an operator needs to issue for and run this Pilot, secrets redacted.

    ``{pilot_id, incarnation, home, ledger, targets: {name: dsn}, issuers: [kid…],
    settings: {…}, row_keys: {target: {table: [column…]}}}``, and ``harbour: {url,
    pilot_url}`` once it joined a Harbourmaster (never its token). The ledger is
    opened (its identity is the incarnation), so a home that is not its ledger's is
    ``home_mismatch`` here too.
    """
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    ledger = open_bound_ledger(pilot_home, config)
    try:
        identity = {"pilot_id": ledger.pilot_id, "incarnation": ledger.incarnation}
        bindings = {b.target: {"target_id": b.target_id, "location": b.location}
                    for b in ledger.target_bindings()}
    finally:
        ledger.close()
    shown = {
        **identity,
        "home": pilot_home.where(),
        "ledger": redact(pilot_home.ledger_dsn(config)),
        "targets": {name: redact(pilot_home.resolve(dsn))
                    for name, dsn in sorted(config.targets.items())},
        "target_bindings": bindings,
        "issuers": [str(jwk.get("kid")) for jwk in config.issuers],
        "settings": config.settings.to_dict(),
        "row_keys": {name: dict(sorted(tables.items()))
                     for name, tables in sorted(config.row_keys.items())},
    }
    if config.harbour is not None:
        shown["harbour"] = {"url": config.harbour.url, "pilot_url": config.harbour.pilot_url}
    return shown


def rebind_target(home: str | os.PathLike[str], name: str, *,
                  pin_unsettled: bool = False) -> dict[str, Any]:
    """Accept that target ``name`` now points at another database (docs/model.md, "A
    target's identity"): the ledger's binding moves to the identity found there.

    The target is read (its stamp table made if it has none). A name already bound to
    what it points at changes nothing (``rebound: false``). Attempts still unsettled on
    the name refuse the rebinding (``target_unsettled``, listing them) unless
    ``pin_unsettled``: then each stays bound to the database it was sent to, never
    tombstoned anywhere else. Returns ``{target, target_id, location, rebound,
    rebound_from, pinned: [{marque_id, nonce, attempt}]}``.
    """
    from marque.target import open_target

    pilot_home = PilotHome(home)
    config = pilot_home.load()
    if name not in config.targets:
        known = ", ".join(sorted(config.targets)) or "none"
        raise NotFound(f"{pilot_home.path} has no target {name} (targets: {known})")
    target = open_target(name, pilot_home.resolve(config.targets[name]),
                         lock_timeout_ms=config.settings.lock_timeout_ms,
                         statement_timeout_ms=config.settings.statement_timeout_ms)
    ledger = open_bound_ledger(pilot_home, config)
    try:
        found = target.identity()
        now = time.time()
        binding = ledger.bind_target(name, found, target.location(), now=now)
        pinned: list[dict[str, Any]] = []
        rebound = binding.target_id != found
        if rebound:
            binding, pins = ledger.rebind_target(
                name, seen_id=binding.target_id, target_id=found, location=target.location(),
                now=now, pin_unsettled=pin_unsettled)
            pinned = [{"marque_id": p.marque_id, "nonce": p.nonce, "attempt": p.attempt}
                      for p in pins]
    finally:
        ledger.close()
        target.close()
    return {"target": name, "target_id": binding.target_id, "location": binding.location,
            "rebound": rebound, "rebound_from": binding.rebound_from if rebound else None,
            "pinned": pinned}
