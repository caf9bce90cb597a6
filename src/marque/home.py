"""What a Pilot's home and a Harbourmaster's home share: a directory, one configuration
file in it, and DSNs in that file whose relative SQLite paths are the home's.

:class:`Home` is the shape only. Each wing's home (:class:`marque.pilot.home.PilotHome`,
:class:`marque.harbour.home.HarbourHome`) names its file and keeps its own reading and
writing: they differ on purpose (a ``pilot.json`` holds secrets and is rewritten
atomically, 0600; a ``harbour.json`` is written once, never over an existing one), and
each says what is wrong with its own error codes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from marque.dsn import resolve_sqlite

__all__ = ["Home"]


class Home:
    """A home directory and the one configuration file in it (``config_file``)."""

    #: The configuration file's name inside the home; each kind of home sets it.
    config_file: ClassVar[str]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        """The home's configuration file."""
        return self.path / self.config_file

    def where(self) -> str:
        """The home's absolute path (symlinks resolved)."""
        return str(self.path.resolve())

    def resolve(self, dsn: str) -> str:
        """A DSN from the configuration file made usable: a relative SQLite path is the
        home's."""
        return resolve_sqlite(dsn, self.path.resolve())
