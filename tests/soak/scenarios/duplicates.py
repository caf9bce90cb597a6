"""Row 7: one nonce submitted by 16 processes at once, released by a barrier.

Two forms, alternating: sixteen processes that each hold the Pilot in
process over the one home (sixteen owners of one SQLite ledger, as sixteen
``marque exec`` runs would be), and sixteen client processes posting to
``pilot serve --workers 2``. Either way the ledger's primary key on
``(marque_id, nonce)`` is the only guard: exactly one submission may run the
change, every other one is answered the recorded outcome (or ``in_progress``
to follow), and the effects table holds at most one row.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from soak.harness import finish
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.world import Op, PilotProcess, SoakWorld, post_execution

SUBMITTERS = 16


def _embedded_worker(home: str, holder: dict[str, Any], pilot_id: str, barrier: Any,
                     jobs: Connection) -> None:
    """One process, one Pilot held open over the shared home: run each job at the barrier."""
    from marque.errors import MarqueError
    from marque.pilot import open_pilot
    from marque.token import make_proof

    pilot = open_pilot(home)
    try:
        while True:
            job = jobs.recv()
            if job is None:
                return
            token, nonce = job
            proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot_id)
            barrier.wait()
            try:
                outcome = pilot.execute(token, proof, nonce)
                jobs.send({"status": outcome.status, "attempt": outcome.attempt,
                           "replayed": outcome.replayed,
                           "code": (outcome.error or {}).get("code")})
            except MarqueError as exc:
                jobs.send({"status": "refused", "code": exc.code, "replayed": None})
    finally:
        pilot.close()


def _service_worker(url: str, world: SoakWorld, barrier: Any, jobs: Connection) -> None:
    while True:
        job = jobs.recv()
        if job is None:
            return
        op, nonce = job
        proof = world.proof(op, nonce)
        barrier.wait()
        answer = post_execution(url, world, op, nonce, proof=proof)
        jobs.send({**answer.fields(), "type": answer.type})


_TYPES = {"applied": "ok", "aborted_not_applied": "fail", "refused": "fail"}


def _race(ctx: RunContext, op: Op, nonce: str, pipes: list[Connection], job: Any,
          form: str) -> list[dict[str, Any]]:
    fields = {"op": op.op, "marque_id": op.marque_id, "nonce": nonce,
              "executions": op.executions, "form": form}
    for i, pipe in enumerate(pipes):
        ctx.history.record("invoke", **fields, submitter=i)
        pipe.send(job)
    answers = [pipe.recv() for pipe in pipes]
    for i, answer in enumerate(answers):
        kind = answer.get("type") or _TYPES.get(answer["status"], "info")
        ctx.history.record(kind, **fields, submitter=i,
                           **{k: v for k, v in answer.items() if k != "type"})
    return answers


def _start(target: Any, args: tuple[Any, ...], barrier: Any
           ) -> tuple[list[Any], list[Connection]]:
    context = multiprocessing.get_context("fork")
    procs, pipes = [], []
    for _ in range(SUBMITTERS):
        mine, theirs = context.Pipe()
        proc = context.Process(target=target, args=(*args, barrier, theirs), daemon=True)
        proc.start()
        procs.append(proc)
        pipes.append(mine)
    return procs, pipes


def _stop(procs: list[Any], pipes: list[Connection]) -> None:
    for pipe in pipes:
        pipe.send(None)
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@scenario(7, "duplicate_nonce", quick=20, full=2000)
def run(ctx: RunContext) -> ScenarioResult:
    """Races of one nonce by sixteen processes; at most one runs it."""
    world = SoakWorld(ctx.workdir / "world")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(SUBMITTERS)
    ran_twice: list[str] = []
    half = (ctx.count + 1) // 2

    def judge(op: Op, answers: list[dict[str, Any]]) -> None:
        fresh = [a for a in answers if a.get("status") == "applied" and a.get("replayed") is False]
        if len(fresh) > 1:
            ran_twice.append(f"{op.op}: {len(fresh)} submissions say they ran it")

    procs, pipes = _start(_embedded_worker, (str(world.home), world.holder, world.pilot_id),
                          barrier)
    try:
        for i in range(half):
            op = world.op(f"dup-e{i}")
            judge(op, _race(ctx, op, f"n-{i}", pipes, (op.token, f"n-{i}"), "embedded"))
    finally:
        _stop(procs, pipes)

    pilot = PilotProcess(world, workers=2)
    try:
        procs, pipes = _start(_service_worker, (pilot.url, world), barrier)
        try:
            for i in range(half, ctx.count):
                op = world.op(f"dup-s{i}")
                judge(op, _race(ctx, op, f"n-{i}", pipes, (op, f"n-{i}"), "service"))
        finally:
            _stop(procs, pipes)
    finally:
        pilot.stop()
    return finish(ctx, world, ctx.count, extra_violations=ran_twice,
                  figures={"submitters": SUBMITTERS, "embedded": half,
                           "service": ctx.count - half})
