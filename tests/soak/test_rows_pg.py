"""The fast form of the campaign's PostgreSQL rows (2–6): each scenario, a few cases, no
violation.

`make soak` runs the same scenario functions at their counts; here each runs
with just enough cases to pass every mode or kind once (row 2: the three cuts;
row 3: the six crash kinds; row 4: the six conflict kinds; rows 5 and 6: their
variants), so CI catches a regression without paying for the soak.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.run import load_scenarios, run_one

ROWS = load_scenarios()
#: Cases per row in the fast form.
FAST = {"commit_cut": 6, "pg_crash": 6, "serialization": 12, "statement_timeout": 6,
        "stale_owner": 4}


@pytest.mark.parametrize("name", sorted(FAST))
def test_a_postgres_row_of_the_matrix_holds_every_invariant(name: str, tmp_path: Path,
                                                            pg_admin_dsn: str) -> None:
    """The row runs its cases against real PostgreSQL servers and the checker finds no
    violation."""
    row = ROWS[name]
    result = run_one(row, count=FAST[name], seed=1, out=tmp_path, full=False,
                     pg_admin_dsn=pg_admin_dsn)
    assert result.violations == [], result.to_dict()
    assert result.cases == FAST[name]
