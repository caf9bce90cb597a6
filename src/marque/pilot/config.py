"""A Pilot's home directory: its configuration, ledger and local logbook.

``pilot.json`` holds what an operator sets (pilot id, ledger DSN, targets,
trusted issuer keys, timeouts). Target credentials live here, on the Pilot's
side; they never travel in a marque.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from marque.dsn import sqlite_dsn
from marque.errors import InvalidInput, LedgerMissing

CONFIG_FILE = "pilot.json"
LEDGER_FILE = "ledger.sqlite3"
LOGBOOK_FILE = "logbook.sqlite3"


@dataclass
class Settings:
    """Timeouts and windows; defaults an operator rarely needs to change."""

    skew_seconds: float = 60.0
    pop_window_seconds: float = 120.0
    statement_timeout_ms: int = 30_000
    lock_timeout_ms: int = 5_000
    # A lease outlives the statement timeout by this much before it expires.
    lease_grace_seconds: float = 30.0
    # Replays of applied nonces: proof jti written just behind the answer (see
    # marque/ledger/jtis.py for the trade); false makes every replay wait for it.
    replay_jti_write_behind: bool = True


@dataclass
class PilotConfig:
    """The contents of ``pilot.json``."""

    pilot_id: str
    ledger: str
    targets: dict[str, str] = field(default_factory=dict)
    issuers: list[dict[str, Any]] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``pilot.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PilotConfig:
        """Parse ``pilot.json``; a malformed file is ``InvalidInput``."""
        try:
            config = cls(
                pilot_id=str(data["pilot_id"]),
                ledger=str(data["ledger"]),
                targets={str(k): str(v) for k, v in data.get("targets", {}).items()},
                issuers=list(data.get("issuers", [])),
                settings=Settings(**data.get("settings", {})),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput(f"malformed {CONFIG_FILE}: {exc}") from exc
        if not isinstance(config.settings.replay_jti_write_behind, bool):
            # "false" as a string would read as true: refuse rather than guess.
            raise InvalidInput(f"malformed {CONFIG_FILE}: settings.replay_jti_write_behind "
                               "must be true or false")
        return config


class PilotHome:
    """The directory a Pilot lives in."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    @property
    def logbook_path(self) -> Path:
        return self.path / LOGBOOK_FILE

    def default_ledger_dsn(self) -> str:
        """The embedded default: a SQLite ledger inside the home."""
        return sqlite_dsn(str((self.path / LEDGER_FILE).resolve()))

    def exists(self) -> bool:
        return self.config_path.exists()

    def load(self) -> PilotConfig:
        """Read ``pilot.json``."""
        try:
            text = self.config_path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise LedgerMissing(
                f"{self.path} is not a Pilot home; create it with `marque pilot init`"
            ) from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"malformed {self.config_path}: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidInput(f"malformed {self.config_path}: not a JSON object")
        return PilotConfig.from_dict(data)

    def save(self, config: PilotConfig) -> None:
        """Write ``pilot.json`` atomically (write, fsync, rename)."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".pilot.", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(config.to_dict(), handle, indent=2, sort_keys=True)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.config_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
