"""`tests/soak/run.py` as `make soak` runs it: from the repository root, with its default ``--out``.

The rows' Pilots run with their world's directory as theirs, so a default
``--out`` left relative (``soak-results/<time>``) named a home that was not
there for them and every row died with ``ledger_missing``. This runs one
cheap row the way a fresh clone's ``make soak`` does, and removes what it made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "soak-results"


def test_a_row_run_with_the_default_out_holds() -> None:
    """Exit 0, and a results.json under soak-results/ with the row's cases and no violation."""
    existed = RESULTS.exists()
    before = set(RESULTS.iterdir()) if existed else set()
    try:
        run = subprocess.run(
            [sys.executable, "tests/soak/run.py", "--only", "proofs", "--count", "12",
             "--seed", "1"],
            cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        made = sorted(set(RESULTS.iterdir()) - before) if RESULTS.exists() else []
        assert run.returncode == 0, run.stdout + run.stderr
        assert len(made) == 1, made
        results = json.loads((made[0] / "results.json").read_text())
        [row] = results["rows"]
        assert (row["name"], row["cases"], row["violations"]) == ("proofs", 12, []), row
    finally:
        for path in set(RESULTS.iterdir()) - before if RESULTS.exists() else ():
            shutil.rmtree(path)
        if not existed and RESULTS.exists():
            RESULTS.rmdir()
