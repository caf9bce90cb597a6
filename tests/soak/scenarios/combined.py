"""Row 15: combined faults, chosen by a hypothesis state machine.

Rules submit new operations, retry old ones under the same nonce, SIGKILL
the Pilot, restart it (sometimes armed at a crash point), cut a client's
connection mid-stream, present marques whose clock is skewed past the
allowance, and lose the ledger (a new incarnation). At the end of each
example the world is settled and checked: the shared checker for the
operations of the last incarnation, and for every operation of an earlier
one what the target alone can say — never more effect rows than its budget,
one row for every "applied" it was told, and no old marque honoured after
the loss. A failing example is printed with hypothesis's reproduction blob
and its history stays in its own directory.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test

from soak.checker import ledger_rows
from soak.harness import finish, invoke
from soak.scenario import History, RunContext, ScenarioResult, scenario
from soak.scenarios.crash import ORDERED
from soak.world import DiedAtStart, Op, PilotProcess, SoakWorld, post_execution

#: Crash points an execution passes (reconciliation's needs a second fault first).
EXECUTION_POINTS = tuple(p for p in ORDERED if p != "after_reconcile_evidence")


def _machine(ctx: RunContext, results: list[ScenarioResult], steps: list[int]) -> type:
    examples = [0]

    class Combined(RuleBasedStateMachine):
        ops = Bundle("ops")

        def __init__(self) -> None:
            super().__init__()
            examples[0] += 1
            self.dir = ctx.workdir / f"example-{examples[0]}"
            shutil.rmtree(self.dir, ignore_errors=True)
            self.world = SoakWorld(self.dir / "world")
            self.history = History(self.dir / "history.jsonl")
            self.local = RunContext(ctx.name, 0, ctx.seed, self.dir, self.history)
            self.pilot: PilotProcess | None = PilotProcess(self.world)
            self.epoch = 0
            self.epochs: dict[str, int] = {}
            self.made = 0
            self.steps = 0
            self.refusals_expected: list[str] = []
            self.skewed: dict[str, str] = {}

        # -- helpers ---------------------------------------------------------------

        def _up(self) -> PilotProcess:
            if self.pilot is None or not self.pilot.alive:
                if self.pilot is not None:
                    self.pilot.kill()
                self.pilot = PilotProcess(self.world)
            return self.pilot

        def _after(self) -> None:
            self.steps += 1
            if self.pilot is not None and not self.pilot.alive:
                self.pilot.kill()
                self.pilot = None

        # -- rules -----------------------------------------------------------------

        @rule(target=ops)
        def submit(self) -> tuple[Op, str]:
            self.made += 1
            op = self.world.op(f"op-{self.made}")
            self.epochs[op.op] = self.epoch
            invoke(self.local, self.world, self._up().url, op, "n-1", epoch=self.epoch)
            self._after()
            return op, "n-1"

        @rule(item=ops)
        def retry(self, item: tuple[Op, str]) -> None:
            op, nonce = item
            answer = invoke(self.local, self.world, self._up().url, op, nonce, retry=True,
                            epoch=self.epoch)
            if self.epochs[op.op] != self.epoch and answer.status not in ("refused", "lost"):
                self.refusals_expected.append(
                    f"{op.op}: a marque of an earlier incarnation was answered "
                    f"{answer.status} after the ledger was lost")
            self._after()

        @rule()
        def kill(self) -> None:
            if self.pilot is not None:
                self.pilot.kill()
                self.pilot = None
                self.history.record("fault", fault="sigkill")
            self._after()

        @rule(point=st.sampled_from(EXECUTION_POINTS))
        def arm(self, point: str) -> None:
            if self.pilot is not None:
                self.pilot.kill()
            try:
                self.pilot = PilotProcess(self.world, env={"MARQUE_CRASH_AT": point})
            except DiedAtStart:
                self.pilot = None
            self.history.record("fault", fault="armed", point=point)
            self._after()

        @rule(item=ops)
        def cut(self, item: tuple[Op, str]) -> None:
            op, nonce = item
            fields = {"op": op.op, "marque_id": op.marque_id, "nonce": nonce,
                      "executions": op.executions, "cut": True, "epoch": self.epoch}
            self.history.record("invoke", **fields)
            # A read timeout far shorter than an execution: the client gives up mid-stream.
            answer = post_execution(self._up().url, self.world, op, nonce, timeout=0.002)
            self.history.record(answer.type, **fields, **answer.fields())
            self._after()

        @rule(late=st.booleans())
        def skew(self, late: bool) -> None:
            self.made += 1
            now = time.time()
            # Far past the window and its allowance: refused, whatever the direction.
            shifted = self.world.op(f"op-{self.made}", ttl_seconds=60,
                                    now=now - 7200 if late else now + 7200)
            self.epochs[shifted.op] = self.epoch
            answer = invoke(self.local, self.world, self._up().url, shifted, "n-1",
                            skewed="late" if late else "early", epoch=self.epoch)
            # Refused, or lost with the process (a crash point armed for another
            # execution may fire meanwhile); never anything that says it ran.
            if answer.status not in ("refused", "lost"):
                self.refusals_expected.append(f"{shifted.op}: a marque outside its window was "
                                              f"answered {answer.status}")
            self.skewed[shifted.op] = shifted.marque_id
            self._after()

        @rule()
        def lose_ledger(self) -> None:
            from marque.pilot.setup import init_home

            if self.pilot is not None:
                self.pilot.kill()
                self.pilot = None
            for suffix in ("", "-wal", "-shm"):
                (self.world.home / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
            made = init_home(self.world.home, self.world.pilot_id)
            self.world.incarnation = made["incarnation"]
            self.epoch += 1
            self.history.record("fault", fault="ledger_lost", incarnation=made["incarnation"])
            self._after()

        def teardown(self) -> None:
            if self.pilot is not None:
                self.pilot.stop()
            self.history.close()
            result = _judge(self.local, self.world, self.epochs, self.epoch,
                            self.refusals_expected, self.made, self.skewed)
            results.append(result)
            steps.append(self.steps)
            assert result.ok, result.violations

    return Combined


def _judge(ctx: RunContext, world: SoakWorld, epochs: dict[str, int], epoch: int,
           refusals: list[str], made: int, skewed: dict[str, str]) -> ScenarioResult:
    """The shared checker over the last incarnation's operations; the target for the rest."""
    events = History.read(ctx.history.path)
    current = [e for e in events if "op" not in e or epochs.get(e["op"], epoch) == epoch]
    Path(ctx.history.path).with_name("history-current.jsonl").write_text(
        "".join(_line(e) for e in current))
    ctx.history = History(Path(ctx.history.path).with_name("history-current.jsonl"))
    ctx.history.close()
    effects = world.effects()
    old = [f"{op}: a marque outside its window left {effects[op]} effect row(s)"
           for op in sorted(skewed) if effects.get(op)]
    claimed = {m for (m,) in ledger_rows(world, "SELECT marque_id FROM claims")}
    old += [f"{op}: a marque outside its window was claimed"
            for op, marque_id in sorted(skewed.items()) if marque_id in claimed]
    for op, born in epochs.items():
        if born == epoch:
            continue
        rows = effects.get(op, 0)
        told_ok = any(e["type"] == "ok" and e.get("op") == op for e in events)
        if rows > 1:
            old.append(f"{op} (incarnation {born}): {rows} effect rows")
        if told_ok and rows != 1:
            old.append(f"{op} (incarnation {born}): told applied, {rows} effect rows")
    return finish(ctx, world, made, extra_violations=refusals + old,
                  figures={"incarnations": epoch + 1})


def _line(event: dict[str, Any]) -> str:
    import json

    return json.dumps(event, sort_keys=True, default=str) + "\n"


@scenario(15, "combined", quick=20, full=500)
def run(ctx: RunContext) -> ScenarioResult:
    """``ctx.count`` examples of up to 15 steps (50 with ``--full``), seeded by ctx.seed."""
    results: list[ScenarioResult] = []
    steps: list[int] = []
    machine = _machine(ctx, results, steps)
    failure = None
    import hypothesis.core

    # Hypothesis has no public seed for run_state_machine_as_test; this is what pytest's
    # --hypothesis-seed sets. With it, --seed reproduces the same examples.
    forced, hypothesis.core.global_force_seed = hypothesis.core.global_force_seed, ctx.seed
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=ctx.count, stateful_step_count=50 if ctx.full else 15,
            deadline=None, database=None, print_blob=True, derandomize=False,
            phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck)))
    except AssertionError as exc:
        failure = str(exc)[:2000]
    finally:
        hypothesis.core.global_force_seed = forced
    violations = [v for r in results for v in r.violations]
    if failure and not violations:
        violations.append(f"state machine failed: {failure}")
    figures: dict[str, Any] = {"examples": len(results), "steps": sum(steps)}
    for result in results:
        for key, value in result.figures.items():
            if isinstance(value, int) and not isinstance(value, bool):
                figures[key] = figures.get(key, 0) + value
    resolve = [s for r in results for s in r.resolve_seconds]
    return ScenarioResult(ctx.name, len(results), violations, figures, resolve)
