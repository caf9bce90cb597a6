"""Row 5: statement timeouts against a row another session has locked.

Each case gives one row of ``contended`` to a session of the harness, which
locks it (an ``UPDATE`` of its own, ``SELECT … FOR UPDATE``, or ``FOR NO KEY
UPDATE``) and keeps its transaction open. The operation's marque updates that
row and inserts its effect row — in either order, so sometimes the effect row
is already written when the wait begins — under a statement timeout of 100 to
400 ms of its own. It must end ``aborted_not_applied`` with
``statement_timeout`` (SQLSTATE 57014), having changed nothing; the Pilot's
session must have stopped waiting (nobody is blocked behind the holder any
more). The holder then commits or rolls back, and the same nonce is retried:
attempt 2 applies, on top of whatever the holder committed.

One case in five races instead: the holder lets go at a random moment around
the timeout, so the marque may time out or may get the lock and apply. Either
is right, as long as the row, the effect and the answers agree.
"""

from __future__ import annotations

import threading

from support.wait import wait_until

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._pg import (
    LockHolder,
    check_first_attempts,
    effect,
    fresh_database,
    pg_op,
    query,
    run_sql,
)
from soak.world import PilotProcess, SoakWorld

LOCKS = {
    "update": "UPDATE contended SET v = v + 100 WHERE id = %s",
    "for_update": "SELECT v FROM contended WHERE id = %s FOR UPDATE",
    "for_no_key_update": "SELECT v FROM contended WHERE id = %s FOR NO KEY UPDATE",
}
BUMP = "UPDATE contended SET v = v + 1 WHERE id = %s"


def _value(dsn: str, row: int) -> int:
    [(value,)] = query(dsn, "SELECT v FROM contended WHERE id = %s", (row,))
    return int(value)


def _case(ctx: RunContext, world: SoakWorld, url: str, dsn: str, index: int,
          violations: list[str], figures: dict[str, int],
          expected: dict[str, tuple[str, str, str]]) -> None:
    lock = ctx.rng.choice(sorted(LOCKS))
    effect_first = ctx.rng.random() < 0.5
    timeout_ms = ctx.rng.randint(100, 400)
    racing = ctx.rng.random() < 0.2
    name = f"timeout-{index}"
    statements = [(BUMP, (index,)), effect(name)]
    if effect_first:
        statements.reverse()
    op = pg_op(world, name, statements, statement_timeout_ms=timeout_ms)
    nonce = f"n-{index}"
    holder = LockHolder(dsn, (LOCKS[lock], (index,)))
    held_by_holder = 100 if lock == "update" else 0
    commit = ctx.rng.random() < 0.5
    ctx.history.record("fault", op=name, lock=lock, timeout_ms=timeout_ms, racing=racing,
                       effect_first=effect_first, holder_commits=commit)
    releaser = None
    if racing:
        delay = ctx.rng.uniform(0.5, 1.5) * timeout_ms / 1000
        releaser = threading.Timer(delay, holder.release, kwargs={"commit": commit})
        releaser.start()
    first = invoke(ctx, world, url, op, nonce, lock=lock, timeout_ms=timeout_ms)
    if releaser is not None:
        releaser.join()
    else:
        if (first.status, first.code) != ("aborted_not_applied", "statement_timeout"):
            violations.append(f"{name}: waited on a {lock} lock past {timeout_ms} ms, yet was "
                              f"told {first.status} ({first.code})")
        if not wait_until(lambda: holder.blocking(dsn) == 0, timeout=5.0, step=0.01):
            violations.append(f"{name}: a session still waits on the holder after the timeout")
        if _value(dsn, index) != 0:
            violations.append(f"{name}: the row changed while the holder held it")
        holder.release(commit=commit)
        expected[op.marque_id] = ("aborted_not_applied", "statement_timeout", "57014")
    figures[f"first_{first.status}_{first.code}"] = figures.get(
        f"first_{first.status}_{first.code}", 0) + 1
    again = invoke(ctx, world, url, op, nonce, retry=True)
    if again.status != "applied":
        violations.append(f"{name}: the retry after the lock was released was told "
                          f"{again.status} ({again.code})")
    want = (held_by_holder if commit else 0) + (1 if again.status == "applied" else 0)
    if _value(dsn, index) != want:
        violations.append(f"{name}: the row holds {_value(dsn, index)}, expected {want} "
                          f"(holder {'committed' if commit else 'rolled back'} a {lock})")


@scenario(5, "statement_timeout", quick=60, full=200, needs_pg=True)
def run(ctx: RunContext) -> ScenarioResult:
    """``count`` cases, each a locked row, a timed-out marque, a release and a retry."""
    assert ctx.pg_admin_dsn is not None
    dsn = fresh_database(ctx.pg_admin_dsn)
    world = SoakWorld(ctx.workdir / "world", target_dsn=dsn)
    run_sql(dsn, "CREATE TABLE contended (id int PRIMARY KEY, v int NOT NULL)",
            ("INSERT INTO contended SELECT g, 0 FROM generate_series(0, %s) g",
             (ctx.count,)))
    violations: list[str] = []
    figures: dict[str, int] = {}
    expected: dict[str, tuple[str, str, str]] = {}
    pilot = PilotProcess(world)
    try:
        for index in range(ctx.count):
            _case(ctx, world, pilot.url, dsn, index, violations, figures, expected)
    finally:
        pilot.stop()
    check_first_attempts(world, expected, violations)
    return finish(ctx, world, ctx.count, figures=dict(figures), extra_violations=violations)
