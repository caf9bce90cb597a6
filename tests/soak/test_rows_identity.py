"""The fast form of row 17 (the target name re-pointed) for make test, and proof its checks fail.

The row runs four cases — each kill once (``after_commit``, ``after_statement``,
a SIGKILL into the statement, none), with no rebinding, a plain one and one
with ``--pin-unsettled`` — and the checker must find nothing. One more test
writes by hand what the bug this row attacks would leave (a tombstone in a
database of another identity, and the nonce's effect applied there again) and
the row's checks must report both.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path

from marque.pilot import open_pilot
from soak.run import load_scenarios, run_one
from soak.scenario import History, RunContext
from soak.scenarios import repointed

ROWS = load_scenarios()
FAST = 4


def test_row_17_a_repointed_target_never_applies_a_nonce_twice(tmp_path: Path) -> None:
    """Kill, re-point, reconcile, retry, rebind, point back: no violation, every kill fired."""
    result = run_one(ROWS["target_repointed"], count=FAST, seed=1, out=tmp_path, full=False,
                     pg_admin_dsn=None)
    assert result.violations == [], result.to_dict()
    assert result.cases == FAST
    fired = result.figures["fired"]
    assert fired["after_commit"] == fired["after_statement"] == fired["none"] == 1, fired
    assert sum(n for kind, n in fired.items() if kind.startswith("sigkill_")) == 1, fired
    assert result.figures["replaced_refusals"] >= 1, result.figures


def test_row_17_reports_a_tombstone_in_another_database_and_a_second_apply(
        tmp_path: Path) -> None:
    """A tombstone for an attempt sent to A, found in B (another identity), is a violation;
    so is the nonce's effect row in B beside A's."""
    ctx = RunContext("target_repointed", 1, 1, tmp_path, History(tmp_path / "history.jsonl"))
    try:
        case = repointed.Case(ctx, 0, Counter())
        world = case.world
        op = world.op("twice", executions=2)
        fields = {"op": op.op, "marque_id": op.marque_id, "nonce": "n-1", "executions": 2,
                  "case": case.label}
        ctx.history.record("invoke", **fields)
        pilot = open_pilot(world.home)
        try:
            assert pilot.execute(op.token, world.proof(op, "n-1"), "n-1").status \
                == "applied"
        finally:
            pilot.close()
        ctx.history.record("ok", **fields, status="applied", attempt=1)
        case.sent_to[("n-1", 1)] = repointed.identity(case.a)
        shutil.copy(case.pristine, case.b)
        case.point(case.b, "test")
        open_pilot(world.home).close()  # B's identity (and stamp table) made at start

        # What the bug would leave: a tombstone for n-1 in B, and the change applied there.
        conn = sqlite3.connect(case.b)
        with conn:
            conn.execute("ATTACH DATABASE ? AS a", (str(case.a),))
            conn.execute("INSERT INTO marque_stamps SELECT * FROM a.marque_stamps")
            conn.execute("UPDATE marque_stamps SET kind = 'tombstone'")
            conn.execute("INSERT INTO effects (op, at) VALUES ('twice', 0)")
        conn.close()
        case.check_stamps("test")
        assert any("a tombstone stamp in second.db" in v and "which was sent to" in v
                   for v in case.violations), case.violations
        case.point(case.a, "back")
        found, _, _ = repointed.check_case(ctx, case)
        assert any("2 effect rows but 1 nonce(s) settled applied" in v for v in found), found
    finally:
        ctx.history.close()
