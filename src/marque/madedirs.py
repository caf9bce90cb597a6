"""The directories a setup command created, so that its failure removes exactly those.

``pilot init`` and ``harbour init`` either do all of their work or leave the
disk as they found it: a home they made (with any parents they had to make)
goes again when they fail, while a directory that was there before — or one
something else wrote into meanwhile — is never removed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class MadeDirectories:
    """``path`` made on demand, remembering the topmost directory this call created."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self._top: Path | None = None

    def note(self) -> Path | None:
        """The topmost missing directory on the way to ``path`` (None: it exists)."""
        top = None
        for candidate in (self.path, *self.path.parents):
            if candidate.exists():
                break
            top = candidate
        return top

    def created(self, top: Path | None) -> None:
        """Record that this call created ``path`` down from ``top``."""
        self._top = top

    def make(self) -> None:
        """Create ``path`` and its missing parents; ``OSError`` if that is impossible."""
        top = self.note()
        try:
            self.path.mkdir(parents=True)
        except FileExistsError:
            return  # there already (or made concurrently by someone else): not ours
        self._top = top

    def undo(self) -> None:
        """Remove the directories this call created, innermost first, while they are empty."""
        if self._top is None:
            return
        for directory in (self.path, *self.path.parents):
            # Cleaning up must never hide why the command failed.
            with contextlib.suppress(OSError):
                directory.rmdir()
            if directory == self._top or directory.exists():
                return
