"""Marque's benchmark: raw psycopg, Marque in process and DBOS, side by side, interleaved.

    make bench            # full run (up to ~20 minutes)
    make bench QUICK=1    # reduced run, under two minutes

Starts its own PostgreSQL cluster (fsync on, 127.0.0.1 only), runs every
scenario at every concurrency in interleaved rounds, prints a table and writes
``bench/results/latest.json``. See ``bench/README.md`` for what each scenario
measures and how to read the ratios.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster  # noqa: E402
from floor_cell import FloorCell, FloorPeer  # noqa: E402
from harness import Cell, SkippedCell, add_ratios, run_interleaved, summarise  # noqa: E402
from http_peer import HttpBed, HttpCell, StdlibHttpCell  # noqa: E402
from prefill import measure_reap, prefill_sqlite_ledger  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from scenarios import MarqueBed, MarqueCell, RawCell, RawPeer, proof_cost_ms  # noqa: E402

RESULTS = HERE / "results" / "latest.json"


@dataclass(frozen=True)
class Plan:
    quick: bool
    clients: tuple[int, ...]
    rounds: int
    ops_per_round: int  # per cell and round, shared among its clients
    min_per_client: int
    max_seconds: float  # per cell and round
    warmup_ops: int
    prefill: tuple[int, ...]
    rounds_budget_seconds: float  # the interleaved rounds stop starting after this
    vacuum: bool


FULL = Plan(False, (1, 8, 32), rounds=7, ops_per_round=500, min_per_client=12,
            max_seconds=8.0, warmup_ops=64, prefill=(10**3, 10**5, 10**6),
            rounds_budget_seconds=720.0, vacuum=True)
QUICK = Plan(True, (1, 8), rounds=3, ops_per_round=120, min_per_client=8,
             max_seconds=2.0, warmup_ops=16, prefill=(10**3, 10**5),
             rounds_budget_seconds=50.0, vacuum=True)

console = Console(stderr=True, width=160)


def log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False)


def label(entries: int) -> str:
    return f"1e{len(str(entries)) - 1}"


def build(cells: list[Cell], name: str, clients: int, factory: Callable[[], Cell]) -> None:
    """Add the cell ``factory`` makes, or a skipped row saying why it could not be made."""
    try:
        cells.append(factory())
    except Exception as exc:
        reason = f"set-up failed: {type(exc).__name__}: {exc}"[:300]
        log(f"  ! {name} x{clients}: {reason}")
        cells.append(SkippedCell(name, clients, reason))


def main() -> int:
    plan = QUICK if os.environ.get("QUICK", "").strip() not in ("", "0") else FULL
    started = time.monotonic()
    load_start = _load()
    log(f"marque bench ({'QUICK' if plan.quick else 'full'}): clients {plan.clients}, "
        f"{plan.rounds} rounds, prefill {[label(n) for n in plan.prefill]}")
    root = Path(tempfile.mkdtemp(prefix="marque-bench-"))
    closers: list[Callable[[], None]] = []
    cluster: BenchCluster | None = None
    try:
        cluster = BenchCluster()
        target = cluster.dsn("bench")
        settings = cluster.settings()
        log(f"PostgreSQL {settings['server_version']} on 127.0.0.1:{cluster.cluster.port} "
            f"(fsync {settings['fsync']})")
        notes: dict[str, Any] = {}
        machine = machine_info(settings, plan, notes)
        rows = run_all(plan, cluster, target, root, closers, notes)
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception as exc:
                log(f"  (closing: {type(exc).__name__}: {exc})")
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)
    machine["bench_seconds"] = round(time.monotonic() - started, 1)
    machine["load_average"] = {"start": load_start, "end": _load()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    partial = RESULTS.with_suffix(".json.tmp")
    partial.write_text(json.dumps({"machine": machine, "scenarios": rows}, indent=2) + "\n",
                       encoding="utf-8")
    partial.replace(RESULTS)
    print_table(rows, machine)
    log(f"wrote {RESULTS.relative_to(HERE.parent)} in {machine['bench_seconds']}s")
    return 0


def run_all(
    plan: Plan, cluster: BenchCluster, target: str, root: Path,
    closers: list[Callable[[], None]], notes: dict[str, Any],
) -> list[dict[str, Any]]:
    cells: list[Cell] = []
    top = max(plan.clients)

    log("set-up: raw connections, Pilot homes, marques")
    raw = RawPeer(target, top)
    closers.append(raw.close)
    for n in plan.clients:
        cells.append(RawCell(raw, n))
    for n in plan.clients:
        if n > 1:
            cells.append(RawCell(raw, n, hot=True))

    beds: dict[str, MarqueBed | None] = {}
    for key, ledger in (("sqlite", None), ("pg", cluster.dsn("ledger")), ("replay", None)):
        try:
            beds[key] = MarqueBed(root, key, target, ledger_dsn=ledger)
            closers.append(beds[key].close)  # type: ignore[union-attr]
        except Exception as exc:
            log(f"  ! Pilot home {key}: {type(exc).__name__}: {exc}")
            beds[key] = None
    for key, name, replay in (("sqlite", "marque_sqlite_ledger", False),
                              ("pg", "marque_pg_ledger", False),
                              ("replay", "marque_replay", True)):
        bed = beds[key]
        for hot in (False, True):
            for n in plan.clients:
                if hot and n == 1:
                    continue  # one client on one marque is the plain scenario
                cell_name = name + ("_hot" if hot else "")
                if bed is None:
                    cells.append(SkippedCell(cell_name, n, "Pilot home could not be set up"))
                    continue
                build(cells, cell_name, n,
                      lambda b=bed, c=cell_name, k=n, h=hot, r=replay:
                      MarqueCell(b, c, k, hot=h, replay=r))
    if beds["sqlite"] is not None:
        notes["client_proof_ms"] = round(proof_cost_ms(beds["sqlite"]), 4)
    floor_cells(cells, plan, beds["sqlite"], root, target, closers)

    for name, workers in (("marque_http", 1), ("marque_http_w2", 2)):
        # Two workers only matter with several clients.
        counts = [n for n in plan.clients if workers == 1 or n > 1]
        try:
            http_bed = HttpBed(root, name, target, workers=workers)
            closers.append(http_bed.close)
            for n in counts:
                build(cells, name, n,
                      lambda k=n, b=http_bed, c=name: HttpCell(b, k, c))
            if workers == 1:
                for n in plan.clients:
                    build(cells, "marque_http_stdlib", n,
                          lambda k=n, b=http_bed: StdlibHttpCell(b, k))
        except Exception as exc:
            log(f"  ! Pilot service ({name}): {type(exc).__name__}: {exc}")
            for n in counts:
                cells.append(SkippedCell(name, n, f"pilot serve failed: {exc}"))

    log("set-up: DBOS Transact")
    dbos_cells(cells, plan, cluster, target, closers, notes)

    prefilled: list[tuple[int, MarqueBed, list[MarqueCell]]] = []
    for entries in plan.prefill:
        tag = label(entries)
        log(f"set-up: SQLite ledger pre-filled with {entries:,} settled entries")
        try:
            bed, seconds, written = prefilled_bed(root, target, entries)
            closers.append(bed.close)
        except Exception as exc:
            reason = f"pre-fill failed: {type(exc).__name__}: {exc}"[:300]
            log(f"  ! {reason}")
            for name in ("marque_sqlite_ledger", "marque_replay"):
                cells.append(SkippedCell(f"{name}_prefill_{tag}", 1, reason))
            continue
        log(f"  pre-filled in {seconds:.1f}s: {sum(written.values()):,} rows in "
            f"{', '.join(written)}")
        extra = {"ledger_entries": entries, "prefill_seconds": round(seconds, 1)}
        mine: list[MarqueCell] = []
        for name, replay in (("marque_sqlite_ledger", False), ("marque_replay", True)):
            cell_name = f"{name}_prefill_{tag}"
            try:
                cell = MarqueCell(bed, cell_name, 1, replay=replay, extra=extra)
            except Exception as exc:
                cells.append(SkippedCell(cell_name, 1, f"set-up failed: {exc}"[:300]))
                continue
            cells.append(cell)
            mine.append(cell)
        prefilled.append((entries, bed, mine))

    runnable = sum(c.skip_reason is None for c in cells)
    log(f"running {runnable} cells x {plan.rounds} interleaved rounds")
    results = run_interleaved(
        cells, rounds=plan.rounds, ops_per_round=plan.ops_per_round,
        min_per_client=plan.min_per_client, max_seconds=plan.max_seconds,
        warmup_ops=plan.warmup_ops, log=log, budget_seconds=plan.rounds_budget_seconds,
    )

    for entries, bed, mine in prefilled:
        log(f"reaping the {label(entries)} ledger (pre-filled marques have expired)")
        try:
            reap = measure_reap(bed.pilot.ledger, bed.ledger_path, vacuum=plan.vacuum)
        except Exception as exc:
            reap = {"reap_error": f"{type(exc).__name__}: {exc}"[:300]}
        log(f"  {reap_summary(reap)}")
        for cell in mine:
            cell.extra().update(reap)

    rows = [summarise(r) for r in results]
    add_ratios(rows)
    return rows


def floor_cells(
    cells: list[Cell], plan: Plan, bed: MarqueBed | None, root: Path, target: str,
    closers: list[Callable[[], None]],
) -> None:
    """The floor at every concurrency, with the settings of the SQLite-ledger Pilot."""
    try:
        if bed is None:
            raise RuntimeError("the SQLite-ledger Pilot home could not be set up")
        peer = FloorPeer(bed, root / "floor", target, max(plan.clients))
        closers.append(peer.close)
    except Exception as exc:
        reason = f"floor unavailable: {type(exc).__name__}: {exc}"[:300]
        log(f"  ! {reason}")
        for n in plan.clients:
            cells.append(SkippedCell("floor", n, reason))
        return
    for n in plan.clients:
        cells.append(FloorCell(peer, n))


def dbos_cells(
    cells: list[Cell], plan: Plan, cluster: BenchCluster, target: str,
    closers: list[Callable[[], None]], notes: dict[str, Any],
) -> None:
    names = ("dbos", "dbos_replay")
    try:
        from dbos_peer import DbosCell, DbosPeer

        started = time.perf_counter()
        peer = DbosPeer(cluster.dsn("dbos_sys"), target)
        closers.append(peer.close)
        notes["dbos_launch_seconds"] = round(time.perf_counter() - started, 2)
    except Exception as exc:
        reason = f"DBOS unavailable: {type(exc).__name__}: {exc}"[:300]
        log(f"  ! {reason}")
        for name in names:
            for n in plan.clients:
                cells.append(SkippedCell(name, n, reason))
        return
    for replay, name in ((False, "dbos"), (True, "dbos_replay")):
        for n in plan.clients:
            build(cells, name, n, lambda k=n, r=replay: DbosCell(peer, k, replay=r))


def prefilled_bed(root: Path, target: str, entries: int) -> tuple[MarqueBed, float, Any]:
    """A SQLite-ledger Pilot whose ledger holds ``entries`` settled entries besides ours."""
    bed = MarqueBed(root, f"prefill_{label(entries)}", target)
    try:
        marque_id = "mq_template" + uuid.uuid4().hex[:16]
        jti = "template-" + uuid.uuid4().hex
        bed.execute_once(bed.issue(1, marque_id=marque_id), "template", jti=jti)
        # Settled and reported before it is copied: pre-filled entries are settled *and*
        # reported. The settle of an applied write lands just behind its answer, so it is
        # flushed first (else the copy would be of an attempt still in progress, and the
        # settler would wait on the pre-fill's write lock).
        if bed.pilot.settler is not None:
            bed.pilot.settler.flush()
        bed.pilot.report()
        started = time.perf_counter()
        written = prefill_sqlite_ledger(bed.ledger_path, marque_id, jti, entries)
        return bed, time.perf_counter() - started, written
    except BaseException:
        bed.close()
        raise


# -- reporting ----------------------------------------------------------------------------


def reap_summary(reap: dict[str, Any]) -> str:
    if "reap_error" in reap:
        return f"reap failed: {reap['reap_error']}"

    def mb(key: str) -> str:
        return f"{reap[key] / 1e6:.1f} MB" if key in reap else "?"

    text = (f"ledger {mb('ledger_size_bytes_before_reap')} ({reap['ledger_claims_before_reap']:,}"
            f" claims) → reap {reap['reap_seconds']}s → {mb('ledger_size_bytes_after_reap')} "
            f"({reap['ledger_claims_after_reap']:,} claims; {mb('freelist_bytes_after_reap')} "
            f"free pages) → checkpoint {mb('ledger_size_bytes_after_reap_checkpoint')}")
    if "ledger_size_bytes_after_vacuum" in reap:
        text += f" → VACUUM {reap['vacuum_seconds']}s → {mb('ledger_size_bytes_after_vacuum')}"
    return text


def _load() -> list[float] | None:
    """The machine's load average: the bench shares it with whatever else runs."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine_info(settings: dict[str, Any], plan: Plan, notes: dict[str, Any]) -> dict[str, Any]:
    settings = dict(settings)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres_version": settings.pop("server_version"),
        "postgres_settings": settings,
        "sqlite_version": sqlite3.sqlite_version,
        "packages": {n: _version(n) for n in ("psycopg", "psycopg-pool", "joserfc",
                                               "cryptography", "dbos", "marque")},
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        # The measured code is the working tree: say whether src/ differs from the commit.
        "src_uncommitted_changes": bool(_git("status", "--porcelain", "--", "src")),
        "run": {
            "quick": plan.quick,
            "clients": list(plan.clients),
            "rounds": plan.rounds,
            "ops_per_round": plan.ops_per_round,
            "max_seconds_per_round": plan.max_seconds,
            "prefill": list(plan.prefill),
            "aggregation": "median over interleaved rounds of per-round p50, p99 and ops/s",
        },
        "notes": notes,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], machine: dict[str, Any]) -> None:
    table = Table(
        title=f"marque bench — {machine['date']} — {machine['nproc']} cores, "
              f"PostgreSQL {machine['postgres_version'].split()[0]}, "
              f"{'QUICK' if machine['run']['quick'] else 'full'}",
        title_justify="left",
    )
    for column, justify in (("scenario", "left"), ("clients", "right"), ("p50 ms", "right"),
                            ("p99 ms", "right"), ("ops/s", "right"), ("p50 × raw", "right"),
                            ("ops/s × raw", "right"), ("p50 × floor", "right"),
                            ("ops/s × floor", "right"), ("CPU ms/op", "right"),
                            ("note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        note = row.get("skipped") or ""
        if row.get("errors"):
            note = f"{row['errors']} errors: {row.get('first_error', '')}"[:80]
        if "p50_ratio_to_raw_hot" in row:
            note = (f"vs raw_hot: p50 × {_fmt(row['p50_ratio_to_raw_hot'], 2)}, ops/s × "
                    f"{_fmt(row.get('throughput_ratio_to_raw_hot'), 2)} {note}").strip()
        if "ledger_size_bytes_before_reap" in row and row["name"].startswith("marque_sqlite"):
            note = (f"ledger {row['ledger_size_bytes_before_reap'] / 1e6:.1f} MB → reap "
                    f"{row['ledger_size_bytes_after_reap'] / 1e6:.1f} MB"
                    + (f" → vacuum {row['ledger_size_bytes_after_vacuum'] / 1e6:.1f} MB"
                       if "ledger_size_bytes_after_vacuum" in row else "")
                    + f" {note}").strip()
        table.add_row(
            row["name"], str(row["clients"]), _fmt(row["p50_ms"]), _fmt(row["p99_ms"]),
            _fmt(row["ops_per_s"], 0), _fmt(row["p50_ratio_to_raw"], 2),
            _fmt(row["throughput_ratio_to_raw"], 2), _fmt(row.get("p50_ratio_to_floor"), 2),
            _fmt(row.get("throughput_ratio_to_floor"), 2), _fmt(row.get("cpu_ms_per_op"), 2),
            note,
        )
    out = Console(width=200)
    out.print(table)
    for row in rows:
        if row["name"] == "floor" and row.get("floor_parts_ms"):
            parts = ", ".join(f"{k} {v:.3f} ms" for k, v in row["floor_parts_ms"].items())
            out.print(f"floor x{row['clients']}, median of its parts: {parts}; process CPU "
                      f"{_fmt(row.get('cpu_ms_per_op'))} ms per operation")
    load = machine.get("load_average")
    if load:
        out.print(f"load average (1, 5, 15 min) at the start {load['start']}, at the end "
                  f"{load['end']} on {machine['nproc']} cores")
    notes = machine.get("notes") or {}
    if "client_proof_ms" in notes:
        out.print(f"client side, not timed: making one proof of possession costs "
                  f"{notes['client_proof_ms']:.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
