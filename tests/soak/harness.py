"""The steps every execution scenario shares: invoke and record, then settle and check."""

from __future__ import annotations

import time

from soak.checker import check, final_state, settle
from soak.scenario import RunContext, ScenarioResult
from soak.world import Answer, Op, SoakWorld, post_execution

__all__ = ["finish", "invoke"]


def invoke(ctx: RunContext, world: SoakWorld, url: str, op: Op, nonce: str, *,
           timeout: float = 30.0, proof: str | None = None, **extra: object) -> Answer:
    """Post one execution, recording the invocation and what the client was told."""
    fields = {"op": op.op, "marque_id": op.marque_id, "nonce": nonce,
              "executions": op.executions, **extra}
    ctx.history.record("invoke", **fields)
    answer = post_execution(url, world, op, nonce, timeout=timeout, proof=proof)
    ctx.history.record(answer.type, **fields, **answer.fields())
    return answer


def finish(ctx: RunContext, world: SoakWorld, cases: int, *, allow_open: bool = False,
           figures: dict[str, object] | None = None,
           extra_violations: list[str] | None = None) -> ScenarioResult:
    """Settle everything, read the truth, check the history against it."""
    started = time.monotonic()
    notes = settle(world)
    state = final_state(world, notes)
    from soak.scenario import History

    violations, counted, resolve = check(History.read(ctx.history.path), state,
                                         allow_open=allow_open)
    violations = list(extra_violations or []) + violations
    counted.update(figures or {})
    counted["settle_seconds"] = round(time.monotonic() - started, 2)
    if notes:
        counted["settle_notes"] = notes
    return ScenarioResult(ctx.name, cases, violations, counted, resolve)
