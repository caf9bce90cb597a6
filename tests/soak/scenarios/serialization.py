"""Row 4: serialization failures and deadlocks (40001, 40P01), real and trigger-made.

Every case ends with the failed marque retried under the same nonce, as a new
attempt while attempts remain. The kinds, in turn:

* ``update_conflict`` (REPEATABLE READ or SERIALIZABLE): marque B updates a row
  and waits, in the database, until someone waits for its lock; marque A, whose
  snapshot was taken by its stamp insert, then blocks on that row; B commits and
  A gets 40001 "could not serialize access due to concurrent update";
* ``read_committed``: the same race under READ COMMITTED, the control: both apply;
* ``deadlock``: A and B update two rows in opposite order, meeting in between
  (a rendezvous on a sequence, which no rollback undoes); PostgreSQL's deadlock
  detector (``deadlock_timeout`` 100 ms here) aborts exactly one with 40P01;
* ``write_skew`` (SERIALIZABLE): A and B both read two rows, meet, then each
  writes a different one; SSI lets only one commit, the other gets 40001 (at its
  UPDATE or at COMMIT);
* ``trigger``: a BEFORE INSERT trigger on ``effects`` RAISEs 40001 or 40P01
  for the first attempt(s) (it reads the attempt off the stamp its own
  transaction inserted), or a DEFERRABLE INITIALLY DEFERRED constraint trigger
  does so at COMMIT. One such case in five fails on both its attempts, and a
  third call is ``attempts_exhausted``, with nothing applied.

Each must end ``aborted_not_applied`` with ``serialization_failure`` and the
SQLSTATE the server sent (checked in the ledger), and the effect row, the
contended rows and every answer must agree.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from support.wait import wait_until

from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._pg import (
    backends,
    check_first_attempts,
    effect,
    fresh_database,
    pg_op,
    query,
    run_sql,
)
from soak.world import Answer, Op, PilotProcess, SoakWorld

SETUP = (
    "CREATE TABLE contended (id int PRIMARY KEY, v int NOT NULL)",
    "CREATE TABLE soak_faults (op text PRIMARY KEY, marque_id text NOT NULL, "
    "sqlstate text NOT NULL, phase text NOT NULL, upto int NOT NULL)",
    # A fault a trigger makes: for the operations listed, while the attempt (read off the
    # stamp this very transaction inserted) is at most ``upto``.
    """CREATE FUNCTION soak_fault() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE f soak_faults; a int;
    BEGIN
      SELECT * INTO f FROM soak_faults WHERE op = NEW.op AND phase = TG_ARGV[0];
      IF FOUND THEN
        SELECT attempt INTO a FROM marque.stamps WHERE marque_id = f.marque_id;
        IF a IS NULL OR a <= f.upto THEN
          RAISE EXCEPTION 'soak: a % made by a trigger (%)', f.sqlstate, TG_ARGV[0]
            USING ERRCODE = f.sqlstate;
        END IF;
      END IF;
      RETURN NEW;
    END $$""",
    "CREATE TRIGGER soak_fault_row BEFORE INSERT ON effects FOR EACH ROW "
    "EXECUTE FUNCTION soak_fault('row')",
    "CREATE CONSTRAINT TRIGGER soak_fault_commit AFTER INSERT ON effects "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION soak_fault('commit')",
    # Waits (bounded) until some session waits for a lock: the other marque is blocked.
    """CREATE FUNCTION soak_wait_waiter(timeout float8) RETURNS int LANGUAGE plpgsql AS $$
    DECLARE deadline timestamptz := clock_timestamp() + timeout * interval '1 second'; n int;
    BEGIN
      LOOP
        SELECT count(*) INTO n FROM pg_locks WHERE NOT granted;
        EXIT WHEN n > 0 OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.002);
      END LOOP;
      RETURN n;
    END $$""",
    # A rendezvous of ``want`` sessions on a sequence (nextval survives any rollback).
    """CREATE FUNCTION soak_meet(seq text, want int, timeout float8) RETURNS int
    LANGUAGE plpgsql AS $$
    DECLARE deadline timestamptz := clock_timestamp() + timeout * interval '1 second'; n int;
    BEGIN
      PERFORM nextval(seq);
      LOOP
        EXECUTE format('SELECT last_value FROM %I', seq) INTO n;
        EXIT WHEN n >= want OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.002);
      END LOOP;
      RETURN n;
    END $$""",
)
UPDATE = "UPDATE contended SET v = v + 1 WHERE id = %s"
KINDS = ("update_conflict", "deadlock", "write_skew", "trigger", "trigger", "read_committed")
NOT_APPLIED = "aborted_not_applied"
CODE = "serialization_failure"


class _Case:
    """One case's operations, answers and what it expects."""

    def __init__(self, ctx: RunContext, world: SoakWorld, url: str, dsn: str, index: int
                 ) -> None:
        self.ctx, self.world, self.url, self.dsn, self.index = ctx, world, url, dsn, index
        self.rows = (2 * index, 2 * index + 1)
        self.violations: list[str] = []
        #: marque_id → attempt 1's expected (status, code, sqlstate)
        self.expected: dict[str, tuple[str, str, str]] = {}

    def op(self, suffix: str, statements: list[tuple[str, tuple[Any, ...]]],
           **options: Any) -> Op:
        name = f"ser-{self.index}-{suffix}"
        return pg_op(self.world, name, [*statements, effect(name)], **options)

    def post(self, op: Op, **extra: Any) -> Answer:
        return invoke(self.ctx, self.world, self.url, op, f"n-{self.index}", **extra)

    def together(self, first: tuple[Op, dict[str, Any]], second: tuple[Op, dict[str, Any]],
                 *, after: Any = None) -> tuple[Answer, Answer]:
        """Post both at once (``second`` only once ``after()`` holds, if given)."""
        answers: dict[int, Answer] = {}

        def post(slot: int, op: Op, extra: dict[str, Any]) -> None:
            answers[slot] = self.post(op, **extra)

        one = threading.Thread(target=post, args=(0, *first))
        one.start()
        if after is not None and not wait_until(after, timeout=10.0, step=0.01):
            self.violations.append(f"case {self.index}: the first marque never got in place")
        two = threading.Thread(target=post, args=(1, *second))
        two.start()
        one.join(60)
        two.join(60)
        return answers[0], answers[1]

    def settle_failed(self, op: Op, answer: Answer, sqlstate: str, why: str) -> None:
        """``answer`` must be the serialization failure; then retry it to applied."""
        if (answer.status, answer.code) != (NOT_APPLIED, CODE):
            self.violations.append(f"{op.op} ({why}): told {answer.status} ({answer.code}), "
                                   f"expected {NOT_APPLIED} ({CODE}, {sqlstate})")
            return
        self.expected[op.marque_id] = (NOT_APPLIED, CODE, sqlstate)
        again = self.post(op, retry=True)
        if (again.status, again.attempt) != ("applied", 2):
            self.violations.append(f"{op.op} ({why}): the retry was told {again.status} "
                                   f"attempt {again.attempt} ({again.code})")

    def value(self, row: int) -> int:
        [(value,)] = query(self.dsn, "SELECT v FROM contended WHERE id = %s", (row,))
        return int(value)

    def expect_values(self, want: tuple[int, int]) -> None:
        found = (self.value(self.rows[0]), self.value(self.rows[1]))
        if found != want:
            self.violations.append(f"case {self.index}: contended rows hold {found}, "
                                   f"expected {want}")

    # -- the kinds -------------------------------------------------------------------

    def update_conflict(self, isolation: str) -> str:
        row = self.rows[0]
        holder = self.op("b", [(UPDATE, (row,)), ("SELECT soak_wait_waiter(5)", ())])
        loser = self.op("a", [(UPDATE, (row,))], isolation=isolation)
        b, a = self.together(
            (holder, {"role": "holder"}), (loser, {"role": "blocked", "isolation": isolation}),
            after=lambda: backends(self.dsn, "%soak_wait_waiter%") == 1)
        if b.status != "applied":
            self.violations.append(f"{holder.op}: the lock holder was told {b.status} "
                                   f"({b.code})")
        if isolation == "read_committed":
            if a.status != "applied":
                self.violations.append(f"{loser.op} (read committed): told {a.status} "
                                       f"({a.code}); it only had to wait")
        else:
            self.settle_failed(loser, a, "40001", f"concurrent update, {isolation}")
        self.expect_values((2, 0))
        return isolation

    def deadlock(self) -> str:
        x, y = self.rows
        seq = f"soak_meet_{self.index}"
        run_sql(self.dsn, f"CREATE SEQUENCE {seq}")
        meet = (f"SELECT soak_meet('{seq}', 2, 5)", ())
        a = self.op("a", [(UPDATE, (x,)), meet, (UPDATE, (y,))])
        b = self.op("b", [(UPDATE, (y,)), meet, (UPDATE, (x,))])
        answers = self.together((a, {"order": "x,y"}), (b, {"order": "y,x"}))
        self._one_of_two((a, b), answers, "40P01", "deadlock")
        self.expect_values((2, 2))
        return "deadlock"

    def write_skew(self) -> str:
        x, y = self.rows
        seq = f"soak_meet_{self.index}"
        run_sql(self.dsn, f"CREATE SEQUENCE {seq}")
        read = ("SELECT sum(v) FROM contended WHERE id IN (%s, %s)", (x, y))
        meet = (f"SELECT soak_meet('{seq}', 2, 5)", ())
        a = self.op("a", [read, meet, (UPDATE, (x,))], isolation="serializable")
        b = self.op("b", [read, meet, (UPDATE, (y,))], isolation="serializable")
        answers = self.together((a, {"writes": "x"}), (b, {"writes": "y"}))
        self._one_of_two((a, b), answers, "40001", "write skew")
        self.expect_values((1, 1))
        return "write_skew"

    def _one_of_two(self, ops: tuple[Op, Op], answers: tuple[Answer, Answer], sqlstate: str,
                    why: str) -> None:
        statuses = sorted(answer.status or "" for answer in answers)
        if statuses != [NOT_APPLIED, "applied"]:
            self.violations.append(f"case {self.index} ({why}): told {statuses}, expected "
                                   "one applied and one aborted_not_applied")
        for op, answer in zip(ops, answers, strict=True):
            if answer.status != "applied":
                self.settle_failed(op, answer, sqlstate, why)

    def trigger(self) -> str:
        sqlstate = self.ctx.rng.choice(("40001", "40P01"))
        phase = self.ctx.rng.choice(("row", "commit"))
        twice = self.ctx.rng.random() < 0.2
        op = self.op("t", [(UPDATE, (self.rows[0],))] if self.ctx.rng.random() < 0.5 else [],
                     attempts=2 if twice else 3)
        run_sql(self.dsn, ("INSERT INTO soak_faults VALUES (%s, %s, %s, %s, %s)",
                           (op.op, op.marque_id, sqlstate, phase, 2 if twice else 1)))
        first = self.post(op, sqlstate=sqlstate, phase=phase)
        kind = f"trigger_{phase}_{sqlstate}"
        if not twice:
            self.settle_failed(op, first, sqlstate, kind)
            return kind
        if (first.status, first.code) != (NOT_APPLIED, CODE):
            self.violations.append(f"{op.op} ({kind}): told {first.status} ({first.code})")
        self.expected[op.marque_id] = (NOT_APPLIED, CODE, sqlstate)
        second = self.post(op, retry=True)
        third = self.post(op, retry=True)
        if (second.status, second.attempt, second.code) != (NOT_APPLIED, 2, CODE) or (
                third.status, third.code) != ("refused", "attempts_exhausted"):
            self.violations.append(
                f"{op.op} ({kind}, both attempts fail): told {second.status} attempt "
                f"{second.attempt} ({second.code}), then {third.status} ({third.code})")
        return kind + "_exhausted"


@scenario(4, "serialization", quick=120, full=1000, needs_pg=True)
def run(ctx: RunContext) -> ScenarioResult:
    """``count`` cases over the kinds in turn."""
    assert ctx.pg_admin_dsn is not None
    dsn = fresh_database(ctx.pg_admin_dsn)
    world = SoakWorld(ctx.workdir / "world", target_dsn=dsn)
    [(dbname,)] = query(dsn, "SELECT current_database()")
    run_sql(dsn, *SETUP, f'ALTER DATABASE "{dbname}" SET deadlock_timeout = 100',
            ("INSERT INTO contended SELECT g, 0 FROM generate_series(0, %s) g",
             (2 * ctx.count + 1,)))
    violations: list[str] = []
    expected: dict[str, tuple[str, str, str]] = {}
    kinds: Counter[str] = Counter()
    pilot = PilotProcess(world)
    try:
        for index in range(ctx.count):
            case = _Case(ctx, world, pilot.url, dsn, index)
            kind = KINDS[index % len(KINDS)]
            if kind == "update_conflict":
                done = case.update_conflict(ctx.rng.choice(("repeatable_read",
                                                            "serializable")))
            elif kind == "read_committed":
                done = case.update_conflict("read_committed")
            else:
                done = getattr(case, kind)()
            kinds[done] += 1
            violations += case.violations
            expected.update(case.expected)
    finally:
        pilot.stop()
    check_first_attempts(world, expected, violations)
    return finish(ctx, world, ctx.count, figures={"kinds": dict(kinds),
                                                  "serialization_failures": len(expected)},
                  extra_violations=violations)
