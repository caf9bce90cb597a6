"""The demo's servers: a ``marque harbour serve`` and a ``marque pilot serve``, as real
processes on free loopback ports, started and stopped by the demo itself.

They are the same commands an operator runs; the demo starts them as child
processes of its own Python (``python -m marque``) so that it needs no
``marque`` script on the ``PATH``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["Service", "ServiceFailed", "free_loopback_port"]

#: How long a service may take to say where it listens.
START_SECONDS = 30.0
#: How long a SIGTERMed service may take to stop in order.
STOP_SECONDS = 30.0


class ServiceFailed(Exception):
    """A service of the demo did not start (the demo says why and exits 1)."""


def free_loopback_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (for a service told where to listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _env() -> dict[str, str]:
    # A crash point or a Harbourmaster of the caller's shell must not reach the demo's servers.
    return {k: v for k, v in os.environ.items()
            if k not in ("MARQUE_CRASH_AT", "MARQUE_HARBOUR", "MARQUE_TOKEN")}


class Service:
    """One ``marque … serve --json`` child process and the first line it printed."""

    def __init__(self, name: str, args: list[str], cwd: Path) -> None:
        self.name = name
        self._stderr = cwd / f"{name}.log"
        with self._stderr.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "marque", *args, "--json"], cwd=cwd, env=_env(),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        self.hello = self._first_line()
        self.url: str = str(self.hello["url"])

    def _first_line(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self._proc.stdout.readline()
                                                            if self._proc.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(START_SECONDS)
        line = got[0] if got else ""
        try:
            hello = json.loads(line)
        except ValueError:
            hello = None
        if not isinstance(hello, dict) or "url" not in hello:
            self._proc.kill()
            self._proc.wait()
            raise ServiceFailed(f"{self.name} did not start: {self.log_tail()}")
        return hello

    def log_tail(self, lines: int = 5) -> str:
        """The last lines the service wrote to stderr (its log file in the demo's home)."""
        try:
            text = self._stderr.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(nothing on stderr)"

    def stop(self) -> int:
        """SIGTERM, then wait for the orderly stop; its exit status (SIGKILL after a bound)."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        return self._proc.returncode
