"""After a run: settle everything, read what is true, and compare it with what clients were told.

:func:`settle` is the end of every run: the Pilot reopened in process (its
start-up recovery), every unsettled attempt reconciled from the target's
stamps, the outbox drained to the logbook. :func:`final_state` then reads
the truth from the files and databases themselves — the effects table, the
ledger's attempts, the Pilot's logbook — and :func:`check` holds the history
against it, per nonce (see ``docs/reliability.md`` for the invariants).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from marque.logbook.chain import verify_entries
from soak.world import SoakWorld

__all__ = ["FinalState", "check", "final_state", "settle"]

SETTLED = ("applied", "aborted_not_applied")


@dataclass
class FinalState:
    """The truth after a run, read from the target, the ledger and the logbook."""

    effects: dict[str, int]
    #: (marque_id, nonce, attempt) → {status, error, settled_at}
    attempts: dict[tuple[str, str, int], dict[str, Any]]
    #: (marque_id, nonce, attempt, status) → how many ``execution.<status>`` entries
    reported: Counter[tuple[str, str, int, str]]
    #: (marque_id, nonce, attempt, status) → the first such entry's time
    reported_at: dict[tuple[str, str, int, str], float]
    logbook_break: str | None
    unacked_outbox: int
    settle_notes: list[str] = field(default_factory=list)


def settle(world: SoakWorld, rounds: int = 3) -> list[str]:
    """Reopen the Pilot in process and settle what evidence can settle; notes on what failed."""
    from marque.errors import MarqueError
    from marque.pilot import open_pilot

    notes: list[str] = []
    for _ in range(rounds):
        try:
            pilot = open_pilot(world.home)
        except MarqueError as exc:
            notes.append(f"open: {exc.code}: {exc.message}")
            continue
        try:
            pilot.recover()
            drained = pilot.report()
            if drained and not pilot.unsettled():
                return notes
        except MarqueError as exc:
            notes.append(f"recover: {exc.code}: {exc.message}")
        finally:
            pilot.close()
    return notes


def ledger_rows(world: SoakWorld, sql: str) -> list[tuple[Any, ...]]:
    if world.ledger_dsn is None or world.ledger_dsn.startswith("sqlite"):
        path = world.home / "ledger.sqlite3" if world.ledger_dsn is None \
            else world.ledger_dsn.removeprefix("sqlite:///")
        conn = sqlite3.connect(path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(world.ledger_dsn, autocommit=True) as conn:
        conn.execute("SET search_path TO marque_ledger")
        return list(conn.execute(sql).fetchall())


def final_state(world: SoakWorld, notes: list[str] | None = None) -> FinalState:
    """Read the effects, the ledger's attempts and the Pilot's logbook as they are now."""
    attempts = {
        (m, n, a): {"status": s, "error": json.loads(e) if e else None, "settled_at": t}
        for m, n, a, s, e, t in ledger_rows(
            world, "SELECT marque_id, nonce, attempt, status, error, settled_at FROM attempts")
    }
    [(unacked,)] = ledger_rows(world, "SELECT count(*) FROM outbox WHERE acked_at IS NULL")
    conn = sqlite3.connect(world.home / "logbook.sqlite3")
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM logbook ORDER BY seq")]
    finally:
        conn.close()
    reported: Counter[tuple[str, str, int, str]] = Counter()
    reported_at: dict[tuple[str, str, int, str], float] = {}
    for row in rows:
        if not str(row["kind"]).startswith("execution.") or row["kind"] == \
                "execution.reconciliation":
            continue
        body = json.loads(row["body"])
        if "attempt" not in body:
            continue
        key = (body["marque_id"], body["nonce"], int(body["attempt"]),
               str(row["kind"]).removeprefix("execution."))
        reported[key] += 1
        reported_at.setdefault(key, float(row["at"]))
    entries = [{**r, "body": json.loads(r["body"])} for r in rows]
    found = verify_entries(entries)
    return FinalState(world.effects(), attempts, reported, reported_at,
                      None if found is None else f"seq {found.seq}: {found.reason}",
                      int(unacked), list(notes or []))


def check(history: list[dict[str, Any]], state: FinalState, *,
          allow_open: bool = False) -> tuple[list[str], dict[str, Any], list[float]]:
    """Every invariant, per nonce: ``(violations, figures, seconds to resolve)``.

    ``allow_open``: an indeterminate attempt may stay open if it says why (a
    target that cannot be reached); otherwise every one must be resolved.
    """
    violations: list[str] = []
    answers: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    ops: dict[str, dict[str, Any]] = {}
    for event in history:
        if "marque_id" not in event or "nonce" not in event:
            continue
        ops.setdefault(event["op"], {"marque_id": event["marque_id"],
                                     "executions": event.get("executions", 1),
                                     "nonces": set()})["nonces"].add(event["nonce"])
        if event["type"] in ("ok", "fail", "info"):
            answers[(event["marque_id"], event["nonce"])].append(event)

    latest: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
    for (m, n, a), attempt in state.attempts.items():
        if (m, n) not in latest or a > latest[(m, n)][0]:
            latest[(m, n)] = (a, attempt)

    figures: Counter[str] = Counter()
    resolve: list[float] = []
    for op, info in sorted(ops.items()):
        rows = state.effects.get(op, 0)
        marque_id = info["marque_id"]
        applied_nonces = [n for n in info["nonces"]
                          if latest.get((marque_id, n), (0, {}))[1].get("status") == "applied"]
        if rows > info["executions"]:
            violations.append(f"{op}: {rows} effect rows for a budget of {info['executions']}")
        if rows != len(applied_nonces):
            violations.append(f"{op}: {rows} effect rows but {len(applied_nonces)} nonce(s) "
                              f"settled applied ({sorted(applied_nonces)})")
        figures["effect_rows"] += rows
        for nonce in sorted(info["nonces"]):
            _check_nonce(op, marque_id, nonce, answers[(marque_id, nonce)], latest.get(
                (marque_id, nonce)), state, violations, figures, resolve, allow_open)

    for (m, n, a), attempt in state.attempts.items():
        status = attempt["status"]
        if status == "in_progress":
            violations.append(f"{m}/{n} attempt {a} left in_progress")
        if status in SETTLED:
            count = state.reported[(m, n, a, status)]
            if count != 1:
                violations.append(f"{m}/{n} attempt {a}: {count} execution.{status} logbook "
                                  "entries (exactly one expected)")
    for key, count in state.reported.items():
        if count > 1:
            violations.append(f"{key}: reported {count} times")
    if state.logbook_break is not None:
        violations.append(f"the logbook does not verify: {state.logbook_break}")
    if state.unacked_outbox:
        violations.append(f"{state.unacked_outbox} outbox entries never acknowledged")
    figures["ops"] = len(ops)
    figures["attempts"] = len(state.attempts)
    return violations, dict(figures), resolve


def _check_nonce(op: str, marque_id: str, nonce: str, told: list[dict[str, Any]],
                 latest: tuple[int, dict[str, Any]] | None, state: FinalState,
                 violations: list[str], figures: Counter[str], resolve: list[float],
                 allow_open: bool) -> None:
    where = f"{op} {marque_id}/{nonce}"
    final = None if latest is None else latest[1]["status"]
    for answer in told:
        figures[f"told_{answer['type']}"] += 1
        kind = answer["type"]
        if kind == "ok" and final != "applied":
            violations.append(f"{where}: told applied, but it ended {final}")
        if kind == "fail" and answer.get("status") == "aborted_not_applied":
            attempt = answer.get("attempt")
            seen = state.attempts.get((marque_id, nonce, attempt or 0), {}).get("status")
            if seen != "aborted_not_applied":
                violations.append(f"{where}: told attempt {attempt} not applied, but the "
                                  f"ledger holds it {seen}")
        if kind == "fail" and answer.get("status") == "refused" and final is not None \
                and all(a["type"] == "fail" and a.get("status") == "refused" for a in told):
            violations.append(f"{where}: every call was refused, yet the ledger claimed it")
    if final is None:
        return
    if final == "indeterminate":
        error = latest[1].get("error") if latest else None
        if allow_open and error:
            figures["indeterminate_open_with_reason"] += 1
        else:
            violations.append(f"{where}: left indeterminate after settling ({error})")
    figures[f"final_{final}"] += 1
    # Time from the first unknown answer to the logbook entry of the settled outcome.
    unknown = [a["at"] for a in told if a["type"] == "info"]
    if unknown and final in SETTLED and latest is not None:
        settled_at = state.reported_at.get((marque_id, nonce, latest[0], final))
        if settled_at is not None and settled_at >= min(unknown):
            resolve.append(settled_at - min(unknown))
            figures["indeterminate_resolved"] += 1
