"""Timing machinery shared by every scenario: clients as threads, rounds, medians.

A *cell* is one scenario at one concurrency. Before each timed round the
harness asks the cell to ``prepare`` the round (nonces, proofs, workflow ids:
client-side work that is timed separately), then starts one thread per client
behind a barrier and times every operation with ``perf_counter``. Each round
is bounded in operations *and* in seconds.

Cells are run interleaved: round 1 of every cell, then round 2 of every cell,
and so on, with the starting cell rotated each round, so slow drift of a
shared machine lands on all scenarios alike. A cell's figures are medians over
its rounds of the per-round p50, p99 and throughput.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: One client's operation: called with the index of the operation in this round.
Op = Callable[[int], None]

#: A round stops counting errors as noise past this share of its operations.
MAX_ERROR_SHARE = 0.1


class Cell:
    """One scenario at one concurrency level."""

    #: Set when the cell cannot run; it is then reported with nulls and this reason.
    skip_reason: str | None = None

    def __init__(self, name: str, clients: int) -> None:
        self.name = name
        self.clients = clients

    def prepare(self, per_client: int) -> list[Op]:
        """Client-side work for one round (not timed); one operation callable per client."""
        raise NotImplementedError

    def extra(self) -> dict[str, Any]:
        """Extra fields for this cell's result row."""
        return {}


class SkippedCell(Cell):
    """A scenario that cannot run here: reported with nulls and the reason."""

    def __init__(self, name: str, clients: int, reason: str) -> None:
        super().__init__(name, clients)
        self.skip_reason = reason


@dataclass
class RoundResult:
    latencies: list[float]
    elapsed: float
    errors: int
    prepare_seconds: float
    first_error: str | None = None
    #: CPU time of the whole process (every thread) from the barrier to the last client.
    cpu_seconds: float = 0.0

    @property
    def ops(self) -> int:
        return len(self.latencies)

    @property
    def ops_per_s(self) -> float | None:
        return self.ops / self.elapsed if self.elapsed > 0 and self.ops else None


@dataclass
class CellResult:
    cell: Cell
    rounds: list[RoundResult] = field(default_factory=list)
    skipped: str | None = None


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile of a non-empty sequence (pct in 0..100)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def run_round(cell: Cell, per_client: int, max_seconds: float) -> RoundResult:
    """Prepare, then time one round of ``cell``: ``per_client`` ops per client at most."""
    started = time.perf_counter()
    ops = cell.prepare(per_client)
    prepare_seconds = time.perf_counter() - started
    clients = len(ops)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    first_error: list[str] = []
    barrier = threading.Barrier(clients + 1, timeout=60)
    max_errors = max(1, int(per_client * MAX_ERROR_SHARE))

    def client(index: int) -> None:
        op = ops[index]
        mine = latencies[index]
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        deadline = time.perf_counter() + max_seconds
        for i in range(per_client):
            began = time.perf_counter()
            try:
                op(i)
            except Exception as exc:  # recorded, never fatal to the bench
                errors[index] += 1
                if not first_error:
                    first_error.append(f"{type(exc).__name__}: {exc}"[:300])
                if errors[index] > max_errors:
                    return
                continue
            ended = time.perf_counter()
            mine.append(ended - began)
            if ended > deadline:
                return

    threads = [
        threading.Thread(target=client, args=(i,), name=f"{cell.name}-{i}", daemon=True)
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    begin = time.perf_counter()
    cpu_began = time.process_time()
    for thread in threads:
        thread.join(timeout=max_seconds + 60)
    elapsed = time.perf_counter() - begin
    cpu_ended = time.process_time()
    hung = sum(t.is_alive() for t in threads)
    if hung:
        first_error.append(f"{hung} client thread(s) still running after the round's bound")
    return RoundResult(
        latencies=[x for lat in latencies for x in lat],
        elapsed=elapsed,
        errors=sum(errors) + hung,
        prepare_seconds=prepare_seconds,
        first_error=first_error[0] if first_error else None,
        cpu_seconds=cpu_ended - cpu_began,
    )


def run_interleaved(
    cells: Sequence[Cell],
    *,
    rounds: int,
    ops_per_round: int,
    min_per_client: int,
    max_seconds: float,
    warmup_ops: int,
    log: Callable[[str], None],
    budget_seconds: float,
) -> list[CellResult]:
    """Warm every cell up once, then run ``rounds`` interleaved rounds of every cell."""
    results = [CellResult(cell) for cell in cells]
    started = time.monotonic()
    for result in results:
        cell = result.cell
        if cell.skip_reason is not None:
            result.skipped = cell.skip_reason
            continue
        try:
            warm = run_round(cell, max(1, warmup_ops // cell.clients), max_seconds)
        except Exception as exc:
            result.skipped = f"setup failed: {type(exc).__name__}: {exc}"[:300]
            log(f"  ! {cell.name} x{cell.clients}: {result.skipped}")
            log(traceback.format_exc(limit=3))
            continue
        if warm.errors and not warm.ops:
            result.skipped = f"every warm-up operation failed: {warm.first_error}"
            log(f"  ! {cell.name} x{cell.clients}: {result.skipped}")
    live = [r for r in results if r.skipped is None]
    for number in range(rounds):
        if time.monotonic() - started > budget_seconds:
            log(f"  time budget of {budget_seconds:.0f}s spent: stopping after {number} round(s)")
            break
        shift = number % max(1, len(live))
        order = live[shift:] + live[:shift]
        for result in order:
            cell = result.cell
            per_client = max(min_per_client, -(-ops_per_round // cell.clients))
            try:
                outcome = run_round(cell, per_client, max_seconds)
            except Exception as exc:
                outcome = RoundResult([], 0.0, 1, 0.0, f"{type(exc).__name__}: {exc}"[:300])
            result.rounds.append(outcome)
        log(f"  round {number + 1}/{rounds} done ({time.monotonic() - started:.0f}s)")
    return results


def summarise(result: CellResult) -> dict[str, Any]:
    """The JSON row of one cell (ratios are filled in later, against raw)."""
    cell = result.cell
    row: dict[str, Any] = {
        "name": cell.name,
        "clients": cell.clients,
        "p50_ms": None,
        "p99_ms": None,
        "ops_per_s": None,
        "p50_ratio_to_raw": None,
        "throughput_ratio_to_raw": None,
        "p50_ratio_to_floor": None,
        "throughput_ratio_to_floor": None,
    }
    if result.skipped is not None:
        row["skipped"] = result.skipped
        row.update(cell.extra())
        return row
    good = [r for r in result.rounds if r.ops]
    errors = sum(r.errors for r in result.rounds)
    first = next((r.first_error for r in result.rounds if r.first_error), None)
    if not good:
        row["skipped"] = f"no operation succeeded: {first}"
        row["errors"] = errors
        return row
    p50s = [percentile(r.latencies, 50) * 1000 for r in good]
    p99s = [percentile(r.latencies, 99) * 1000 for r in good]
    rates = [r.ops_per_s for r in good if r.ops_per_s is not None]
    prepared = sum(r.prepare_seconds for r in good)
    cpu = [r.cpu_seconds * 1000 / r.ops for r in good]
    row.update(
        p50_ms=round(statistics.median(p50s), 4),
        p99_ms=round(statistics.median(p99s), 4),
        ops_per_s=round(statistics.median(rates), 1) if rates else None,
        rounds=len(good),
        ops=sum(r.ops for r in good),
        errors=errors,
        p50_ms_per_round=[round(x, 4) for x in p50s],
        ops_per_s_per_round=[round(x, 1) for x in rates],
        prepare_ms_per_op=round(prepared * 1000 / max(1, sum(r.ops for r in good)), 4),
        # Every thread of the process (the Pilot's background writers, DBOS's pollers),
        # from the barrier to the last client's end, per operation completed.
        cpu_ms_per_op=round(statistics.median(cpu), 4),
    )
    if first:
        row["first_error"] = first
    row.update(cell.extra())
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of each row to its yardsticks at the same number of clients.

    To ``raw`` (and ``raw_hot`` for ``_hot`` rows); to ``floor`` (every row but the
    floor's own); to DBOS for Marque rows (``dbos``, or ``dbos_replay`` for replays).
    Pre-fill rows have one client and compare with the yardsticks at one client.
    """

    def index(name: str) -> dict[int, dict[str, Any]]:
        return {r["clients"]: r for r in rows if r["name"] == name and r["p50_ms"] is not None}

    raw, raw_hot, floor = index("raw"), index("raw_hot"), index("floor")
    dbos, dbos_replay = index("dbos"), index("dbos_replay")
    for row in rows:
        clients = row["clients"]
        _ratios(row, raw.get(clients), "raw")
        if row["name"].endswith("_hot") and row["name"] != "raw_hot":
            _ratios(row, raw_hot.get(clients), "raw_hot")
        if row["name"] != "floor":
            _ratios(row, floor.get(clients), "floor")
        if row["name"].startswith("marque"):
            peer = dbos_replay if "replay" in row["name"] else dbos
            _ratios(row, peer.get(clients), "dbos")


def _ratios(row: dict[str, Any], base: dict[str, Any] | None, yardstick: str) -> None:
    if base is None or row["p50_ms"] is None:
        return
    row[f"p50_ratio_to_{yardstick}"] = round(row["p50_ms"] / base["p50_ms"], 3)
    if row["ops_per_s"] and base["ops_per_s"]:
        row[f"throughput_ratio_to_{yardstick}"] = round(row["ops_per_s"] / base["ops_per_s"], 3)
    mine, theirs = row.get("p50_ms_per_round") or [], base.get("p50_ms_per_round") or []
    paired = [a / b for a, b in zip(mine, theirs, strict=False) if b]
    if paired:
        row[f"p50_ratio_to_{yardstick}_paired"] = round(statistics.median(paired), 3)
    if row.get("cpu_ms_per_op") and base.get("cpu_ms_per_op"):
        row[f"cpu_ratio_to_{yardstick}"] = round(row["cpu_ms_per_op"] / base["cpu_ms_per_op"], 3)
