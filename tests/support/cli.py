"""The one way a test runs the real ``marque`` console script as a subprocess.

Every tier that starts the CLI (``tests/e2e``, ``tests/pg``, the Harbourmaster's
stacks in :mod:`support.harbour`) builds the child's environment with
:func:`cli_env`, so none of them can leak the test runner's own settings into it: no
stray crash point, no Harbourmaster or token defaults, no user's ``marque login``
config, and output wide enough that rich never wraps a line a test reads. A test
that needs one of those settings from the runner names it in ``keep``; a test that
needs a value of its own passes it in ``extra``.

This module imports nothing from the other test helpers, so any of them can use it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

MARQUE = Path(sys.executable).parent / "marque"
TIMEOUT = 30  # seconds, for any single CLI call (or HTTP call, in support.harbour)

#: A config directory no test writes to (tests that log in name their own).
NO_CONFIG = os.path.join(tempfile.gettempdir(), "marque-tests-no-config")

#: Variables of the runner's environment a CLI child never inherits: a crash point
#: armed for another process, and the Harbourmaster URL and token a remote command
#: would otherwise default to.
STRIPPED = frozenset({"MARQUE_CRASH_AT", "MARQUE_HARBOUR", "MARQUE_TOKEN"})

#: Variables a CLI child always gets with these values: wide rich output (no wrapped
#: lines), and never the user's own ``marque login`` tokens.
OVERRIDDEN: dict[str, str] = {"COLUMNS": "200", "XDG_CONFIG_HOME": NO_CONFIG}


def cli_env(extra: dict[str, str] | None = None, *,
            keep: Iterable[str] = ()) -> dict[str, str]:
    """The environment for a CLI subprocess: the runner's, less :data:`STRIPPED`, with
    :data:`OVERRIDDEN`, then ``extra``.

    ``keep`` names variables of :data:`STRIPPED` or :data:`OVERRIDDEN` to take from the
    runner as they are (absent stays absent); any other name is a mistake and raises
    ``ValueError``.
    """
    kept = frozenset(keep)
    unknown = kept - STRIPPED - OVERRIDDEN.keys()
    if unknown:
        raise ValueError(f"cli_env keeps only stripped or overridden names, not {sorted(unknown)}")
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED or k in kept}
    env.update({k: v for k, v in OVERRIDDEN.items() if k not in kept})
    env.update(extra or {})
    return env


def one_json(stdout: str) -> dict[str, Any]:
    """stdout must be exactly one terminated line holding one JSON object."""
    assert stdout.endswith("\n"), f"stdout is not one terminated line: {stdout!r}"
    lines = stdout.splitlines()
    assert len(lines) == 1, f"stdout must be exactly one JSON line, got {stdout!r}"
    obj = json.loads(lines[0])
    assert isinstance(obj, dict), f"stdout JSON is not an object: {obj!r}"
    return obj


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """stderr as JSON lines (every non-empty line must parse as an object)."""
    events = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        assert isinstance(event, dict), line
        events.append(event)
    return events


class Result(NamedTuple):
    """(returncode, stdout, stderr) of one CLI run, with parsing helpers."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        """stdout as its one JSON object (:func:`one_json`)."""
        return one_json(self.stdout)

    @property
    def events(self) -> list[dict[str, Any]]:
        """stderr as JSON event lines (:func:`json_lines`)."""
        return json_lines(self.stderr)

    def kinds(self) -> list[str]:
        """The ``event`` of each stderr event, in order."""
        return [e["event"] for e in self.events]


def run_cli(*args: Any, env: dict[str, str] | None = None, timeout: float = TIMEOUT,
            cwd: Path | None = None, keep: Iterable[str] = ()) -> Result:
    """Run ``marque ARGS`` to completion (stdin closed) in :func:`cli_env` ``(env,
    keep=keep)``; its (returncode, stdout, stderr)."""
    proc = subprocess.run(
        [str(MARQUE), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env, keep=keep),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
