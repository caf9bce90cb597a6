"""Row 8: two reconcilers and a live original, all at once.

The original is a ``pilot serve`` running a slow statement. Half the cases
leave it running (its lease holds: the reconcilers must keep their hands
off); the other half SIGSTOP it mid-statement until its lease has run out,
start two ``marque reconcile`` processes together, and SIGCONT the original
at a random moment while they work. The tombstone of a reconciler and the
original's stamp meet at the target's unique key, so exactly one of "it
applied" and "it never can" becomes true, and every answer must agree with
it.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.world import MARQUE, PilotProcess, SoakWorld, _env

#: About 0.2–0.4 s of SQLite work inside the statement (well under its timeout).
SLOW_INSERT = ("INSERT INTO effects (op, at) SELECT ?, (WITH RECURSIVE c(x) AS (SELECT 1 "
               "UNION ALL SELECT x + 1 FROM c WHERE x < 400000) SELECT count(*) FROM c)")
#: The marque's statement timeout; with the grace below, the lease is 1.5 s.
STATEMENT_TIMEOUT_MS = 1000
LEASE_GRACE_SECONDS = 0.5


def _reconcile(world: SoakWorld) -> subprocess.Popen[str]:
    return subprocess.Popen([str(MARQUE), "reconcile", "--home", str(world.home), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=_env(None),
                            cwd=world.root)


def _case(ctx: RunContext, world: SoakWorld, index: int, stop: bool) -> str:
    op = world.op(f"rec-{index}", sql=SLOW_INSERT, statement_timeout_ms=STATEMENT_TIMEOUT_MS)
    nonce = f"n-{index}"
    pilot = PilotProcess(world)
    worker = threading.Thread(target=invoke, args=(ctx, world, pilot.url, op, nonce),
                              kwargs={"stopped": stop, "timeout": 60.0})
    worker.start()
    time.sleep(ctx.rng.uniform(0.03, 0.12))
    if stop:
        pilot.signal(signal.SIGSTOP)
        ctx.history.record("fault", op=op.op, fault="sigstop")
        time.sleep(STATEMENT_TIMEOUT_MS / 1000 + LEASE_GRACE_SECONDS + 0.2)
    reconcilers = [_reconcile(world), _reconcile(world)]
    ctx.history.record("fault", op=op.op, fault="two_reconcilers")
    if stop:
        time.sleep(ctx.rng.uniform(0.0, 0.6))
        pilot.signal(signal.SIGCONT)
        ctx.history.record("fault", op=op.op, fault="sigcont")
    codes = []
    for proc in reconcilers:
        out, err = proc.communicate(timeout=120)
        codes.append(proc.returncode)
        ctx.history.record("note", op=op.op, reconciler_exit=proc.returncode,
                           said=(out or err)[-400:])
    worker.join(120)
    try:
        invoke(ctx, world, pilot.url, op, nonce, retry=True)
    finally:
        pilot.stop()
    return "ok" if all(code in (0, 5) for code in codes) else f"reconciler exits {codes}"


@scenario(8, "reconcilers_race", quick=10, full=500)
def run(ctx: RunContext) -> ScenarioResult:
    """Half with the original alive in its lease, half stopped past it and resumed."""
    world = SoakWorld(ctx.workdir / "world",
                      settings={"lease_grace_seconds": LEASE_GRACE_SECONDS})
    strange = []
    for index in range(ctx.count):
        said = _case(ctx, world, index, stop=index % 2 == 1)
        if said != "ok":
            strange.append(f"rec-{index}: {said}")
    return finish(ctx, world, ctx.count, extra_violations=strange,
                  figures={"stopped_past_lease": ctx.count // 2})
