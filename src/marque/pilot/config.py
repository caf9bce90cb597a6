"""A Pilot's configuration, ``pilot.json`` (its home directory is :mod:`marque.pilot.home`).

``pilot.json`` holds what an operator sets (pilot id, ledger DSN, targets,
trusted issuer keys, settings). Target credentials live here, on the Pilot's
side; they never travel in a marque.

It is read strictly: a bad configuration is found when the Pilot loads it,
never after a nonce was claimed. Every problem is a ``ConfigInvalid`` naming
the key path, what is allowed and what was found.

Paths in ``pilot.json`` are relative to the home: the default ledger is
``sqlite:///ledger.sqlite3``, the file next to ``pilot.json``, so a home can
be moved (DESIGN §5 and :mod:`marque.pilot.home_binding` say how a move is
acknowledged). Older homes that name their ledger by absolute path still load.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from marque.dsn import (
    check_shape,
    is_sqlite,
    sqlite_dsn,
    sqlite_path,
)
from marque.errors import ConfigInvalid, InvalidInput, MarqueError, RowKeyInvalid

CONFIG_FILE = "pilot.json"
LEDGER_FILE = "ledger.sqlite3"
LOGBOOK_FILE = "logbook.sqlite3"
#: The embedded default, as ``pilot.json`` stores it: a SQLite ledger inside the home.
DEFAULT_LEDGER_DSN = sqlite_dsn(LEDGER_FILE)

#: Pilot ids and target names: what a marque may name, and what is safe in a path or a log.
NAME_RULE = "1..64 of A-Z a-z 0-9 _ . -"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: PostgreSQL's limit for its millisecond timeouts (a 32-bit integer).
_MAX_MS = 2_147_483_647


def check_name(value: object, what: str) -> str:
    """``value`` if it is a valid Pilot id or target name; else ``InvalidInput``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidInput(f"{what} must be {NAME_RULE}, got {_show(value)}")
    return value


def _show(value: object) -> str:
    """A value as the operator wrote it in JSON, shortened; never a Python repr."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


# -- settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """What a setting accepts: its JSON type, bounds and unit, for checking and messages."""

    kind: str  # "int", "number" or "bool"
    unit: str = ""
    minimum: float | None = None
    exclusive: bool = False  # the minimum itself is not allowed
    maximum: float | None = None

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        text = "an integer number of" if self.kind == "int" else "a number of"
        text += f" {self.unit}"
        if self.minimum is not None:
            text += f" {'>' if self.exclusive else '≥'} {_number(self.minimum)}"
        if self.maximum is not None:
            text += f" and ≤ {_number(self.maximum)}"
        return text

    def check(self, value: Any) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        # JSON true/false are not numbers here, whatever Python thinks of bool.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.minimum is not None and (
            value < self.minimum or (self.exclusive and value == self.minimum)
        ):
            return False
        return self.maximum is None or value <= self.maximum


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _setting(default: Any, rule: _Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


_SECONDS = _Rule("number", "seconds", minimum=0)
_MILLISECONDS = _Rule("int", "milliseconds", minimum=1, maximum=_MAX_MS)


@dataclass
class Settings:
    """Timeouts and windows; defaults an operator rarely needs to change.

    The one definition of a Pilot's settings: ``pilot.json``'s ``settings``
    object is checked against these fields (type and range from each field's
    rule), and the Pilot's options are built from them. A new setting is one
    field here.
    """

    #: Clock skew allowed around a marque's validity window.
    skew_seconds: float = _setting(60.0, _SECONDS)
    #: How old a proof of possession may be.
    pop_window_seconds: float = _setting(120.0, _Rule("number", "seconds", 0, exclusive=True))
    statement_timeout_ms: int = _setting(30_000, _MILLISECONDS)
    lock_timeout_ms: int = _setting(5_000, _MILLISECONDS)
    #: A lease outlives the statement timeout by this much before it expires.
    lease_grace_seconds: float = _setting(30.0, _SECONDS)
    #: Replays of applied nonces: proof jti written just behind the answer (see
    #: marque/ledger/jtis.py for the trade); false makes every replay wait for it.
    replay_jti_write_behind: bool = _setting(True, _Rule("bool"))
    #: Long-running Pilots: an applied write is answered once the target committed, and
    #: its outcome recorded moments later, many to one ledger commit (its stamp is the
    #: durable record meanwhile; see marque/pilot/settle_behind.py); false records every
    #: outcome before answering.
    settle_write_behind: bool = _setting(True, _Rule("bool"))

    @classmethod
    def from_dict(cls, data: Any, where: str = "settings") -> Settings:
        """Checked settings from JSON; anything unknown, mistyped or out of range is
        ``ConfigInvalid`` naming ``where.key``."""
        if not isinstance(data, dict):
            raise ConfigInvalid(f"{where} must be a JSON object of settings, got {_show(data)}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            names = ", ".join(f"{where}.{name}" for name in unknown)
            raise ConfigInvalid(
                f"{names} {'is not a setting' if len(unknown) == 1 else 'are not settings'} "
                f"(known settings: {', '.join(known)})"
            )
        values: dict[str, Any] = {}
        for name, value in data.items():
            rule: _Rule = known[name].metadata["rule"]
            if not rule.check(value):
                raise ConfigInvalid(
                    f"{where}.{name} must be {rule.describe()}, got {_show(value)}"
                )
            values[name] = float(value) if rule.kind == "number" else value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, every setting included."""
        return {f.name: getattr(self, f.name) for f in fields(Settings)}


# -- pilot.json -------------------------------------------------------------------------

_TOP_LEVEL = ("pilot_id", "home_id", "ledger", "targets", "issuers", "settings", "previews",
              "row_keys", "harbour", "durability")
#: What a Pilot does when its ledger's engine would not keep commits (``pilot.json``'s
#: ``durability``; see docs/operations.md): ``require`` (the default) refuses to start with
#: ``ledger_not_durable``; ``warn`` starts and says so on stderr at every start.
DURABILITY_POLICIES = ("require", "warn")
#: How a target runs previews (DESIGN §10); a target not named in ``previews`` uses the first.
PREVIEW_MODES = ("rollback", "explain")


_HARBOUR_KEYS = ("url", "token", "pilot_url")
#: Printable ASCII without spaces: what an HTTP bearer token may hold (RFC 6750's b64token,
#: loosened to any visible character so a Harbourmaster may choose its alphabet).
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")


@dataclass(frozen=True)
class HarbourLink:
    """The Harbourmaster a Pilot joined (``pilot.json``'s ``harbour``; ``marque pilot join``).

    ``token`` is this Pilot's bearer token there — a secret, which is why a
    ``pilot.json`` holding one is written readable by its owner only.
    ``pilot_url`` is where the Harbourmaster reaches this Pilot's service.
    """

    url: str
    token: str
    pilot_url: str

    def to_dict(self) -> dict[str, str]:
        """The JSON form written to ``pilot.json``."""
        return {"url": self.url, "token": self.token, "pilot_url": self.pilot_url}

    @classmethod
    def from_dict(cls, data: Any, where: str = "harbour") -> HarbourLink:
        """A checked link; anything missing, unknown or malformed is ``ConfigInvalid``."""
        if not isinstance(data, dict):
            raise ConfigInvalid(f"{where} must be a JSON object {{url, token, pilot_url}}, "
                                f"got {_show(data)}")
        unknown = sorted(set(data) - set(_HARBOUR_KEYS))
        if unknown:
            raise ConfigInvalid(
                f"{', '.join(f'{where}.{name}' for name in unknown)} "
                f"{'is not a key' if len(unknown) == 1 else 'are not keys'} of {where} "
                f"(known keys: {', '.join(_HARBOUR_KEYS)})"
            )
        missing = [name for name in _HARBOUR_KEYS if name not in data]
        if missing:
            raise ConfigInvalid(f"{', '.join(f'{where}.{name}' for name in missing)} "
                                f"{'is' if len(missing) == 1 else 'are'} missing")
        token = data["token"]
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            # Never echo what was found: it may be most of a secret.
            raise ConfigInvalid(f"{where}.token must be a bearer token: 1..4096 visible ASCII "
                                "characters, no spaces")
        return cls(url=_config_url(data["url"], f"{where}.url"), token=token,
                   pilot_url=_config_url(data["pilot_url"], f"{where}.pilot_url"))


def check_http_url(value: object, what: str) -> str:
    """``value`` if it is an absolute ``http(s)://host[:port][/path]`` URL; else
    ``InvalidInput``. A trailing ``/`` is dropped, so paths append cleanly."""
    problem = None
    if not isinstance(value, str) or not value.isprintable() or " " in value:
        problem = "is not a URL"
    else:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises for a port that is not a number in range
        except ValueError:
            problem = "is not a URL"
        else:
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problem = "is not an http:// or https:// URL with a host"
            elif parts.query or parts.fragment:
                problem = "must not carry a query or a fragment"
            elif parts.username is not None or parts.password is not None:
                problem = "must not carry credentials (the token is given on its own)"
    if problem is not None:
        raise InvalidInput(f"{what} must be an http:// or https:// URL, got {_show(value)}: "
                           f"{problem}")
    assert isinstance(value, str)
    return value.rstrip("/")


def _config_url(value: Any, where: str) -> str:
    try:
        checked = check_http_url(value, where)
    except InvalidInput as exc:
        raise ConfigInvalid(exc.message) from exc
    if checked != value:
        raise ConfigInvalid(f"{where} must not end with /, got {_show(value)}")
    return checked


@dataclass
class PilotConfig:
    """The contents of ``pilot.json``, as written (paths not yet resolved)."""

    pilot_id: str
    #: The ledger DSN; a relative SQLite path is relative to the home.
    ledger: str = DEFAULT_LEDGER_DSN
    #: Names this home in its ledger (see :mod:`marque.pilot.home`); None in old homes.
    home_id: str | None = None
    targets: dict[str, str] = field(default_factory=dict)
    issuers: list[dict[str, Any]] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    #: Per-target preview mode (``rollback`` or ``explain``); absent means ``rollback``.
    previews: dict[str, str] = field(default_factory=dict)
    #: Per-target declared row keys (``marque pilot target row-key``): table → columns,
    #: naming the rows of a table that has no key of its own in previews' row images.
    row_keys: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: The Harbourmaster this Pilot joined, if any; without one it journals locally only.
    harbour: HarbourLink | None = None
    #: ``require`` or ``warn``: what a ledger whose commits may not survive a crash means.
    durability: str = "require"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``pilot.json``."""
        data: dict[str, Any] = {
            "pilot_id": self.pilot_id,
            "ledger": self.ledger,
            "targets": dict(self.targets),
            "issuers": [dict(jwk) for jwk in self.issuers],
            "settings": self.settings.to_dict(),
        }
        if self.home_id is not None:
            data["home_id"] = self.home_id
        if self.previews:
            data["previews"] = dict(self.previews)
        if self.row_keys:
            data["row_keys"] = {target: {table: list(columns) for table, columns in tables.items()}
                                for target, tables in self.row_keys.items()}
        if self.harbour is not None:
            data["harbour"] = self.harbour.to_dict()
        if self.durability != "require":  # the default is not written out
            data["durability"] = self.durability
        return data

    @classmethod
    def from_dict(cls, data: Any) -> PilotConfig:
        """Parse and check ``pilot.json``'s object; every problem is ``ConfigInvalid``."""
        if not isinstance(data, dict):
            raise ConfigInvalid(f"the file must hold one JSON object, got {_show(data)}")
        unknown = sorted(set(data) - set(_TOP_LEVEL))
        if unknown:
            raise ConfigInvalid(
                f"{', '.join(unknown)} {'is not a' if len(unknown) == 1 else 'are not'} "
                f"pilot.json key{'' if len(unknown) == 1 else 's'} "
                f"(known keys: {', '.join(_TOP_LEVEL)})"
            )
        if "pilot_id" not in data:
            raise ConfigInvalid("pilot_id is missing")
        pilot_id = _config_name(data["pilot_id"], "pilot_id")
        home_id = data.get("home_id")
        if home_id is not None and (not isinstance(home_id, str) or not _NAME.fullmatch(home_id)):
            raise ConfigInvalid(f"home_id must be {NAME_RULE}, got {_show(home_id)}")
        ledger = data.get("ledger", DEFAULT_LEDGER_DSN)
        _config_dsn(ledger, "ledger")
        targets = data.get("targets", {})
        if not isinstance(targets, dict):
            raise ConfigInvalid(
                f"targets must be a JSON object of name → DSN, got {_show(targets)}"
            )
        for name, dsn in targets.items():
            if not _NAME.fullmatch(name):
                raise ConfigInvalid(f"targets: {_show(name)} is not a target name ({NAME_RULE})")
            _config_dsn(dsn, f"targets.{name}")
        issuers = data.get("issuers", [])
        _check_issuers(issuers)
        previews = data.get("previews", {})
        _check_previews(previews, targets)
        row_keys = data.get("row_keys", {})
        _check_row_keys(row_keys, targets)
        durability = data.get("durability", "require")
        if durability not in DURABILITY_POLICIES:
            raise ConfigInvalid(f"durability must be one of {', '.join(DURABILITY_POLICIES)}, "
                                f"got {_show(durability)}")
        return cls(
            pilot_id=pilot_id,
            ledger=ledger,
            home_id=home_id,
            targets=dict(targets),
            issuers=[dict(jwk) for jwk in issuers],
            settings=Settings.from_dict(data.get("settings", {})),
            previews=dict(previews),
            row_keys={target: {table: list(columns) for table, columns in tables.items()}
                      for target, tables in row_keys.items()},
            harbour=(HarbourLink.from_dict(data["harbour"]) if "harbour" in data else None),
            durability=durability,
        )


def _check_previews(previews: Any, targets: dict[str, Any]) -> None:
    if not isinstance(previews, dict):
        raise ConfigInvalid(
            f"previews must be a JSON object of target name → "
            f"{' | '.join(PREVIEW_MODES)}, got {_show(previews)}"
        )
    for name, mode in previews.items():
        if name not in targets:
            raise ConfigInvalid(f"previews.{name}: there is no target named {_show(name)} "
                                "in targets")
        if mode not in PREVIEW_MODES:
            raise ConfigInvalid(f"previews.{name} must be one of {', '.join(PREVIEW_MODES)}, "
                                f"got {_show(mode)}")


#: What a declared row key's table and columns may be called: plain SQL identifiers (a
#: table optionally ``schema.``-qualified), so the name means the same to the operator, to
#: ``pilot.json`` and to the engine that resolves it.
ROW_KEY_NAME_RULE = "a plain SQL identifier (A-Z a-z 0-9 _ $, not starting with a digit or $)"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
#: Columns a declared row key may have (as many as PostgreSQL allows in an index).
MAX_ROW_KEY_COLUMNS = 32


def check_row_key(table: object, columns: object, where: str) -> tuple[str, list[str]]:
    """``(table, columns)`` if they can declare a row key: ``[schema.]table`` and 1 to
    :data:`MAX_ROW_KEY_COLUMNS` distinct columns, each a plain SQL identifier; else
    ``RowKeyInvalid`` naming ``where`` and the rule broken."""
    if not isinstance(table, str) or not all(
            _IDENTIFIER.fullmatch(part) for part in table.split(".")) or table.count(".") > 1:
        raise RowKeyInvalid(f"{where}: the table must be [schema.]table, each part "
                            f"{ROW_KEY_NAME_RULE}, got {_show(table)}",
                            detail={"rule": "table_name"})
    if not isinstance(columns, list) or not 1 <= len(columns) <= MAX_ROW_KEY_COLUMNS:
        raise RowKeyInvalid(f"{where}.{table} must be a list of 1 to {MAX_ROW_KEY_COLUMNS} "
                            f"column names, got {_show(columns)}", detail={"rule": "columns"})
    for column in columns:
        if not isinstance(column, str) or not _IDENTIFIER.fullmatch(column):
            raise RowKeyInvalid(f"{where}.{table}: a column must be {ROW_KEY_NAME_RULE}, got "
                                f"{_show(column)}", detail={"rule": "column_name"})
    if len({c.lower() for c in columns}) != len(columns):
        raise RowKeyInvalid(f"{where}.{table} names a column twice: {_show(columns)}",
                            detail={"rule": "columns"})
    return table, list(columns)


def _check_row_keys(row_keys: Any, targets: dict[str, Any]) -> None:
    if not isinstance(row_keys, dict):
        raise ConfigInvalid(f"row_keys must be a JSON object of target name → {{table: "
                            f"[column, …]}}, got {_show(row_keys)}")
    for name, tables in row_keys.items():
        if name not in targets:
            raise ConfigInvalid(f"row_keys.{name}: there is no target named {_show(name)} "
                                "in targets")
        if not isinstance(tables, dict):
            raise ConfigInvalid(f"row_keys.{name} must be a JSON object of table → "
                                f"[column, …], got {_show(tables)}")
        for table, columns in tables.items():
            try:
                check_row_key(table, columns, f"row_keys.{name}")
            except RowKeyInvalid as exc:
                raise ConfigInvalid(exc.message) from exc


def _config_name(value: Any, where: str) -> str:
    try:
        return check_name(value, where)
    except InvalidInput as exc:
        raise ConfigInvalid(exc.message) from exc


def _config_dsn(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigInvalid(
            f"{where} must be a DSN string (sqlite:///path or postgresql://…), got {_show(value)}"
        )
    try:
        return check_shape(value, where)
    except InvalidInput as exc:
        raise ConfigInvalid(exc.message) from exc


def _check_issuers(issuers: Any) -> None:
    """Each trusted issuer key must be a public Ed25519 JWK, kids unique per key."""
    if not isinstance(issuers, list):
        raise ConfigInvalid(f"issuers must be a JSON array of public JWKs, got {_show(issuers)}")
    from marque.token import TrustedKeys  # only a load pays for the JOSE library

    trusted = TrustedKeys()
    for index, jwk in enumerate(issuers):
        where = f"issuers[{index}]"
        if not isinstance(jwk, dict):
            raise ConfigInvalid(f"{where} must be a JWK object, got {_show(jwk)}")
        if "d" in jwk:
            raise ConfigInvalid(
                f"{where} holds a private key (member \"d\"); pilot.json keeps issuers' public "
                "keys only: replace it with the output of `marque keys public`"
            )
        try:
            trusted.add(jwk)
        except MarqueError as exc:
            raise ConfigInvalid(f"{where}: {exc.message}") from exc


def sqlite_file(dsn: str) -> Path | None:
    """The file of a resolved SQLite DSN, or None for another engine."""
    return Path(sqlite_path(dsn)) if is_sqlite(dsn) else None


__all__ = [
    "CONFIG_FILE",
    "DEFAULT_LEDGER_DSN",
    "DURABILITY_POLICIES",
    "HarbourLink",
    "LEDGER_FILE",
    "LOGBOOK_FILE",
    "NAME_RULE",
    "PilotConfig",
    "ROW_KEY_NAME_RULE",
    "Settings",
    "check_http_url",
    "check_name",
    "check_row_key",
    "sqlite_file",
]
