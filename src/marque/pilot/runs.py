"""Process runs: who owns a claim, and whether that owner is still alive.

Each Pilot process run holds an exclusive ``flock`` on ``runs/<run_id>.lock``
in its home for as long as it lives. The kernel drops the lock when the
process dies — even by SIGKILL — so another run can tell a dead owner from a
live one without trusting pids (which are reused). Owners in other homes or
on other hosts are unknown here; for them only the lease decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path


class RunRegistry:
    """Registers this process run and answers liveness questions about others."""

    def __init__(self, runs_dir: Path | None) -> None:
        self.run_id = "run_" + uuid.uuid4().hex
        self._dir = runs_dir
        self._fd: int | None = None
        if runs_dir is not None:
            runs_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(runs_dir / f"{self.run_id}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def is_dead(self, run_id: str) -> bool | None:
        """True if ``run_id`` is provably dead, False if alive, None if unknown here."""
        if run_id == self.run_id:
            return False
        if self._dir is None or not run_id.startswith("run_") or "/" in run_id:
            return None
        path = self._dir / f"{run_id}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def forget(self, run_id: str) -> None:
        """Remove a dead run's lock file once nothing it owned is unsettled."""
        if self._dir is not None and run_id != self.run_id and self.is_dead(run_id):
            with contextlib.suppress(FileNotFoundError):
                (self._dir / f"{run_id}.lock").unlink()

    def close(self, *, leave_trace: bool = False) -> None:
        """End this run: release and remove its lock file.

        ``leave_trace`` keeps the (released) file, as a crash would: others then see
        this run as provably dead, for attempts it leaves claimed without an outcome.
        """
        if self._fd is not None and self._dir is not None:
            if not leave_trace:
                with contextlib.suppress(FileNotFoundError):
                    (self._dir / f"{self.run_id}.lock").unlink()
            os.close(self._fd)
            self._fd = None
