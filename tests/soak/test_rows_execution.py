"""The fast form of the campaign's execution rows: each scenario, a few cases, no violation.

`make soak` runs the same scenario functions at their counts; here they run
with just enough cases to pass every crash point once, so CI catches a
regression without paying for the soak.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.run import load_scenarios, run_one

ROWS = load_scenarios()
#: Cases per row in the fast form: sigkill, each of the 12 crash points once and two
#: random-moment kills; duplicate_nonce, two races of sixteen submitters in each form (in
#: process, through the service); reconcilers_race, each of its two variants twice;
#: combined, four stateful examples.
FAST = {"sigkill": 14, "duplicate_nonce": 4, "reconcilers_race": 4, "combined": 4}


@pytest.mark.parametrize("name", sorted(FAST))
def test_a_row_of_the_matrix_holds_every_invariant(name: str, tmp_path: Path,
                                                   pg_admin_dsn: str) -> None:
    """The row runs its cases and the checker finds no violation."""
    row = ROWS[name]
    result = run_one(row, count=FAST[name], seed=1, out=tmp_path, full=False,
                     pg_admin_dsn=pg_admin_dsn if row.needs_pg else None)
    assert result.violations == [], result.to_dict()
    # Hypothesis may run an example or two beyond max_examples; never fewer.
    assert result.cases >= FAST[name]
