"""What every scenario of the campaign is and returns.

A scenario is a function ``run(ctx: RunContext) -> ScenarioResult`` registered
with :func:`scenario` under its matrix row. It makes its own world under
``ctx.workdir``, performs ``ctx.count`` cases (faults included) with
randomness drawn only from ``ctx.rng`` (so ``ctx.seed`` reproduces it),
records every invocation and answer in ``ctx.history``, and returns what the
checker found. A violation is never raised: it is counted and described, so
one run reports every row.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["History", "RunContext", "ScenarioResult", "SCENARIOS", "scenario"]


class History:
    """An append-only JSONL file of what clients invoked and what they were told.

    ``type`` follows Jepsen: ``invoke`` before a call, then ``ok`` (it happened),
    ``fail`` (it provably did not) or ``info`` (unknown: a crash, a cut
    connection, ``indeterminate``). Every line also carries ``at`` and the
    scenario's own fields (``op``, ``marque_id``, ``nonce``, ``status``, ``code``...).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self.lines = 0

    def record(self, type: str, **fields: Any) -> dict[str, Any]:  # noqa: A002 - Jepsen's word
        """Append one event (flushed at once: a crash of the harness keeps it)."""
        assert type in ("invoke", "ok", "fail", "info", "fault", "note"), type
        event = {"type": type, "at": time.time(), **fields}
        self._file.write(json.dumps(event, sort_keys=True, default=str) + "\n")
        self._file.flush()
        self.lines += 1
        return event

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """Every event of a history file, in order."""
        with path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


@dataclass
class RunContext:
    """Everything a scenario gets: where to work, how much, and its randomness."""

    name: str
    count: int
    seed: int
    workdir: Path
    history: History
    full: bool = False
    #: A PostgreSQL admin DSN (a server the run started), or None where none is available.
    pg_admin_dsn: str | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


@dataclass
class ScenarioResult:
    """One matrix row's figures: cases run, invariant violations, and what was measured."""

    name: str
    cases: int
    violations: list[str] = field(default_factory=list)
    #: Counters worth publishing (e.g. ``{"applied": 40, "indeterminate_resolved": 3}``).
    figures: dict[str, Any] = field(default_factory=dict)
    #: Seconds each indeterminate answer took to be resolved by evidence (for the p99).
    resolve_seconds: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cases": self.cases, "ok": self.ok,
                "violations": self.violations, "figures": self.figures,
                "resolve_seconds": self.resolve_seconds}


@dataclass(frozen=True)
class Registered:
    """A scenario as the runner sees it."""

    row: int
    name: str
    run: Callable[[RunContext], ScenarioResult]
    #: Cases in a bounded `make soak` run and in `make soak FULL=1`.
    quick: int
    full: int
    needs_pg: bool = False


SCENARIOS: dict[str, Registered] = {}


def scenario(row: int, name: str, *, quick: int, full: int, needs_pg: bool = False
             ) -> Callable[[Callable[[RunContext], ScenarioResult]],
                           Callable[[RunContext], ScenarioResult]]:
    """Register ``run`` as row ``row`` of the matrix under ``name``."""
    def register(run: Callable[[RunContext], ScenarioResult]
                 ) -> Callable[[RunContext], ScenarioResult]:
        assert name not in SCENARIOS, name
        SCENARIOS[name] = Registered(row, name, run, quick, full, needs_pg)
        return run
    return register
