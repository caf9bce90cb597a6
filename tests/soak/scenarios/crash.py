"""Row 1: SIGKILL of the Pilot at every named crash point, and at random moments.

Each case runs one operation through a ``pilot serve`` armed to SIGKILL itself
at one point (``MARQUE_CRASH_AT``), restarts the service, and asks again with
the same nonce, as a client that lost its answer would. The reconciliation
point is reached by crashing once at ``after_commit`` or ``before_commit``
and then arming ``after_reconcile_evidence`` for the service that recovers
it. Random cases SIGKILL a clean service a random few milliseconds into an
execution. The checker then holds every answer against the effects table.
"""

from __future__ import annotations

import signal
import threading

from marque.crash import POINTS
from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.world import DiedAtStart, PilotProcess, SoakWorld

#: The points in the order an execution passes them; reconciliation's is reached on recovery.
ORDERED = ("after_verify", "after_claim", "after_begin", "after_stamp", "after_statement",
           "before_commit", "after_commit", "settle_behind", "after_outcome_recorded",
           "before_report_ack",
           "after_reconcile_evidence", "stream_before_outcome", "stream_after_first_chunk")
assert set(ORDERED) == POINTS
#: How long a crash that happens behind the answer (the reporter) may take to come.
BEHIND_SECONDS = 3.0
#: A statement slow enough (tens of ms) that the stream's first events go out before the rest.
SLOW_INSERT = ("INSERT INTO effects (op, at) SELECT ?, (WITH RECURSIVE c(x) AS (SELECT 1 "
               "UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT count(*) FROM c)")


def _crash_case(ctx: RunContext, world: SoakWorld, index: int, point: str,
                fired: dict[str, int]) -> None:
    slow = point == "stream_after_first_chunk"
    op = world.op(f"crash-{index}", sql=SLOW_INSERT if slow else None)
    nonce = f"n-{index}"
    first_point = point
    if point == "after_reconcile_evidence":
        first_point = ctx.rng.choice(("after_commit", "before_commit"))
    pilot = PilotProcess(world, env={"MARQUE_CRASH_AT": first_point})
    invoke(ctx, world, pilot.url, op, nonce, point=first_point)
    died = pilot.wait_dead(BEHIND_SECONDS)
    if died is None:
        pilot.kill()  # never reached: stopped the hard way all the same
        ctx.history.record("note", op=op.op, point=first_point, reached=False)
    else:
        fired[first_point] = fired.get(first_point, 0) + 1
        ctx.history.record("fault", op=op.op, point=first_point, exit=died)
    if point == "after_reconcile_evidence":
        # The service that recovers the attempt dies holding the evidence, unrecorded:
        # in its start-up recovery, or on the retry that finds the dead owner's claim.
        try:
            pilot = PilotProcess(world, env={"MARQUE_CRASH_AT": point})
        except DiedAtStart as dead:
            died = dead.status
        else:
            invoke(ctx, world, pilot.url, op, nonce, point=point, retry=True)
            died = pilot.wait_dead(BEHIND_SECONDS)
            if died is None:
                pilot.kill()
        if died is None:
            ctx.history.record("note", op=op.op, point=point, reached=False)
        else:
            fired[point] = fired.get(point, 0) + 1
            ctx.history.record("fault", op=op.op, point=point, exit=died, at_start=True)
    pilot = PilotProcess(world)
    try:
        invoke(ctx, world, pilot.url, op, nonce, retry=True)
    finally:
        pilot.stop()


def _random_case(ctx: RunContext, world: SoakWorld, index: int) -> None:
    op = world.op(f"random-{index}")
    nonce = f"n-{index}"
    pilot = PilotProcess(world)
    delay = ctx.rng.uniform(0.0, 0.03)
    worker = threading.Thread(target=invoke, args=(ctx, world, pilot.url, op, nonce),
                              kwargs={"delay": delay})
    worker.start()
    threading.Event().wait(delay)
    pilot.signal(signal.SIGKILL)
    ctx.history.record("fault", op=op.op, kill_after=delay)
    worker.join(60)
    pilot.kill()
    pilot = PilotProcess(world)
    try:
        invoke(ctx, world, pilot.url, op, nonce, retry=True)
    finally:
        pilot.stop()


@scenario(1, "sigkill", quick=36, full=1600)
def run(ctx: RunContext) -> ScenarioResult:
    """12 points × n, then random-delay kills; every case retried after a restart."""
    world = SoakWorld(ctx.workdir / "world")
    per_point = max(1, ctx.count * 3 // 8 // len(ORDERED)) if ctx.count >= 16 else 1
    if ctx.full:
        per_point = 50
    pointed = per_point * len(ORDERED)
    randoms = max(0, ctx.count - pointed)
    fired: dict[str, int] = {}
    index = 0
    for point in ORDERED:
        for _ in range(per_point):
            _crash_case(ctx, world, index, point, fired)
            index += 1
    for _ in range(randoms):
        _random_case(ctx, world, index)
        index += 1
    never = sorted(p for p in ORDERED if p not in fired)
    # A point that never fired proved nothing: it is a hole in the campaign, said loudly.
    violations = [f"crash point {p} was never reached" for p in never]
    return finish(ctx, world, index, figures={"fired": fired, "per_point": per_point,
                                              "random_kills": randoms},
                  extra_violations=violations)
