"""Several ``pilot serve`` worker processes on one listening socket.

The parent binds the socket and forks the workers before it opens anything, so
each worker opens its own Pilot — its own ledger connection, targets and
process entry — exactly as a separate ``pilot serve`` would. Nothing is shared
between workers but the socket and the home: every guarantee across them rests
on the ledger's constraints, as it does between any two Pilot processes.

The parent only supervises: it reports ready once every worker has opened its
Pilot, forwards SIGTERM/SIGINT, restarts a worker that died without being asked
to stop (its unfinished attempts are the dead process's, settled by
reconciliation like any crash), and exits once all have stopped. A worker that
cannot even start (its Pilot does not open) stops the whole service instead: it
would only fail again.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

#: A pause before a dead worker is replaced, so a worker that dies on every request
#: cannot spin the machine.
RESTART_PAUSE_SECONDS = 0.5

Worker = Callable[[Callable[[dict[str, Any]], None]], int]


class StartFailed(Exception):
    """A worker stopped before it was ready; it has said why itself."""

    def __init__(self, status: int) -> None:
        super().__init__(f"a worker stopped before it was ready (exit status {status})")
        self.status = status


def _spawn(worker: Worker) -> tuple[int, int]:
    """Fork one worker; returns ``(pid, read end of its ready pipe)``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the parent's code
        os.close(read_end)
        status = 1
        try:
            def ready(info: dict[str, Any]) -> None:
                os.write(write_end, json.dumps(info).encode() + b"\n")
                os.close(write_end)

            status = worker(ready)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # printed by the worker's own handler where it can be
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end


def _read_ready(fd: int, pid: int) -> dict[str, Any]:
    """Wait for a worker's ready line; :class:`StartFailed` if it exits first."""
    buffer = b""
    while not buffer.endswith(b"\n"):
        readable, _, _ = select.select([fd], [], [], 0.5)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buffer += chunk
    os.close(fd)
    if not buffer.endswith(b"\n"):
        _, status = os.waitpid(pid, 0)
        raise StartFailed(os.waitstatus_to_exitcode(status))
    info: dict[str, Any] = json.loads(buffer)
    return info


def supervise(count: int, worker: Worker, on_ready: Callable[[dict[str, Any]], None],
              warn: Callable[[str], None]) -> int:
    """Run ``count`` workers until SIGTERM/SIGINT; returns the exit status."""
    supervisor = _Supervisor(worker, warn)
    previous = {sig: signal.signal(sig, supervisor.stop)
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        info: dict[str, Any] = {}
        for _ in range(count):
            pid, fd = _spawn(worker)
            supervisor.workers[pid] = time.monotonic()
            try:
                info = _read_ready(fd, pid)
            except StartFailed as exc:
                supervisor.workers.pop(pid)
                supervisor.stop(signal.SIGTERM, None)
                _reap_all(supervisor.workers)
                return exc.status if exc.status > 0 else 1
        on_ready(info)
        return supervisor.watch()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Supervisor:
    """The running workers (pid → when started) and whether they were asked to stop."""

    def __init__(self, worker: Worker, warn: Callable[[str], None]) -> None:
        self.worker = worker
        self.warn = warn
        self.workers: dict[int, float] = {}
        self.stopping = False

    def stop(self, signum: int, _frame: Any) -> None:
        """Ask every worker to stop (SIGTERM); none is replaced from now on."""
        self.stopping = True
        for pid in list(self.workers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def watch(self) -> int:
        """Wait for the workers, replacing one that died unasked, until none is left; the
        exit status (a worker's failing status while stopping, 1 if a replacement failed)."""
        status = 0
        while self.workers:
            try:
                pid, raw = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            started = self.workers.pop(pid, None)
            if started is None:
                continue
            code = os.waitstatus_to_exitcode(raw)
            if self.stopping:
                status = status or (code if code > 0 else 0)
                continue
            if not self._replace(pid, code):
                status = 1
        return status

    def _replace(self, pid: int, code: int) -> bool:
        """Start another worker for one that stopped unasked; False if it could not start
        (then every worker is stopped)."""
        self.warn(f"worker {pid} stopped unasked (exit status {code}); starting another")
        time.sleep(RESTART_PAUSE_SECONDS)
        if self.stopping:
            return True
        new_pid, fd = _spawn(self.worker)
        self.workers[new_pid] = time.monotonic()
        try:
            _read_ready(fd, new_pid)
        except StartFailed as exc:
            self.workers.pop(new_pid, None)
            self.warn(str(exc))
            self.stop(signal.SIGTERM, None)
            return False
        return True


def _reap_all(workers: dict[int, float]) -> None:
    for pid in list(workers):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        workers.pop(pid, None)
