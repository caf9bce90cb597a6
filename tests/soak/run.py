"""`make soak`: run every row of the fault matrix, check it, and say what held.

    python tests/soak/run.py                  # the bounded run (make soak)
    python tests/soak/run.py --full           # the matrix's counts (make soak FULL=1)
    python tests/soak/run.py --only sigkill --seed 1234 --count 40   # re-run one row
    python tests/soak/run.py --table soak-results/…/results.json      # its Markdown table

Each row works in ``--out`` (default ``soak-results/<UTC time>/<row name>/``)
and leaves its history there (``history.jsonl``). ``results.json`` holds every
row's figures. A row with a violation prints the command that re-runs it with
the same seed and count; its history stays for reading. The exit status is 0
only if no row found a violation.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from soak import scenarios as scenario_package  # noqa: E402
from soak.scenario import SCENARIOS, History, Registered, RunContext, ScenarioResult  # noqa: E402


def load_scenarios() -> dict[str, Registered]:
    """Import every module under ``soak/scenarios`` (each registers its rows)."""
    for module in pkgutil.iter_modules(scenario_package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"soak.scenarios.{module.name}")
    return dict(sorted(SCENARIOS.items(), key=lambda item: (item[1].row, item[0])))


def run_one(row: Registered, *, count: int, seed: int, out: Path, full: bool,
            pg_admin_dsn: str | None) -> ScenarioResult:
    """One row, in its own directory, never raising: a harness error is a violation too."""
    # Absolute: every world passes its paths to child processes started in the world's
    # own directory, where a path relative to ours would name nothing.
    workdir = out.absolute() / row.name
    workdir.mkdir(parents=True, exist_ok=True)
    history = History(workdir / "history.jsonl")
    ctx = RunContext(row.name, count, seed, workdir, history, full=full,
                     pg_admin_dsn=pg_admin_dsn)
    started = time.monotonic()
    try:
        result = row.run(ctx)
    except Exception as exc:  # the harness broke: report it as what it is, keep going
        (workdir / "error.txt").write_text(traceback.format_exc())
        result = ScenarioResult(row.name, 0, [f"harness error: {type(exc).__name__}: {exc}"])
    finally:
        history.close()
    result.figures["seconds"] = round(time.monotonic() - started, 1)
    result.figures["seed"] = seed
    result.figures["history_lines"] = history.lines
    return result


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def table(results: dict[str, Any]) -> str:
    """The Markdown table of a results.json (as docs/reliability.md shows it)."""
    lines = ["| # | row | cases | violations | seconds | p99 to resolve an unknown |",
             "|---|---|---:|---:|---:|---:|"]
    for row in sorted(results["rows"], key=lambda r: (r["row"], r["name"])):
        slowest = row.get("p99_resolve_seconds")
        lines.append(f"| {row['row']} | `{row['name']}` | {row['cases']:,} | "
                     f"{len(row['violations'])} | {row['figures'].get('seconds', '')} | "
                     + (f"{slowest:.3f} s" if slowest is not None else "—") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the fault matrix's full counts")
    parser.add_argument("--only", default="", help="comma-separated row names")
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: random)")
    parser.add_argument("--count", type=int, default=None, help="cases per row")
    parser.add_argument("--out", type=Path, default=None, help="where histories go")
    parser.add_argument("--table", type=Path, default=None,
                        help="print the Markdown table of a results.json, and run nothing")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return 0

    rows = load_scenarios()
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in rows]
        if unknown:
            print(f"unknown rows: {unknown}; known: {sorted(rows)}", file=sys.stderr)
            return 2
        rows = {name: rows[name] for name in wanted}
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    # Made absolute here, once: the Pilots a row starts run in the row's directory, and a
    # home relative to this process's directory would be "not a Pilot home" there.
    out = (args.out or Path("soak-results") / stamp).absolute()
    if out.exists() and any(out.iterdir()):
        # A row's world must be its own: an old world under it would be checked as this run's.
        print(f"{out} is not empty: give --out a new directory", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)

    cluster = None
    pg_admin_dsn = None
    if any(row.needs_pg for row in rows.values()):
        from support.pgcluster import PgCluster

        cluster = PgCluster().init().start()
        pg_admin_dsn = cluster.dsn()
    results: list[dict[str, Any]] = []
    failed = False
    try:
        for name, row in rows.items():
            count = args.count if args.count is not None else (row.full if args.full
                                                                else row.quick)
            print(f"row {row.row:>2} {name:<24} {count:>6} cases ...", end="", flush=True)
            result = run_one(row, count=count, seed=seed, out=out, full=args.full,
                             pg_admin_dsn=pg_admin_dsn)
            slowest = p99(result.resolve_seconds)
            print(f" {'ok' if result.ok else 'VIOLATED'} in {result.figures['seconds']} s"
                  + (f", p99 resolve {slowest:.3f} s" if slowest is not None else ""))
            for violation in result.violations[:20]:
                print(f"    ✘ {violation}")
            if not result.ok:
                failed = True
                print(f"    re-run: python tests/soak/run.py --only {name} --seed {seed} "
                      f"--count {count}   (history: {out / name / 'history.jsonl'})")
            results.append({"row": row.row, **result.to_dict(),
                            "p99_resolve_seconds": slowest})
            (out / "results.json").write_text(json.dumps(
                {"seed": seed, "full": args.full, "rows": results}, indent=2, default=str))
    finally:
        if cluster is not None:
            cluster.destroy()
    print(f"results: {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
