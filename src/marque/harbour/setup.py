"""Creating and administering a Harbourmaster's home (``marque harbour …``, offline).

These are the operations an operator runs on the Harbourmaster's own machine,
with the home's files as the credential: create the home, add and revoke
principals, check and adopt routing configs. Every change lands in the store's
logbook with the acting operator as its ``actor``.
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marque.dsn import (
    check_shape,
    is_sqlite,
    relative_to,
    require_postgres_support,
    resolve_sqlite,
    sqlite_path,
)
from marque.errors import InvalidInput
from marque.harbour.home import (
    DEFAULT_STORE_DSN,
    HarbourConfig,
    HarbourHome,
    open_home_store,
    write_config,
)
from marque.madedirs import MadeDirectories

if TYPE_CHECKING:
    from marque.harbour.store.base import HarbourStore


def operator() -> str:
    """Who acts when the CLI changes a home: ``cli:<OS user>`` (recorded as ``actor``)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (some containers)
        return f"cli:uid-{os.getuid()}"


def _check_new_home(harbour_home: HarbourHome, store_dsn: str | None) -> None:
    """Refuse a home that already holds a Harbourmaster, or a store DSN that cannot be one,
    before anything is made."""
    if harbour_home.exists():
        raise InvalidInput(f"{harbour_home.path} already holds a Harbourmaster (harbour.json)")
    if harbour_home.path.exists() and not harbour_home.path.is_dir():
        raise InvalidInput(f"{harbour_home.path} exists and is not a directory")
    if store_dsn is not None:
        check_shape(store_dsn, "the store DSN")
        require_postgres_support(store_dsn)


class _Made:
    """What an init has made so far, to take back if it fails half-way."""

    def __init__(self, harbour_home: HarbourHome) -> None:
        self.home = harbour_home
        self.directories = MadeDirectories(harbour_home.path)
        self.store: HarbourStore | None = None
        self.store_file: str | None = None
        self.key_written = False

    def write_key(self) -> dict[str, Any]:
        """A new issuer key, written to the home (0600; the file must not exist yet)."""
        from marque.token import new_key

        key = new_key()
        fd = os.open(self.home.issuer_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.key_written = True  # from here on the file is this init's to remove
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(key, handle, indent=2, sort_keys=True)
            handle.write("\n")
        return key

    def undo(self) -> None:
        """Take back what was made (the store closed, its file and the key removed)."""
        if self.store is not None:
            self.store.close()
        if self.key_written:
            self.home.issuer_key_path.unlink(missing_ok=True)
        if self.store_file is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(self.store_file + suffix).unlink(missing_ok=True)
        self.directories.undo()  # the home, if this init made it and nothing else is in it


def init_harbour(home: str | os.PathLike[str], *, store_dsn: str | None = None,
                 routing_text: str | None = None, admin: str = "admin") -> dict[str, Any]:
    """Create a Harbourmaster: store, issuer key, ``harbour.json``, its first routing config
    and its first principal, ``admin`` (role admin), whose token is returned this once.

    Without ``routing_text`` the bootstrap profile is adopted (reads allowed;
    writes, DDL and anything else delegated to one approver), recorded by its
    CID like any other config — it is never re-materialised from code later.
    The routing config is checked before anything is written.
    """
    from marque.harbour.routing import BOOTSTRAP_PROFILE, parse_config
    from marque.harbour.store import create_store
    from marque.token import public_jwk

    config = BOOTSTRAP_PROFILE if routing_text is None else parse_config(routing_text)
    harbour_home = HarbourHome(home)
    _check_new_home(harbour_home, store_dsn)
    made = _Made(harbour_home)
    try:
        made.directories.make()
    except OSError as exc:
        raise InvalidInput(f"cannot create {harbour_home.path}: {exc.strerror or exc}; choose "
                           "a --home the Harbourmaster can write") from exc
    here = harbour_home.path.resolve()
    try:
        stored = DEFAULT_STORE_DSN if store_dsn is None \
            else relative_to(resolve_sqlite(store_dsn, Path.cwd()), here)
        dsn = resolve_sqlite(stored, here)
        store = made.store = create_store(dsn)
        made.store_file = sqlite_path(dsn) if is_sqlite(dsn) else None
        key = made.write_key()
        store.adopt_routing_config(config.config_cid, config.text, actor=operator())
        _, admin_token = store.add_principal(admin, ["admin"], actor=operator())
        written = HarbourConfig(store.harbour_id, stored, f"marque-harbour:{store.harbour_id}")
        write_config(harbour_home, written)
    except BaseException:
        made.undo()
        raise
    store.close()
    return {
        "harbour_id": written.harbour_id, "home": str(here), "store": stored,
        "issuer_kid": key["kid"], "issuer": {"name": written.issuer, "jwk": public_jwk(key)},
        "admin": admin, "admin_token": admin_token,
        "routing": {"config_cid": config.config_cid, "bootstrap": routing_text is None},
    }


def _public_only(public_jwk: dict[str, Any] | None) -> None:
    if public_jwk is not None and "d" in public_jwk:
        raise InvalidInput("that key file holds a private key: register the public part only "
                           "(`marque keys public`)")


def add_principal(home: str | os.PathLike[str], name: str, roles: list[str], *,
                  public_jwk: dict[str, Any] | None = None) -> dict[str, Any]:
    """Add a principal; returns it with its token (shown this once, stored as a hash).

    A revoked name may be added again: a new principal, the old one's history kept.
    """
    _public_only(public_jwk)
    if "agent" in roles and public_jwk is None:
        raise InvalidInput("an agent needs --key: its marques are bound to the key its MCP "
                           "server holds (docs/agents.md)")
    store = open_home_store(HarbourHome(home))
    try:
        principal, token = store.add_principal(name, roles, public_jwk=public_jwk,
                                               actor=operator())
    finally:
        store.close()
    return {**principal.to_dict(), "token": token}


def revoke_principal(home: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """Revoke a principal's token; its history stays."""
    store = open_home_store(HarbourHome(home))
    try:
        return dict(store.revoke_principal(name, actor=operator()).to_dict())
    finally:
        store.close()


def rotate_principal(home: str | os.PathLike[str], name: str, *,
                     public_jwk: dict[str, Any] | None = None) -> dict[str, Any]:
    """A new token for a principal (shown this once); the old one and its console sessions
    stop working at once. With ``public_jwk`` its key is replaced too."""
    _public_only(public_jwk)
    store = open_home_store(HarbourHome(home))
    try:
        principal, token = store.rotate_principal(name, public_jwk=public_jwk,
                                                  actor=operator())
    finally:
        store.close()
    return {**principal.to_dict(), "token": token}


def set_roles(home: str | os.PathLike[str], name: str, roles: list[str]) -> dict[str, Any]:
    """Replace a principal's roles; they apply to its very next call."""
    store = open_home_store(HarbourHome(home))
    try:
        return dict(store.set_roles(name, roles, actor=operator()).to_dict())
    finally:
        store.close()


def accept_report_key(home: str | os.PathLike[str], pilot_id: str, jwk: Any,
                      reason: str) -> dict[str, Any]:
    """Replace a registered Pilot's report key with ``jwk`` (its public JWK), an admin's
    decision with a reason (a ``pilot.report_key_accepted`` entry); from then on only
    reports signed with that key are taken."""
    from marque.harbour.intake import report_key_of

    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("accepting a Pilot's report key needs a reason: say who "
                           "confirmed the new key, and how")
    key = report_key_of(jwk)
    if key is None:
        raise InvalidInput("the report key must be a public JWK object")
    store = open_home_store(HarbourHome(home))
    try:
        pilot = store.accept_report_key(pilot_id, key, actor=operator(), reason=reason)
    finally:
        store.close()
    return {"pilot_id": pilot.pilot_id, "report_key": pilot.report_key}


def list_principals(home: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every principal (never a token: only their hashes are kept)."""
    store = open_home_store(HarbourHome(home))
    try:
        return [p.to_dict() for p in store.list_principals()]
    finally:
        store.close()


def set_routing(home: str | os.PathLike[str], text: str) -> dict[str, Any]:
    """Check ``text`` and adopt it as the current routing config (a logbook entry)."""
    from marque.harbour.routing import parse_config

    config = parse_config(text)
    store = open_home_store(HarbourHome(home))
    try:
        before = store.current_routing_config()
        changed = store.adopt_routing_config(config.config_cid, config.text, actor=operator())
    finally:
        store.close()
    return {"config_cid": config.config_cid, "entries": len(config.entries),
            "previous": None if before is None else before.config_cid, "changed": changed}
