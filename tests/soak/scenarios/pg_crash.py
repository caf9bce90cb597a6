"""Row 3: the PostgreSQL target server and the PostgreSQL ledger server crashed.

The target and the ledger live on two private servers of the scenario's own
(``fsync`` on), which it stops with ``pg_ctl stop -m immediate`` — no
checkpoint, crash recovery on the next start — at the moment each kind says,
while a real ``pilot serve`` (kept across the crashes, its pools going stale)
executes an operation. A table ``soak_slow`` lets an operation's effect
insert, or its COMMIT (a DEFERRABLE INITIALLY DEFERRED constraint trigger),
sleep for a while, so the crash lands where it should; the pause is lifted
once the server is back, so the retry runs at full speed. The kinds, in turn:

* ``target_statement``: the target dies mid-statement (COMMIT never sent);
* ``target_commit``: the target dies inside COMMIT (the deferred trigger sleeps);
* ``ledger_statement``: the ledger dies while the target works: the target
  commits, the Pilot cannot record it (``applied``, ``recorded: false``);
* ``ledger_idle``: the ledger is down before the call: nothing is claimed;
* ``both_statement``: both die mid-statement;
* ``random``: one or both die a random 0–250 ms into an execution whose COMMIT
  takes ~50 ms, wherever that lands (after COMMIT and before its answer too).

Then the servers start again and the client asks with the same nonce until it
has a settled answer (an operator's ``marque reconcile`` once, if the service
still says ``indeterminate``); the checker holds everything against the
effects table once all is settled.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from support.cli import cli_env
from support.pgcluster import PgCluster, create_database
from support.wait import wait_until

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._pg import pg_op, query, run_sql
from soak.world import MARQUE, Answer, PilotProcess, SoakWorld

SETUP = (
    "CREATE TABLE soak_slow (op text NOT NULL, phase text NOT NULL, seconds float8 NOT NULL, "
    "PRIMARY KEY (op, phase))",
    """CREATE FUNCTION soak_pause(name text, at text) RETURNS float8 LANGUAGE plpgsql AS $$
    DECLARE s float8;
    BEGIN
      SELECT seconds INTO s FROM soak_slow WHERE op = name AND phase = at;
      IF FOUND THEN PERFORM pg_sleep(s); END IF;
      RETURN 0;
    END $$""",
    """CREATE FUNCTION soak_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM soak_pause(NEW.op, 'commit'); RETURN NULL; END $$""",
    "CREATE CONSTRAINT TRIGGER soak_slow_commit AFTER INSERT ON effects "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_slow_commit()",
)
#: The effect insert, pausing for as long as ``soak_slow`` says.
EFFECT = "INSERT INTO effects (op, at) SELECT %s, soak_pause(%s, 'statement')"
KINDS = ("target_statement", "target_commit", "ledger_statement", "ledger_idle",
         "both_statement", "random")
DURABLE = "\nfsync = on\nfull_page_writes = on\nsynchronous_commit = on\n"


def _cluster() -> PgCluster:
    cluster = PgCluster(max_connections=100).init()
    with (cluster.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.write(DURABLE)
    return cluster.start()


def _sleeping(dsn: str, like: str) -> bool:
    [(count,)] = query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                            "AND wait_event = 'PgSleep' AND query LIKE %s", (like,))
    return int(count) == 1


class _Run:
    def __init__(self, ctx: RunContext, target: PgCluster, ledger: PgCluster) -> None:
        self.ctx, self.target, self.ledger = ctx, target, ledger
        self.target_dsn = create_database(target.dsn())[1]
        ledger_dsn = create_database(ledger.dsn())[1]
        self.world = SoakWorld(ctx.workdir / "world", target_dsn=self.target_dsn,
                               ledger_dsn=ledger_dsn)
        run_sql(self.target_dsn, *SETUP)
        self.pilot = PilotProcess(self.world)
        self.violations: list[str] = []
        self.figures: Counter[str] = Counter()

    def crash(self, which: str) -> None:
        for name in ("target", "ledger"):
            if which in (name, "both"):
                getattr(self, name).crash()
        self.ctx.history.record("fault", crashed=which)

    def restart(self) -> None:
        for cluster in (self.target, self.ledger):
            if not _up(cluster):
                cluster.start()

    def case(self, index: int) -> None:
        kind = KINDS[index % len(KINDS)]
        name = f"crash-{index}"
        op = pg_op(self.world, name, [(EFFECT, (name, name))])
        nonce = f"n-{index}"
        pause = {"target_statement": ("statement", 30.0), "both_statement": ("statement", 30.0),
                 "ledger_statement": ("statement", 1.0), "target_commit": ("commit", 30.0),
                 "random": ("commit", 0.05)}.get(kind)
        if pause is not None:
            run_sql(self.target_dsn, ("INSERT INTO soak_slow VALUES (%s, %s, %s)",
                                      (name, *pause)))
        if not self.pilot.alive:
            self.pilot = PilotProcess(self.world)
        url = self.pilot.url
        if kind == "ledger_idle":
            self.crash("ledger")
            first = invoke(self.ctx, self.world, url, op, nonce, kind=kind)
            if (first.status, first.code) != ("refused", "ledger_unavailable"):
                self.violations.append(f"{name}: with the ledger down, told {first.status} "
                                       f"({first.code})")
        else:
            answers: list[Answer] = []
            worker = threading.Thread(target=lambda: answers.append(invoke(
                self.ctx, self.world, url, op, nonce, kind=kind)))
            worker.start()
            which = self._when(kind, name, index)
            self.crash(which)
            worker.join(90)
            if not answers:
                self.violations.append(f"{name}: no answer within 90 s of the crash")
                return
            first = answers[0]
            self._expect_first(kind, name, first)
        self.figures[f"{kind}_first_{first.status}"] += 1
        self.restart()
        run_sql(self.target_dsn, ("DELETE FROM soak_slow WHERE op = %s", (name,)))
        self._settle_by_retrying(op, nonce, kind)

    def _when(self, kind: str, name: str, index: int) -> str:
        """Wait for the moment ``kind`` crashes at; which server(s) to crash."""
        if kind == "random":
            time.sleep(self.ctx.rng.uniform(0.0, 0.25))
            return self.ctx.rng.choice(("target", "ledger", "both"))
        like = "%COMMIT%" if kind == "target_commit" else "%soak_pause%"
        if not wait_until(lambda: _sleeping(self.target_dsn, like), step=0.01):
            self.violations.append(f"{name}: never saw the {kind} pause on the server")
        return kind.removesuffix("_statement").removesuffix("_commit")

    def _expect_first(self, kind: str, name: str, first: Answer) -> None:
        want = {"target_statement": {"aborted_not_applied"},
                "both_statement": {"aborted_not_applied"},
                "target_commit": {"indeterminate", "aborted_not_applied"},
                "ledger_statement": {"applied"}}.get(kind)
        if want is not None and first.status not in want:
            self.violations.append(f"{name} ({kind}): first told {first.status} "
                                   f"({first.code}), expected one of {sorted(want)}")
        if kind == "ledger_statement" and first.recorded is not False:
            self.violations.append(f"{name}: the ledger was down after COMMIT, yet the answer "
                                   f"says recorded {first.recorded}")

    def _settle_by_retrying(self, op: Any, nonce: str, kind: str) -> None:
        """The client asks again until it is told something settled (bounded)."""
        reconciled = False
        for round_ in range(6):
            if not self.pilot.alive:
                self.pilot = PilotProcess(self.world)
            again = invoke(self.ctx, self.world, self.pilot.url, op, nonce, retry=round_ + 1)
            if again.status == "applied" or again.code == "attempts_exhausted":
                self.figures[f"{kind}_settled_after_{round_ + 1}"] += 1
                return
            if again.status in ("indeterminate", "in_progress") and not reconciled:
                self._operator_reconciles()
                reconciled = True
                continue
            time.sleep(0.2)
        self.figures[f"{kind}_unsettled_in_case"] += 1

    def _operator_reconciles(self) -> None:
        """``marque reconcile --home`` in a process of its own, as an operator would."""
        done = subprocess.run([str(MARQUE), "reconcile", "--home", str(self.world.home),
                               "--json"], capture_output=True, text=True, timeout=120,
                              cwd=self.world.root, env=cli_env())
        self.ctx.history.record("note", reconcile=done.returncode, out=done.stdout[-2000:])
        self.figures["operator_reconciles"] += 1


def _up(cluster: PgCluster) -> bool:
    return (Path(cluster.data) / "postmaster.pid").exists()


@scenario(3, "pg_crash", quick=24, full=200, needs_pg=True)
def run(ctx: RunContext) -> ScenarioResult:
    """``count`` cases over the kinds in turn, each crash followed by restarts and retries."""
    target = _cluster()
    ledger = _cluster()
    try:
        state = _Run(ctx, target, ledger)
        try:
            for index in range(ctx.count):
                state.case(index)
        finally:
            state.restart()
            state.pilot.stop()
        return finish(ctx, state.world, ctx.count, figures=dict(state.figures),
                      extra_violations=state.violations)
    finally:
        target.destroy()
        ledger.destroy()
