"""What rows 9–11 share: losing the ledger, faking the Pilot's clock, checking from the target.

* **The ledger's files** (:func:`wipe_ledger`, :func:`snapshot_ledger`,
  :func:`restore_ledger`): a SQLite ledger is ``ledger.sqlite3`` and its
  ``-wal`` / ``-shm`` siblings, copied and removed only while no Pilot runs.
  A wiped ledger is made again by the real ``marque pilot init``.
* **The target's own word** (:func:`stamps`, :func:`target_checks`): once a
  ledger is lost, the history can no longer be held against it, only against
  the effects table and the stamp table — the anchors outside the ledger.
* **The shared checker without what the ledger forgot** (:func:`check_kept`):
  the shared checker over the operations whose ledger record survived, plus
  the row's own violations.
* **The Pilot under another clock** (:func:`faketime_env`): Debian's
  libfaketime preloaded into ``pilot serve`` with a fixed offset.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from soak.checker import check, final_state, settle
from soak.world import MARQUE, PilotProcess, SoakWorld, _env

__all__ = ["FAKETIME_LIB", "ListeningPilot", "check_kept", "faketime_env", "health",
           "ledger_files", "logbook_kinds", "restore_ledger", "snapshot_ledger", "stamps",
           "target_checks", "wipe_ledger"]

LEDGER = "ledger.sqlite3"
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


# -- the ledger's files ------------------------------------------------------------


def ledger_files(world: SoakWorld) -> list[Path]:
    """The SQLite ledger and its WAL siblings (those that exist)."""
    return [p for p in (world.home / LEDGER, world.home / f"{LEDGER}-wal",
                        world.home / f"{LEDGER}-shm") if p.exists()]


def snapshot_ledger(world: SoakWorld, where: Path) -> None:
    """Copy the ledger's files to ``where`` (the Pilot must be stopped)."""
    where.mkdir(parents=True, exist_ok=True)
    for path in ledger_files(world):
        shutil.copy2(path, where / path.name)


def restore_ledger(world: SoakWorld, where: Path) -> None:
    """Put an old copy back: the current files removed, the copy's laid in their place."""
    for path in ledger_files(world):
        path.unlink()
    for saved in where.iterdir():
        shutil.copy2(saved, world.home / saved.name)


def wipe_ledger(world: SoakWorld) -> str:
    """Delete the ledger and make a new one with ``marque pilot init``; its incarnation."""
    for path in ledger_files(world):
        path.unlink()
    made = subprocess.run([str(MARQUE), "pilot", "init", "--home", str(world.home),
                           "--pilot-id", world.pilot_id, "--json"], capture_output=True,
                          text=True, timeout=60, env=_env(None), stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stdout + made.stderr
    body = json.loads(made.stdout)
    assert body["adopted"] is False, body
    world.incarnation = str(body["incarnation"])
    return world.incarnation


def health(url: str) -> dict[str, Any]:
    """``GET /v1/health`` of a serving Pilot."""
    import httpx

    answer: dict[str, Any] = httpx.get(f"{url}/v1/health", timeout=30).json()
    return answer


def logbook_kinds(world: SoakWorld, prefix: str) -> list[dict[str, Any]]:
    """The Pilot's own logbook entries whose kind starts with ``prefix`` (bodies decoded)."""
    conn = sqlite3.connect(world.home / "logbook.sqlite3")
    try:
        rows = conn.execute("SELECT kind, body FROM logbook WHERE kind LIKE ? ORDER BY seq",
                            (prefix + "%",)).fetchall()
    finally:
        conn.close()
    return [{"kind": kind, "body": json.loads(body)} for kind, body in rows]


# -- the target's own word ---------------------------------------------------------


def stamps(world: SoakWorld) -> dict[tuple[str, str], dict[str, Any]]:
    """The target's stamp table: ``(marque_id, nonce)`` → its row."""
    assert world.dialect == "sqlite", "rows 9-11 run on a SQLite target"
    conn = sqlite3.connect(world.target_dsn.removeprefix("sqlite:///"))
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM marque_stamps")]
    except sqlite3.OperationalError:  # nothing ever ran: no stamp table yet
        rows = []
    finally:
        conn.close()
    return {(r["marque_id"], r["nonce"]): r for r in rows}


def target_checks(history: list[dict[str, Any]], world: SoakWorld,
                  ops: set[str] | None = None) -> tuple[list[str], dict[str, int]]:
    """The invariants that need no ledger, from the effects and stamp tables alone.

    Per operation: effect rows ≤ its budget; each nonce told ``ok`` has an
    applied stamp of its marque; the effect rows are exactly the applied
    stamps (a stamp commits or vanishes with its change), so they lie
    between the nonces told ``ok`` and those told ``ok`` or ``info``.
    ``ops`` limits the check to those operations.
    """
    effects = world.effects()
    held = stamps(world)
    told: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    info: dict[str, dict[str, Any]] = {}
    for event in history:
        if "marque_id" not in event or (ops is not None and event.get("op") not in ops):
            continue
        info.setdefault(event["op"], {"marque_id": event["marque_id"],
                                      "executions": event.get("executions", 1)})
        if event["type"] in ("ok", "fail", "info"):
            told[event["op"]][event["type"]].add(event["nonce"])
    violations: list[str] = []
    figures: dict[str, int] = defaultdict(int)
    for op, about in sorted(info.items()):
        rows = effects.get(op, 0)
        marque_id = about["marque_id"]
        ok = told[op]["ok"]
        unknown = told[op]["info"] - ok
        applied = {n for (m, n), s in held.items() if m == marque_id and s["kind"] == "applied"}
        if rows > about["executions"]:
            violations.append(f"{op}: {rows} effect rows for a budget of {about['executions']}")
        if rows != len(applied):
            violations.append(f"{op}: {rows} effect rows but {len(applied)} applied stamps")
        for nonce in sorted(ok - applied):
            violations.append(f"{op} {marque_id}/{nonce}: told applied, no applied stamp")
        if not len(ok) <= rows <= len(ok) + len(unknown):
            violations.append(f"{op}: {rows} effect rows, {len(ok)} nonce(s) told applied and "
                              f"{len(unknown)} unknown")
        figures["target_checked_ops"] += 1
        figures["target_effect_rows"] += rows
    return violations, dict(figures)


# -- finishing ---------------------------------------------------------------------


def check_kept(world: SoakWorld, history: list[dict[str, Any]], kept: set[str]
               ) -> tuple[list[str], dict[str, Any], list[float]]:
    """Settle, then the shared checker over the operations in ``kept`` only.

    The shared checker reads the ledger as the truth; for operations whose
    ledger record was lost (a wipe, an old copy put back) it does not apply —
    the row checks them against the target instead (:func:`target_checks`).
    Its whole-ledger checks (nothing left in progress, one logbook entry per
    settled attempt, the logbook verifies, the outbox drained) still apply.
    """
    notes = settle(world)
    state = final_state(world, notes)
    shared = [e for e in history if "marque_id" not in e or e.get("op") in kept]
    violations, figures, resolve = check(shared, state)
    violations = [f"{v} (settle: {notes})" if notes else v for v in violations]
    return violations, figures, resolve


# -- processes ---------------------------------------------------------------------


def faketime_env(offset_seconds: float) -> dict[str, str]:
    """The environment that runs a process ``offset_seconds`` off the real clock.

    libfaketime's relative offset (``FAKETIME="+3600s"``) moves ``time()``,
    ``gettimeofday`` and ``clock_gettime(CLOCK_REALTIME)`` — what Python's
    ``time.time()`` reads — and leaves the monotonic clock alone, as a wall
    clock that is wrong (or stepped by NTP) would.

    One side effect no wrong clock has: with the monotonic clock left alone,
    libfaketime (0.9.10) garbles ``clock_nanosleep(CLOCK_MONOTONIC,
    TIMER_ABSTIME)``, so Python 3.11's ``time.sleep`` fails with ``EINVAL`` in
    such a process. A Pilot path that must run under it waits on an event, not
    a sleep (the settler does); a row that drives another one sees it fail.
    """
    if not FAKETIME_LIB.exists():
        raise RuntimeError(f"{FAKETIME_LIB} is missing: apt-get install faketime "
                           "(scripts/ensure-faketime)")
    preload = os.environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{FAKETIME_LIB}{':' + preload if preload else ''}",
            "FAKETIME": f"{offset_seconds:+.3f}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


class ListeningPilot(PilotProcess):
    """A :class:`PilotProcess` on a port chosen up front (a joined Pilot's URL is known)."""

    def __init__(self, world: SoakWorld, port: int, *, env: dict[str, str] | None = None
                 ) -> None:
        super().__init__(world, env=env, port=port)
