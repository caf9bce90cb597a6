"""A Harbourmaster's home directory: its configuration, issuer key and (by default) store.

``harbour.json`` names the Harbourmaster (its ``harbour_id``, the same one its
store holds), where the store is (``sqlite:///harbour.sqlite3`` relative to the
home by default, or a ``postgresql://`` DSN) and the issuer name its marques
carry as ``iss``. ``issuer.jwk`` is the private Ed25519 key that signs marques,
preview and query tokens and logbook heads; it is readable by its owner only
and never leaves the home.

The file is read strictly: a missing, unknown or ill-typed member is
``config_invalid`` naming it, and a store whose ``harbour_id`` is not the
home's is refused — a copied home must not silently act as another
Harbourmaster.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marque.dsn import check_shape
from marque.errors import ConfigInvalid, HomeMismatch, InvalidInput, MarqueError, NotFound
from marque.home import Home

CONFIG_FILE = "harbour.json"
ISSUER_KEY_FILE = "issuer.jwk"
STORE_FILE = "harbour.sqlite3"
DEFAULT_STORE_DSN = f"sqlite:///{STORE_FILE}"

_MEMBERS = {"harbour_id": str, "store": str, "issuer": str}


@dataclass(frozen=True)
class HarbourConfig:
    """``harbour.json``, checked."""

    harbour_id: str
    store: str
    issuer: str

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"harbour_id": self.harbour_id, "store": self.store, "issuer": self.issuer}

    @classmethod
    def from_dict(cls, data: Any) -> HarbourConfig:
        """Check ``data`` member by member; ``config_invalid`` names what is wrong."""
        if not isinstance(data, dict):
            raise ConfigInvalid(f"{CONFIG_FILE} must hold a JSON object")
        unknown = sorted(set(data) - set(_MEMBERS))
        if unknown:
            raise ConfigInvalid(f"{CONFIG_FILE} has unknown members: {', '.join(unknown)}")
        for name, kind in _MEMBERS.items():
            if name not in data:
                raise ConfigInvalid(f"{CONFIG_FILE} lacks {name}")
            if not isinstance(data[name], kind) or not data[name].strip():
                raise ConfigInvalid(f"{CONFIG_FILE}: {name} must be a non-empty string")
        try:
            check_shape(data["store"], "store")
        except InvalidInput as exc:
            raise ConfigInvalid(f"{CONFIG_FILE}: {exc.message}") from exc
        return cls(data["harbour_id"], data["store"], data["issuer"])


class HarbourHome(Home):
    """The directory a Harbourmaster lives in."""

    config_file = CONFIG_FILE

    @property
    def issuer_key_path(self) -> Path:
        return self.path / ISSUER_KEY_FILE

    def exists(self) -> bool:
        """Whether this directory holds a Harbourmaster (its ``harbour.json``)."""
        return self.config_path.is_file()

    def load(self) -> HarbourConfig:
        """``harbour.json``, checked; ``not_found`` if this is no Harbourmaster's home."""
        try:
            text = self.config_path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise NotFound(f"{self.path} is not a Harbourmaster's home (no {CONFIG_FILE}); "
                           "create one with `marque harbour init`") from exc
        except OSError as exc:
            raise ConfigInvalid(f"cannot read {self.config_path}: {exc.strerror}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigInvalid(f"{self.config_path} is not JSON: {exc.msg} "
                                f"(line {exc.lineno})") from exc
        return HarbourConfig.from_dict(data)

    def store_dsn(self, config: HarbourConfig) -> str:
        """The store's DSN, a relative SQLite path made the home's."""
        return self.resolve(config.store)

    def issuer_key(self) -> dict[str, Any]:
        """The private issuer key; ``config_invalid`` if it is missing or not a private key."""
        try:
            jwk = json.loads(self.issuer_key_path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigInvalid(f"the issuer key {self.issuer_key_path} is missing: marques "
                                "cannot be signed without it; restore it from a backup") from exc
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigInvalid(f"the issuer key {self.issuer_key_path} is unreadable") from exc
        if not isinstance(jwk, dict) or "d" not in jwk:
            raise ConfigInvalid(f"{self.issuer_key_path} does not hold a private JWK")
        return jwk


def open_home_store(home: HarbourHome, config: HarbourConfig | None = None) -> Any:
    """The home's store, opened (and migrated); refused if it is another Harbourmaster's."""
    from marque.harbour.store import open_store

    config = config or home.load()
    store = open_store(home.store_dsn(config))
    if store.harbour_id != config.harbour_id:
        store.close()
        raise HomeMismatch(f"the store {config.store} belongs to Harbourmaster "
                           f"{store.harbour_id}, not to this home's {config.harbour_id}")
    return store


def write_config(home: HarbourHome, config: HarbourConfig) -> None:
    """Write ``harbour.json`` (never over an existing one)."""
    try:
        fd = os.open(home.config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError as exc:
        raise InvalidInput(f"{home.path} already holds a Harbourmaster ({CONFIG_FILE})") from exc
    except OSError as exc:
        raise MarqueError(f"cannot write {home.config_path}: {exc.strerror}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(config.to_dict(), handle, indent=2, sort_keys=True)
        handle.write("\n")
