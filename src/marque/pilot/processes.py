"""Pilot processes: who owns a claim, and whether that owner is still alive.

Each Pilot process holds an exclusive ``flock`` on
``processes/<process_id>.lock`` in its home for as long as it lives. The kernel
drops the lock when the process dies — even by SIGKILL — so another process can
tell a dead owner from a live one without trusting pids (which are reused).
Owners in other homes or on other hosts are unknown here; for them only the
lease decides. (A "process" here is one Pilot process's lifetime; "Run" is
reserved for DESIGN §7's Effect Set runs.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

#: Every process id starts with this (ids from before the rename started with ``run_``
#: and are unknown here: for their claims only the lease decides).
PREFIX = "proc_"


class ProcessRegistry:
    """Registers this Pilot process and answers liveness questions about others."""

    def __init__(self, processes_dir: Path | None) -> None:
        self.process_id = PREFIX + uuid.uuid4().hex
        self._dir = processes_dir
        self._fd: int | None = None
        if processes_dir is not None:
            processes_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(processes_dir / f"{self.process_id}.lock",
                               os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def is_dead(self, process_id: str) -> bool | None:
        """True if ``process_id`` is provably dead, False if alive, None if unknown here."""
        if process_id == self.process_id:
            return False
        if self._dir is None or not process_id.startswith(PREFIX) or "/" in process_id:
            return None
        path = self._dir / f"{process_id}.lock"
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

    def forget(self, process_id: str) -> None:
        """Remove a dead process's lock file once nothing it owned is unsettled."""
        if self._dir is not None and process_id != self.process_id and self.is_dead(process_id):
            with contextlib.suppress(FileNotFoundError):
                (self._dir / f"{process_id}.lock").unlink()

    def close(self, *, leave_trace: bool = False) -> None:
        """End this process: release and remove its lock file.

        ``leave_trace`` keeps the (released) file, as a crash would: others then see
        this process as provably dead, for attempts it leaves claimed without an outcome.
        """
        if self._fd is not None and self._dir is not None:
            if not leave_trace:
                with contextlib.suppress(FileNotFoundError):
                    (self._dir / f"{self.process_id}.lock").unlink()
            os.close(self._fd)
            self._fd = None
