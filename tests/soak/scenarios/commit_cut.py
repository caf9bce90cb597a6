"""Row 2: the connection to the PostgreSQL target lost around COMMIT.

A real ``pilot serve`` reaches its target through :class:`support.pgproxy.PgProxy`,
which recognises the message that ends a stamped transaction with COMMIT and
loses it one of three ways, in turn:

* ``drop_before_commit``: the connection dies before COMMIT reaches the server,
  which rolls back: the attempt must end ``aborted_not_applied`` (by tombstone),
  and the same nonce then applies as attempt 2;
* ``drop_after_commit``: COMMIT is forwarded and the whole answer swallowed;
* ``drop_during_reply``: COMMIT is forwarded and only the first 1..31 bytes of
  its 32-byte answer get through (inside a message or between two).

The server committed in the last two, so attempt 1 must end ``applied`` —
found by reconciliation (the applied stamp), never guessed — and the retry is
its replay. Every case asks again with the same nonce, as a client that lost
its answer would; the checker then holds every answer against the effects.
Beyond the checker's invariants, what the fault makes true is checked too:
attempt 1 of a COMMIT that never left is never applied, and attempt 1 of a
COMMIT that reached the server is never anything else.
"""

from __future__ import annotations

from support.pgproxy import MODES, PgProxy

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._pg import attempts_of, fresh_database, point_target
from soak.world import PilotProcess, SoakWorld

#: The answer to ``UPDATE marque.stamps …; COMMIT``: CommandComplete "UPDATE 1" (14
#: bytes), CommandComplete "COMMIT" (12) and ReadyForQuery (6).
REPLY_BYTES = 32
#: What attempt 1 must end as, by what the fault let reach the server.
TRUTH = {"drop_before_commit": "aborted_not_applied", "drop_after_commit": "applied",
         "drop_during_reply": "applied"}


@scenario(2, "commit_cut", quick=90, full=900, needs_pg=True)
def run(ctx: RunContext) -> ScenarioResult:
    """``count`` cases, the three modes in turn (FULL: 3 × 300)."""
    assert ctx.pg_admin_dsn is not None
    target_dsn = fresh_database(ctx.pg_admin_dsn)
    world = SoakWorld(ctx.workdir / "world", target_dsn=target_dsn)
    proxy, proxied_dsn = PgProxy.for_dsn(target_dsn)
    point_target(world, proxied_dsn)
    fired = dict.fromkeys(MODES, 0)
    expected: dict[str, tuple[str, str]] = {}  # marque_id → (mode, attempt 1's truth)
    pilot = PilotProcess(world)
    try:
        for index in range(ctx.count):
            mode = MODES[index % len(MODES)]
            op = world.op(f"cut-{index}")
            nonce = f"n-{index}"
            cut = ctx.rng.randint(1, REPLY_BYTES - 1)
            proxy.arm(mode, reply_bytes=cut)
            invoke(ctx, world, pilot.url, op, nonce, mode=mode, reply_bytes=cut)
            proxy.disarm()
            if proxy.fired.is_set():
                fired[mode] += 1
                expected[op.marque_id] = (mode, TRUTH[mode])
                ctx.history.record("fault", op=op.op, mode=mode, reply_bytes=cut)
            else:
                ctx.history.record("note", op=op.op, mode=mode, fired=False)
            if not pilot.alive:
                pilot = PilotProcess(world)
            invoke(ctx, world, pilot.url, op, nonce, retry=True)
    finally:
        pilot.stop()
        point_target(world, target_dsn)
        proxy.close()
    violations = [f"mode {mode} never fired" for mode, n in fired.items() if not n]
    for (marque_id, nonce, attempt), held in sorted(attempts_of(world).items()):
        if attempt != 1 or marque_id not in expected:
            continue
        mode, truth = expected[marque_id]
        if held["status"] != truth:
            violations.append(f"{marque_id}/{nonce} ({mode}): attempt 1 ended "
                              f"{held['status']}, but the fault makes it {truth}")
    return finish(ctx, world, ctx.count, figures={"fired": fired},
                  extra_violations=violations)
