"""Matrix row 16: the Pilot checks its ledger's durability at start, refuses or warns.

Pass/fail cases (:data:`CASES`), each on a real engine and, where a start is
involved, through a real ``marque pilot serve``:

* ``sqlite_default`` — a new home's SQLite ledger reads back WAL and
  ``synchronous=FULL`` and the Pilot serves;
* ``sqlite_weakened`` — a live ledger connection set to ``synchronous=OFF``
  behind the ledger's back: ``durability()`` reads it back and
  ``check_durability`` refuses (``ledger_not_durable``), or only warns with
  ``"durability": "warn"``;
* ``pg_durable`` — a PostgreSQL ledger on a server with ``fsync`` and
  ``synchronous_commit`` on: it serves, with no warning;
* ``pg_synchronous_commit_off`` — its database set ``synchronous_commit =
  off`` (``ALTER DATABASE``): ``pilot serve`` exits 2 with
  ``ledger_not_durable``; with ``warn`` it serves, says so on stderr, and an
  execution applies;
* ``pg_fsync_off`` — a private cluster started with ``fsync = off``: the same.

PostgreSQL cases need ``ctx.pg_admin_dsn`` (and, for ``fsync``, the server
binaries); without them they are skipped and the figures say so.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from support.cli import cli_env

from marque.errors import LedgerNotDurable
from marque.pilot.home import PilotHome
from marque.pilot.home_binding import check_durability
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._world import MARQUE, TokenWorld

CASES = ("sqlite_default", "sqlite_weakened", "pg_durable", "pg_synchronous_commit_off",
         "pg_fsync_off")


def serve_once(home: Path, cwd: Path) -> dict[str, Any]:
    """Start ``marque pilot serve``; ``{started, code, stderr, url, proc}`` once it answers."""
    proc = subprocess.Popen(
        [str(MARQUE), "pilot", "serve", "--home", str(home), "--listen", "127.0.0.1:0",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, cwd=cwd, env=cli_env())
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    body = json.loads(line) if line.strip() else {}
    if "url" not in body:
        proc.wait(timeout=60)
        return {"started": False, "status": proc.returncode,
                "code": (body.get("error") or {}).get("code"), "stderr": proc.stderr.read()}
    return {"started": True, "url": body["url"], "proc": proc}


def stop(run: dict[str, Any]) -> str:
    """Stop a started server; its stderr."""
    proc: subprocess.Popen[str] = run["proc"]
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    return err


def set_policy(home: Path, policy: str) -> None:
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    config.durability = policy
    pilot_home.save(config)


@scenario(16, "durability", quick=len(CASES), full=len(CASES))
def run(ctx: RunContext, *, policy_override: str | None = None) -> ScenarioResult:
    """Row 16: refused when not durable, served with a warning under ``warn``, else served.

    ``policy_override`` (tests only) writes that policy instead of ``require`` for the
    refusal half, to show the checker reports a Pilot that starts when it must not.
    """
    result = ScenarioResult("durability", cases=0)
    started = time.monotonic()
    outcomes: dict[str, str] = {}
    for name in CASES[:ctx.count]:
        result.cases += 1
        ctx.history.record("invoke", op="start", case=name)
        try:
            verdict = _CASE[name](ctx, result, policy_override)
        except Exception as exc:  # noqa: BLE001 - a crash of a case is reported, not raised
            verdict = f"error: {type(exc).__name__}: {exc}"
            result.violations.append(f"{name}: {verdict}")
        outcomes[name] = verdict
        ctx.history.record("ok" if verdict in ("passed", "skipped") else "fail", op="start",
                           case=name, verdict=verdict)
    result.figures.update({"cases": outcomes, "seconds": round(time.monotonic() - started, 2)})
    return result


def _sqlite_default(ctx: RunContext, result: ScenarioResult, override: str | None) -> str:
    world = TokenWorld(ctx.workdir / "durability-sqlite")
    pilot = world.open()
    try:
        found = pilot.ledger.durability()
    finally:
        pilot.close()
    if not found.durable or found.settings != {"journal_mode": "wal", "synchronous": "full"}:
        result.violations.append(f"sqlite_default: a new ledger reads back {found.to_dict()}")
    run = serve_once(world.home, world.root)
    if not run["started"]:
        result.violations.append(f"sqlite_default: pilot serve refused: {run}")
        return "failed"
    err = stop(run)
    if "ledger_not_durable" in err:
        result.violations.append("sqlite_default: a durable ledger was warned about")
    return "passed"


def _sqlite_weakened(ctx: RunContext, result: ScenarioResult, override: str | None) -> str:
    world = TokenWorld(ctx.workdir / "durability-sqlite-weak")
    pilot = world.open()
    config = PilotHome(world.home).load()
    try:
        # Behind the ledger's back, on its own writing connection: what it must read back.
        pilot.ledger._conn.execute("PRAGMA synchronous = OFF")  # type: ignore[attr-defined]
        found = pilot.ledger.durability()
        if found.durable or "off" not in found.settings["synchronous"]:
            result.violations.append(f"sqlite_weakened: not read back: {found.to_dict()}")
        config.durability = override or "require"
        try:
            check_durability(pilot.ledger, config, "the soak's ledger")
            result.violations.append("sqlite_weakened: check_durability let a ledger with "
                                     "synchronous=OFF through under require")
        except LedgerNotDurable as exc:
            if "synchronous" not in exc.message:
                result.violations.append(f"sqlite_weakened: the refusal does not say why: "
                                         f"{exc.message}")
        config.durability = "warn"
        with _captured_warnings() as said:
            check_durability(pilot.ledger, config, "the soak's ledger")
        if not any("ledger_not_durable" in line for line in said):
            result.violations.append("sqlite_weakened: warn said nothing")
    finally:
        pilot.close()
    return "passed"


class _captured_warnings:  # noqa: N801 - used as a context manager
    """Collect what ``marque.pilot.home_binding`` logs while the block runs."""

    def __enter__(self) -> list[str]:
        self.lines: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.lines.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("marque.pilot.home_binding").addHandler(self.handler)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("marque.pilot.home_binding").removeHandler(self.handler)


def _pg_world(ctx: RunContext, name: str, admin_dsn: str, setting: str | None) -> TokenWorld:
    import psycopg
    from support.pgcluster import create_database

    database, dsn = create_database(admin_dsn)
    if setting is not None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{database}" SET {setting}')
    return TokenWorld(ctx.workdir / f"durability-{name}", ledger_dsn=dsn)


def _refused_then_warned(result: ScenarioResult, name: str, world: TokenWorld,
                         override: str | None) -> str:
    if override is not None:
        set_policy(world.home, override)
    refused = serve_once(world.home, world.root)
    if refused["started"]:
        stop(refused)
        result.violations.append(f"{name}: pilot serve started on a ledger that is not durable")
    elif (refused["status"], refused["code"]) != (2, "ledger_not_durable"):
        result.violations.append(f"{name}: pilot serve exited {refused['status']} with "
                                 f"{refused['code']}, expected 2 ledger_not_durable: "
                                 f"{refused['stderr'][-300:]}")
    set_policy(world.home, "warn")
    served = serve_once(world.home, world.root)
    if not served["started"]:
        result.violations.append(f"{name}: pilot serve refused under warn: {served}")
        return "failed"
    try:
        marque = world.marque()
        applied = httpx.post(served["url"] + "/v1/executions", timeout=30, json={
            "marque": marque, "nonce": "n1", "proof": world.proof(marque, "n1")})
        if applied.status_code != 200 or '"applied"' not in applied.text:
            result.violations.append(f"{name}: under warn an execution did not apply: "
                                     f"{applied.status_code} {applied.text[:200]}")
    finally:
        err = stop(served)
    if "ledger_not_durable" not in err:
        result.violations.append(f"{name}: under warn nothing was said on stderr: {err[-300:]}")
    return "passed"


def _pg_durable(ctx: RunContext, result: ScenarioResult, override: str | None) -> str:
    if ctx.pg_admin_dsn is None:
        return "skipped"
    world = _pg_world(ctx, "pg-durable", ctx.pg_admin_dsn, None)
    run = serve_once(world.home, world.root)
    if not run["started"]:
        result.violations.append(f"pg_durable: pilot serve refused: {run}")
        return "failed"
    if "ledger_not_durable" in stop(run):
        result.violations.append("pg_durable: a durable PostgreSQL ledger was warned about")
    return "passed"


def _pg_synchronous_commit_off(ctx: RunContext, result: ScenarioResult,
                               override: str | None) -> str:
    if ctx.pg_admin_dsn is None:
        return "skipped"
    world = _pg_world(ctx, "pg-sync-off", ctx.pg_admin_dsn, "synchronous_commit = off")
    return _refused_then_warned(result, "pg_synchronous_commit_off", world, override)


def _pg_fsync_off(ctx: RunContext, result: ScenarioResult, override: str | None) -> str:
    if ctx.pg_admin_dsn is None:
        return "skipped"
    from support.pgcluster import PgCluster, find_bindir

    if find_bindir() is None:
        return "skipped"
    cluster = PgCluster(fsync=False).init().start()
    try:
        world = _pg_world(ctx, "pg-fsync-off", cluster.dsn(), None)
        return _refused_then_warned(result, "pg_fsync_off", world, override)
    finally:
        cluster.destroy()


_CASE = {"sqlite_default": _sqlite_default, "sqlite_weakened": _sqlite_weakened,
         "pg_durable": _pg_durable, "pg_synchronous_commit_off": _pg_synchronous_commit_off,
         "pg_fsync_off": _pg_fsync_off}
