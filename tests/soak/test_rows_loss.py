"""The fast form of rows 9–11 (ledger loss, clock skew, Harbourmaster down) for make test.

Each row runs with a few cases — every variant of row 9 once or more, row
10's boundary grid once over (it is fixed) with a crash jump at each of its points, row 11
through at least one Pilot kill at the outbox step — and the checker must
find nothing. One more test shows the row-specific target check is not
vacuous: a second effect row for an operation is caught.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from soak.run import load_scenarios, run_one
from soak.scenarios._loss import target_checks
from soak.world import SoakWorld

ROWS = load_scenarios()
#: Cases per row in the fast form (row 10: the six edge offsets of its grid, and seven
#: jumps, so that a crash jump dies at each of its five points: the last of them,
#: after_outcome_recorded, is reached only once the settler records behind the answer).
FAST = {"ledger_loss": 6, "clock_skew": 61, "harbour_down": 36}


#: Row 10 runs the Pilot under libfaketime.
NEEDS = {"clock_skew": [pytest.mark.faketime]}


@pytest.mark.parametrize("name", [pytest.param(name, marks=NEEDS.get(name, []))
                                  for name in sorted(FAST)])
def test_a_loss_row_holds_every_invariant(name: str, tmp_path: Path) -> None:
    """The row runs its cases and the checker finds no violation."""
    result = run_one(ROWS[name], count=FAST[name], seed=1, out=tmp_path, full=False,
                     pg_admin_dsn=None)
    assert result.violations == [], result.to_dict()
    assert result.cases >= FAST[name]
    if name == "harbour_down":
        assert result.figures["pilot_kills"] >= 1, result.figures


def test_the_target_check_catches_a_second_effect_row(tmp_path: Path) -> None:
    """A nonce told applied whose operation holds two effect rows is a violation."""
    world = SoakWorld(tmp_path / "w")
    op = world.op("twice")
    history = [{"type": "invoke", "op": op.op, "marque_id": op.marque_id, "nonce": "n-1",
                "executions": 1},
               {"type": "ok", "op": op.op, "marque_id": op.marque_id, "nonce": "n-1",
                "executions": 1}]
    conn = sqlite3.connect(tmp_path / "w" / "target.db")
    with conn:
        conn.executemany("INSERT INTO effects (op, at) VALUES (?, 0)", [("twice",), ("twice",)])
    conn.close()
    found, _ = target_checks(history, world)
    assert any("2 effect rows for a budget of 1" in v for v in found), found
    assert any("told applied, no applied stamp" in v for v in found), found
