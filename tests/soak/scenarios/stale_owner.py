"""Row 6: a stale owner — the Pilot SIGSTOPped past its lease, reconciled, then SIGCONT.

Two ``pilot serve`` processes share one home (one ledger) and a PostgreSQL
target, with a short lease (a marque's 800 ms statement timeout + 0.5 s of
grace) and a 1 s lock timeout. Each case posts an operation to the original, A,
whose effect insert sleeps 300 ms, and SIGSTOPs A while its target transaction
is open: while that statement sleeps on the server (``sleeping``), or a random
20–350 ms into the call (``random``: before the stamp, in the statement, near
COMMIT). Once A's lease has run out, another process reconciles it: a client
asking B with the same nonce (twice — the second may run attempt 2 while A is
still stopped), or ``marque reconcile --home`` in a process of its own. Then A
is SIGCONTed and finishes what it was doing, and the client asks once more.

Half the cases make A's open transaction die on the server while A is
stopped (``idle_in_transaction_session_timeout`` of 300 ms, set by the marque
itself): the tombstone then goes in, and A must not apply after it — its
COMMIT fails, or its stamp insert meets the tombstone. In the other half the
tombstone waits behind A's stamp until the lock timeout, and the attempt must
stay indeterminate until A, resumed, commits it. Either way the effects table
holds at most one row per operation, no answer contradicts another, and an
attempt whose stamp is a tombstone has no effect row.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter

from support.cli import cli_env
from support.wait import wait_until

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._pg import (
    backends,
    fresh_database,
    pg_op,
    query,
    stamps_of,
)
from soak.world import MARQUE, Answer, PilotProcess, SoakWorld

SETTINGS = {"statement_timeout_ms": 1000, "lease_grace_seconds": 0.5, "lock_timeout_ms": 1000}
STATEMENT_TIMEOUT_MS = 800
LEASE_SECONDS = STATEMENT_TIMEOUT_MS / 1000 + SETTINGS["lease_grace_seconds"]
SLOW_EFFECT = "INSERT INTO effects (op, at) SELECT %s, 0 FROM pg_sleep(0.3)"
KILL_IDLE = ("SELECT set_config('idle_in_transaction_session_timeout', '300', true)", ())


class _Run:
    def __init__(self, ctx: RunContext) -> None:
        assert ctx.pg_admin_dsn is not None
        self.ctx = ctx
        self.dsn = fresh_database(ctx.pg_admin_dsn)
        self.world = SoakWorld(ctx.workdir / "world", target_dsn=self.dsn, settings=SETTINGS)
        self.original = PilotProcess(self.world)
        self.other = PilotProcess(self.world)
        self.violations: list[str] = []
        self.figures: Counter[str] = Counter()

    def case(self, index: int) -> None:
        rng = self.ctx.rng
        name = f"stale-{index}"
        killed = rng.random() < 0.5
        when = rng.choice(("sleeping", "random"))
        by = rng.choice(("client", "cli"))
        statements = [KILL_IDLE] if killed else []
        statements.append((SLOW_EFFECT, (name,)))
        op = pg_op(self.world, name, statements, statement_timeout_ms=STATEMENT_TIMEOUT_MS)
        nonce = f"n-{index}"
        for pilot in ("original", "other"):
            if not getattr(self, pilot).alive:
                setattr(self, pilot, PilotProcess(self.world))
        answers: list[Answer] = []
        url = self.original.url
        client = threading.Thread(target=lambda: answers.append(invoke(
            self.ctx, self.world, url, op, nonce, pilot="original", when=when,
            killed=killed)))
        client.start()
        if when == "sleeping":
            if not wait_until(lambda: backends(self.dsn, f"%{SLOW_EFFECT[:20]}%") >= 1,
                              timeout=10, step=0.01):
                self.violations.append(f"{name}: the statement never ran on the server")
        else:
            time.sleep(rng.uniform(0.02, 0.35))
        stopped = time.monotonic()
        self.original.signal(signal.SIGSTOP)
        self.ctx.history.record("fault", op=name, stopped=True, when=when, killed=killed)
        time.sleep(max(0.0, LEASE_SECONDS + 0.3 - (time.monotonic() - stopped)))
        if by == "client":
            for round_ in (1, 2):
                invoke(self.ctx, self.world, self.other.url, op, nonce, pilot="other",
                       retry=round_)
        else:
            self._reconcile_by_cli(name, op.marque_id, nonce)
        self.original.signal(signal.SIGCONT)
        self.ctx.history.record("fault", op=name, continued=True)
        client.join(60)
        if not answers:
            self.violations.append(f"{name}: the original never answered after SIGCONT")
        final = invoke(self.ctx, self.world, self.other.url, op, nonce, pilot="other",
                       retry="final")
        self.figures[f"{when}_{'killed' if killed else 'held'}_{by}_final_{final.status}"] += 1
        self._fenced(name, op.marque_id)

    def _reconcile_by_cli(self, name: str, marque_id: str, nonce: str) -> None:
        done = subprocess.run([str(MARQUE), "reconcile", "--home", str(self.world.home),
                               "--json"], capture_output=True, text=True, timeout=120,
                              cwd=self.world.root, env=cli_env())
        try:
            body = json.loads(done.stdout)
        except ValueError:
            self.ctx.history.record("note", op=name, reconcile=done.returncode,
                                    stderr=done.stderr[-2000:])
            return
        # What the reconciler concluded is an answer too: it must never be contradicted.
        for change in body.get("changed", []):
            if (change["marque_id"], change["nonce"]) != (marque_id, nonce):
                continue
            kind = {"applied": "ok", "aborted_not_applied": "fail"}.get(change["to"], "info")
            self.ctx.history.record(kind, op=name, marque_id=marque_id, nonce=nonce,
                                    executions=1, status=change["to"],
                                    attempt=change["attempt"], reconciler="cli")

    def _fenced(self, name: str, marque_id: str) -> None:
        """An attempt whose stamp is a tombstone left no effect; one row at most."""
        [(rows,)] = query(self.dsn, "SELECT count(*) FROM effects WHERE op = %s", (name,))
        stamps = stamps_of(self.dsn, marque_id)
        kinds = {kind for _, _, kind in stamps}
        if rows > 1:
            self.violations.append(f"{name}: {rows} effect rows")
        if kinds == {"tombstone"} and rows:
            self.violations.append(f"{name}: applied after its tombstone ({stamps})")
        if stamps and stamps[0][1] == 1 and kinds == {"tombstone"}:
            self.figures["tombstoned_original"] += 1
        elif stamps and stamps[0][1] > 1:
            self.figures["new_attempt_applied_over_tombstone"] += 1
        elif kinds == {"applied"}:
            self.figures["original_applied"] += 1

    def stop(self) -> None:
        for pilot in (self.original, self.other):
            pilot.signal(signal.SIGCONT)
            pilot.stop()


@scenario(6, "stale_owner", quick=20, full=500, needs_pg=True)
def run(ctx: RunContext) -> ScenarioResult:
    """``count`` cases: stop past the lease, reconcile elsewhere, continue, ask again."""
    state = _Run(ctx)
    try:
        for index in range(ctx.count):
            state.case(index)
    finally:
        state.stop()
    return finish(ctx, state.world, ctx.count, figures=dict(state.figures),
                  extra_violations=state.violations)
