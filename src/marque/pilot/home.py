"""A Pilot's home directory: where its configuration, ledger, logbook and process locks live.

:class:`PilotHome` knows the layout (``pilot.json``, ``ledger.sqlite3``,
``logbook.sqlite3``, ``processes/``) and reads and writes ``pilot.json``
(:mod:`marque.pilot.config` checks what is in it). Which home a ledger belongs to
— a copied or moved home is never silently shared — is
:mod:`marque.pilot.home_binding`.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from marque.errors import ConfigInvalid, InvalidInput, LedgerMissing, MarqueError
from marque.home import Home
from marque.pilot.config import CONFIG_FILE, LEDGER_FILE, LOGBOOK_FILE, PilotConfig

__all__ = ["PilotHome"]


class PilotHome(Home):
    """The directory a Pilot lives in (its ``where()`` is how its ledger knows it)."""

    config_file = CONFIG_FILE

    @property
    def processes_dir(self) -> Path:
        return self.path / "processes"

    @property
    def logbook_path(self) -> Path:
        return self.path / LOGBOOK_FILE

    @property
    def default_ledger_path(self) -> Path:
        return self.path / LEDGER_FILE

    def ledger_dsn(self, config: PilotConfig) -> str:
        """The ledger's DSN, resolved against the home."""
        return self.resolve(config.ledger)

    def exists(self) -> bool:
        return self.config_path.exists()

    def load(self) -> PilotConfig:
        """Read and check ``pilot.json`` (``ConfigInvalid`` names what is wrong)."""
        try:
            text = self.config_path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise self._not_a_home() from exc
        except NotADirectoryError as exc:
            raise InvalidInput(f"{self.path} is a file, not a Pilot home directory") from exc
        except IsADirectoryError as exc:
            raise ConfigInvalid(f"{self.config_path} is a directory, not a file") from exc
        except UnicodeDecodeError as exc:
            raise ConfigInvalid(f"{self.config_path} is not UTF-8 text") from exc
        except OSError as exc:
            raise ConfigInvalid(
                f"cannot read {self.config_path}: {_os_reason(exc)}",
                detail={"errno": _errno_name(exc)},
            ) from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigInvalid(
                f"{self.config_path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                f"{exc.msg}); fix or restore the file"
            ) from exc
        try:
            return PilotConfig.from_dict(data)
        except ConfigInvalid as exc:
            raise ConfigInvalid(f"{self.config_path}: {exc.message}") from exc

    def _not_a_home(self) -> MarqueError:
        """Why there is no ``pilot.json``, and what to do about it."""
        if self.path.exists() and not self.path.is_dir():
            return InvalidInput(f"{self.path} is a file, not a Pilot home directory")
        if self.default_ledger_path.exists():
            # The configuration was lost, the ledger (and its budgets) was not.
            return ConfigInvalid(
                f"{self.path} holds a ledger ({LEDGER_FILE}) but no {CONFIG_FILE}: the "
                "configuration was lost or deleted, the ledger was not. Recreate it with "
                f"`marque pilot init --home {self.path} --pilot-id ID` using this Pilot's id: "
                "init re-adopts the existing ledger (same incarnation, nothing spent is lost); "
                "then add its targets and trusted issuers again"
            )
        return LedgerMissing(
            f"{self.path} is not a Pilot home (no {CONFIG_FILE}); create one with "
            f"`marque pilot init --home {self.path} --pilot-id ID` (with --ledger DSN for a "
            "PostgreSQL ledger; init re-adopts a PostgreSQL ledger this Pilot already has)"
        )

    def save(self, config: PilotConfig) -> None:
        """Write ``pilot.json`` atomically (write, fsync, rename); refuses an invalid one.

        The file is readable by its owner only (0600): it holds target credentials and,
        once the Pilot joined a Harbourmaster, its bearer token there.
        """
        data = config.to_dict()
        PilotConfig.from_dict(data)  # never write what load would refuse
        import tempfile  # only a command that writes pilot.json pays for it (not exec)

        self.make_dir()
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".pilot.", suffix=".json")
        except OSError as exc:
            raise _cannot_write(self.path, exc) from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                # mkstemp makes it 0600 already; said explicitly as the secrets depend on it.
                os.fchmod(handle.fileno(), 0o600)
                json.dump(data, handle, indent=2, sort_keys=True)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.config_path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise _cannot_write(self.config_path, exc) from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def make_dir(self) -> bool:
        """Create the home directory if needed; True if this call created it."""
        if self.path.is_dir():
            return False
        if self.path.exists() or _file_above(self.path):
            raise InvalidInput(f"{self.path} is a file (or lies under one), not a directory: "
                               "--home must name a directory")
        try:
            self.path.mkdir(parents=True)
        except FileExistsError:
            return False  # made concurrently by someone else: not ours to remove
        except OSError as exc:
            raise _cannot_write(self.path, exc) from exc
        return True


def _file_above(path: Path) -> bool:
    """Whether some existing ancestor of ``path`` is a file rather than a directory."""
    for parent in path.absolute().parents:
        if parent.exists():
            return not parent.is_dir()
    return False


def _errno_name(exc: OSError) -> str | None:
    return errno.errorcode.get(exc.errno) if exc.errno is not None else None


def _os_reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def _cannot_write(path: Path, exc: OSError) -> InvalidInput:
    return InvalidInput(
        f"cannot create or write {path}: {_os_reason(exc)}; choose a --home the Pilot can write",
        detail={"errno": _errno_name(exc)},
    )
