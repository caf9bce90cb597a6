"""Row 9: the ledger deleted, and the ledger restored from an older copy.

Every case has a world of its own (a Pilot home, a target), so each loss is
checked on its own and a failing seed replays one case at a time.

* **deleted**: an operation runs (cleanly, or with the Pilot SIGKILLed at a
  crash point on the way), another is issued and never run; the Pilot is
  stopped, the ledger's files removed, ``marque pilot init`` run again (a new
  incarnation). Both old marques must then be refused ``wrong_incarnation``
  (the same nonce and a new one), a marque of the new incarnation must run.
* **restored**: operations run, the Pilot stops, the ledger's files are
  copied; more operations run (one of them the second execution of a
  two-execution marque, sometimes through a crash and a recovery); the Pilot
  stops and the old copy is put back. At start the Pilot must see the stamps
  its ledger forgot, rotate to a new incarnation and record the finding;
  every old marque is then refused, so no budget is spent twice. In the
  ``target_away`` variant the target is unreachable while the Pilot starts:
  executions on it must send it nothing (``aborted_not_applied`` with
  ``target_unavailable``: the nonce runs again later) and
  the first one after it is back must catch the old copy.

The shared checker holds the ledger as the truth, which a lost ledger is
not: it checks here only the operations whose ledger record survived
(issued but never run, run before the copy, run in the new incarnation);
every operation is checked against the target itself (effects ≤ budget,
every nonce told applied has its applied stamp and its one effect row),
and every call with an old marque after the loss must be refused.
"""

from __future__ import annotations

import time
from typing import Any

from soak.harness import invoke
from soak.scenario import History, RunContext, ScenarioResult, scenario
from soak.scenarios._loss import (
    check_kept,
    health,
    logbook_kinds,
    restore_ledger,
    snapshot_ledger,
    stamps,
    target_checks,
    wipe_ledger,
)
from soak.world import Answer, Op, PilotProcess, SoakWorld

#: Where a Pilot may die while running the operation whose ledger record is then lost.
DELETE_POINTS = (None, None, "after_claim", "before_commit", "after_commit",
                 "after_outcome_recorded")
RESTORE_VARIANTS = ("plain", "crash_after", "target_away")
BEHIND_SECONDS = 3.0


class Case:
    """One case's world, its operations by fate, and what it found."""

    def __init__(self, ctx: RunContext, kind: str, index: int) -> None:
        self.ctx = ctx
        self.label = f"{kind}-{index}"
        self.world = SoakWorld(ctx.workdir / self.label)
        self.kept: set[str] = set()
        self.lost: set[str] = set()
        self.violations: list[str] = []

    def op(self, name: str, *, kept: bool, executions: int = 1) -> Op:
        op = self.world.op(f"{self.label}-{name}", executions=executions)
        (self.kept if kept else self.lost).add(op.op)
        return op

    def call(self, pilot: PilotProcess, op: Op, nonce: str, **extra: Any) -> Answer:
        return invoke(self.ctx, self.world, pilot.url, op, nonce, case=self.label, **extra)

    def expect(self, answer: Answer, op: Op, nonce: str, want: str) -> None:
        """``want``: ``applied``, or the code of a refusal."""
        got = answer.status if want == "applied" else answer.code
        if answer.type == "fail" and answer.status != "refused":
            got = answer.status
        if got != want:
            self.violations.append(f"{self.label} {op.op}/{nonce}: expected {want}, got "
                                   f"{answer.type} {answer.status} {answer.code}")

    def crash_run(self, op: Op, nonce: str, point: str | None) -> None:
        """Run ``op`` once under a Pilot armed to die at ``point`` (None: a clean run)."""
        pilot = PilotProcess(self.world, env={"MARQUE_CRASH_AT": point} if point else None)
        answer = self.call(pilot, op, nonce, point=point)
        if point is None:
            self.expect(answer, op, nonce, "applied")
            pilot.stop()
            return
        died = pilot.wait_dead(BEHIND_SECONDS)
        if died is None:
            pilot.kill()
        self.ctx.history.record("fault" if died is not None else "note", op=op.op,
                                point=point, case=self.label, reached=died is not None)


def _deleted(ctx: RunContext, index: int, figures: dict[str, float]) -> Case:
    case = Case(ctx, "deleted", index)
    world = case.world
    ran = case.op("ran", kept=False)
    pending = case.op("pending", kept=True)
    point = ctx.rng.choice(DELETE_POINTS)
    case.crash_run(ran, "n-1", point)
    old = world.incarnation
    new = wipe_ledger(world)
    ctx.history.record("fault", case=case.label, fault="ledger_deleted",
                       old_incarnation=old, new_incarnation=new)
    pilot = PilotProcess(world)
    try:
        if health(pilot.url)["incarnation"] != new or new == old:
            case.violations.append(f"{case.label}: serving incarnation "
                                   f"{health(pilot.url)['incarnation']}, not the new {new}")
        for op in (ran, pending):
            for nonce in ("n-1", "n-2"):
                answer = case.call(pilot, op, nonce, phase="after_loss", retry=True)
                case.expect(answer, op, nonce, "wrong_incarnation")
        fresh = case.op("fresh", kept=True)
        case.expect(case.call(pilot, fresh, "n-1"), fresh, "n-1", "applied")
    finally:
        pilot.stop()
    # What the target's stamps show stays true: the old run's stamp, if any, is the old
    # incarnation's, and nothing the new incarnation refused left one.
    held = stamps(world)
    stamp = held.get((ran.marque_id, "n-1"))
    if stamp is not None and stamp["incarnation"] != old:
        case.violations.append(f"{case.label}: the old run's stamp names {stamp['incarnation']}")
    for op, nonce in ((ran, "n-2"), (pending, "n-1"), (pending, "n-2")):
        if (op.marque_id, nonce) in held:
            case.violations.append(f"{case.label} {op.op}/{nonce}: refused, yet stamped")
    figures[f"deleted_point_{point or 'none'}"] += 1
    return case


def _restored(ctx: RunContext, index: int, figures: dict[str, float]) -> Case:
    case = Case(ctx, "restored", index)
    world = case.world
    variant = RESTORE_VARIANTS[index % len(RESTORE_VARIANTS)]
    before = case.op("before", kept=True)
    budget = case.op("budget", kept=False, executions=2)
    pending = case.op("pending", kept=True)
    pilot = PilotProcess(world)
    try:
        case.expect(case.call(pilot, before, "n-1"), before, "n-1", "applied")
        case.expect(case.call(pilot, budget, "n-1"), budget, "n-1", "applied")
    finally:
        pilot.stop()
    copy = ctx.workdir / case.label / "ledger-copy"
    snapshot_ledger(world, copy)
    old = world.incarnation

    after = case.op("after", kept=False)
    if variant == "crash_after":
        case.crash_run(after, "n-1", ctx.rng.choice(("after_commit", "after_outcome_recorded",
                                                     "before_commit")))
    pilot = PilotProcess(world)
    try:
        case.expect(case.call(pilot, after, "n-1", retry=variant == "crash_after"),
                    after, "n-1", "applied")
        case.expect(case.call(pilot, budget, "n-2"), budget, "n-2", "applied")
    finally:
        pilot.stop()
    restore_ledger(world, copy)
    ctx.history.record("fault", case=case.label, fault="ledger_restored", variant=variant,
                       incarnation=old)

    target = world.root / "target.db"
    away = world.root / "target-away.db"
    if variant == "target_away":
        target.rename(away)
    pilot = PilotProcess(world)
    try:
        if variant == "target_away":
            if health(pilot.url)["incarnation"] != old:
                case.violations.append(f"{case.label}: rotated with its target unreadable")
            answer = case.call(pilot, budget, "n-3", phase="target_away")
            case.expect(answer, budget, "n-3", "aborted_not_applied")
            if answer.code != "target_unavailable":
                case.violations.append(f"{case.label}: the unread target's execution said "
                                       f"{answer.code}, not target_unavailable")
            away.rename(target)
            # The first execution on the target, now readable, must catch the old copy.
            case.expect(case.call(pilot, budget, "n-3", phase="after_loss"), budget, "n-3",
                        "wrong_incarnation")
        now = health(pilot.url)["incarnation"]
        if now == old:
            case.violations.append(f"{case.label}: the restored ledger went unnoticed "
                                   f"(still {old})")
        world.incarnation = now
        findings = [f["body"] for f in logbook_kinds(world, "finding.ledger_regressed")]
        if [f.get("old_incarnation") for f in findings] != [old]:
            case.violations.append(f"{case.label}: findings {findings}, one naming {old} "
                                   "expected")
        for op, nonce in ((before, "n-1"), (after, "n-1"), (after, "n-2"), (budget, "n-3"),
                          (budget, "n-4"), (pending, "n-1")):
            answer = case.call(pilot, op, nonce, phase="after_loss", retry=True)
            case.expect(answer, op, nonce, "wrong_incarnation")
        fresh = case.op("fresh", kept=True)
        case.expect(case.call(pilot, fresh, "n-1"), fresh, "n-1", "applied")
    finally:
        pilot.stop()
        if away.exists():
            away.rename(target)
    figures[f"restored_{variant}"] += 1
    return case


@scenario(9, "ledger_loss", quick=20, full=200)
def run(ctx: RunContext) -> ScenarioResult:
    """Half the cases delete the ledger, half put an old copy back; each checked alone."""
    figures: dict[str, Any] = {"deleted": 0, "restored": 0}
    counters: dict[str, float] = _Counter()
    violations: list[str] = []
    resolve: list[float] = []
    for index in range(ctx.count):
        kind = "deleted" if index % 2 == 0 else "restored"
        started = time.monotonic()
        case = (_deleted if kind == "deleted" else _restored)(ctx, index, counters)
        figures[kind] += 1
        history = [e for e in History.read(ctx.history.path)
                   if e.get("case") == case.label or "marque_id" not in e]
        found, target_figures = target_checks(history, case.world)
        shared, shared_figures, seconds = check_kept(case.world, history, case.kept)
        violations += case.violations + found + [f"{case.label}: {v}" for v in shared]
        resolve += seconds
        for key, value in {**target_figures, **shared_figures}.items():
            counters[key] += value if isinstance(value, int) else 0
        counters[f"{kind}_seconds"] += time.monotonic() - started
    figures.update({k: round(v, 1) if isinstance(v, float) else v for k, v in counters.items()})
    return ScenarioResult(ctx.name, ctx.count, violations, figures, resolve)


class _Counter(dict[str, float]):
    def __missing__(self, key: str) -> float:
        return 0
