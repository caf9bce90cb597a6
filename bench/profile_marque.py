"""Where the time of one in-process marque execution goes (SQLite ledger, one client).

    .venv/bin/python bench/profile_marque.py [--executions 2000]

On its own fsync-on cluster: times raw psycopg and ``Pilot.execute`` plainly,
then again with light wrappers around the phases of the execution path (token
checks, ledger transactions, target transaction, logbook), then once more
under cProfile, bucketing the profile's own time by what it is spent in
(crypto, SQLite, psycopg and the network, Marque's Python, other Python).
Prints a Markdown summary for ``bench/README.md``.

To profile another tree than the installed one (say, the last commit), put its
``src`` first: ``PYTHONPATH=/path/to/tree/src .venv/bin/python bench/profile_marque.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from cluster import BenchCluster  # noqa: E402
from harness import percentile  # noqa: E402
from scenarios import UPDATE, MarqueBed  # noqa: E402

import marque  # noqa: E402
import marque.pilot.execution as core  # noqa: E402

BATCH = 250  # proofs are made per batch: they must be used within the Pilot's window


class Clock:
    """Accumulates time per phase name; wrappers are re-entrant-safe (outermost counts)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._depth: dict[str, int] = defaultdict(int)

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth[phase] += 1
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[phase] -= 1
                if self._depth[phase] == 0:
                    self.seconds[phase] += time.perf_counter() - began
                    self.calls[phase] += 1

        return timed


class TimedConnection:
    """A sqlite3 connection whose ``execute`` time is split into COMMIT and the rest."""

    def __init__(self, conn: Any, clock: Clock, prefix: str) -> None:
        self._conn = conn
        self._clock = clock
        self._prefix = prefix

    def execute(self, sql: str, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return self._conn.execute(sql, *args)
        finally:
            kind = "COMMIT" if sql.lstrip().upper().startswith("COMMIT") else "statements"
            self._clock.seconds[f"{self._prefix} {kind}"] += time.perf_counter() - began
            self._clock.calls[f"{self._prefix} {kind}"] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def run_executions(bed: MarqueBed, token: str, count: int) -> list[float]:
    latencies: list[float] = []
    for start in range(0, count, BATCH):
        nonces = [f"p-{uuid.uuid4().hex}" for _ in range(min(BATCH, count - start))]
        proofs = [bed.proof(token, n) for n in nonces]
        for nonce, proof in zip(nonces, proofs, strict=True):
            began = time.perf_counter()
            outcome = bed.pilot.execute(token, proof, nonce)
            latencies.append(time.perf_counter() - began)
            if outcome.status != "applied":
                raise RuntimeError(f"execution ended {outcome.status}: {outcome.error}")
    return latencies


def raw_latencies(conn: Any, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        conn.execute(UPDATE, (2,))
        conn.commit()
        latencies.append(time.perf_counter() - began)
    return latencies


def instrument(bed: MarqueBed, clock: Clock) -> None:
    """Wrap the phases of the execution path, on this Pilot's objects only (no source edits)."""
    pilot = bed.pilot
    for name in ("verify_marque", "verify_proof"):
        if hasattr(core, name):
            setattr(core, name, clock.wrap(f"token: {name}", getattr(core, name)))
    ledger = pilot.ledger
    for name in ("remember_pop_jti", "claim", "settle", "outbox_pending", "outbox_ack"):
        if hasattr(ledger, name):
            setattr(ledger, name, clock.wrap(f"ledger: {name}", getattr(ledger, name)))
    if hasattr(ledger, "_conn"):
        ledger._conn = TimedConnection(ledger._conn, clock, "sqlite ledger")
    for target in pilot.targets.values():
        target.execute = clock.wrap("target: fenced transaction", target.execute)  # type: ignore[method-assign]
    if pilot.logbook is not None:
        pilot.logbook.append = clock.wrap("logbook: append", pilot.logbook.append)  # type: ignore[method-assign]
        if hasattr(pilot.logbook, "_conn"):
            pilot.logbook._conn = TimedConnection(pilot.logbook._conn, clock, "sqlite logbook")


def bucket(stats: pstats.Stats) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """Own time (tottime) per kind of work, and the top functions."""
    buckets: dict[str, float] = defaultdict(float)
    top: list[tuple[float, str]] = []
    for (filename, line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        where = f"{filename}:{line}({name})"
        top.append((tottime, where))
        text = f"{filename} {name}".lower()
        if "joserfc" in text or "cryptography" in text or "ed25519" in text:
            kind = "crypto (joserfc + cryptography, Ed25519)"
        elif "sqlite3" in text:
            kind = "SQLite C calls (statements, COMMIT + fsync)"
        elif "psycopg" in text or "select.poll" in text or "'poll'" in text or "select" == name:
            kind = "psycopg + waiting on PostgreSQL (target round trips)"
        elif "/marque/" in filename:
            kind = "Marque's own Python"
        elif filename == "~":
            kind = "other C builtins (json, hashlib, locks, ...)"
        else:
            kind = "other Python (stdlib: json, uuid, threading, dataclasses, ...)"
        buckets[kind] += tottime
    top.sort(reverse=True)
    return dict(buckets), top


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=2000)
    args = parser.parse_args()
    count = max(100, min(args.executions, 20_000))
    out: list[str] = []
    cluster = BenchCluster()
    root = Path(tempfile.mkdtemp(prefix="marque-profile-"))
    try:
        bed = MarqueBed(root, "profile", cluster.dsn("bench"))
        token = bed.issue(1)
        run_executions(bed, token, 100)  # warm-up: connections, caches
        # Raw and Marque alternate in batches, so machine noise lands on both alike.
        raw: list[float] = []
        plain: list[float] = []
        ratios: list[float] = []
        with psycopg.connect(cluster.dsn("bench")) as conn:
            for start in range(0, count, BATCH):
                size = min(BATCH, count - start)
                raw_batch = raw_latencies(conn, size)
                plain_batch = run_executions(bed, token, size)
                raw += raw_batch
                plain += plain_batch
                ratios.append(percentile(plain_batch, 50) / percentile(raw_batch, 50))
        raw_p50, plain_p50 = percentile(raw, 50) * 1000, percentile(plain, 50) * 1000
        out.append(f"- marque source: `{Path(marque.__file__).parent}`")
        out.append(f"- {count} executions, 1 client, SQLite ledger, PostgreSQL target "
                   f"(fsync on), alternating with raw psycopg in batches of {BATCH}: p50 "
                   f"{plain_p50:.3f} ms, mean {statistics.mean(plain) * 1000:.3f} ms; raw p50 "
                   f"{raw_p50:.3f} ms; median of per-batch p50 ratios "
                   f"**{statistics.median(ratios):.1f}× raw**")

        clock = Clock()
        instrument(bed, clock)
        timed = run_executions(bed, token, count)
        total = sum(timed)
        out.append("")
        out.append(f"Phases (wrappers, {count} executions, mean "
                   f"{total / count * 1000:.3f} ms per execution):")
        out.append("")
        out.append("| phase | ms / execution | share | calls / execution |")
        out.append("| --- | ---: | ---: | ---: |")
        phases = {k: v for k, v in clock.seconds.items() if not k.startswith("sqlite ")}
        accounted = sum(v for k, v in phases.items() if k != "token: verify_proof")
        # verify_proof includes remember_pop_jti (a ledger transaction): show it without.
        if "token: verify_proof" in phases:
            phases["token: verify_proof"] -= clock.seconds.get("ledger: remember_pop_jti", 0.0)
            accounted += phases["token: verify_proof"]
        phases["Pilot's own path (rest)"] = total - accounted
        for phase, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
            out.append(f"| {phase} | {seconds / count * 1000:.3f} | {seconds / total:.0%} | "
                       f"{clock.calls.get(phase, 0) / count:.1f} |")
        out.append("")
        out.append("SQLite time inside those phases:")
        out.append("")
        out.append("| SQLite connection | ms / execution | calls / execution |")
        out.append("| --- | ---: | ---: |")
        for phase, seconds in sorted(clock.seconds.items()):
            if phase.startswith("sqlite "):
                out.append(f"| {phase} | {seconds / count * 1000:.3f} | "
                           f"{clock.calls[phase] / count:.1f} |")

        profiler = cProfile.Profile()
        profiler.enable()
        profiled = run_executions(bed, token, count)
        profiler.disable()
        stats = pstats.Stats(profiler)
        buckets, top = bucket(stats)
        own = sum(buckets.values())
        out.append("")
        out.append(f"cProfile own time by kind ({count} executions; the profiler inflates "
                   f"Python-heavy parts: mean {sum(profiled) / count * 1000:.3f} ms under it):")
        out.append("")
        out.append("| kind | ms / execution | share |")
        out.append("| --- | ---: | ---: |")
        for kind, seconds in sorted(buckets.items(), key=lambda kv: -kv[1]):
            out.append(f"| {kind} | {seconds / count * 1000:.3f} | {seconds / own:.0%} |")
        out.append("")
        out.append("Top functions by own time:")
        out.append("")
        for seconds, where in top[:15]:
            short = where.replace(str(Path(marque.__file__).parent.parent), "")
            short = short.split("site-packages/")[-1]
            out.append(f"- {seconds / count * 1000:.3f} ms  `{short}`")
        bed.close()
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
