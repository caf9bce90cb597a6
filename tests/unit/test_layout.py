"""The layout holds (README's Layout section): no import circle
between modules, no import between the two wings, nothing below the wings reaching
up into them, and no function in src/ over 60 lines — as `scripts/look` reads them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LOOK = Path(__file__).resolve().parents[2] / "scripts" / "look"


def test_scripts_look_finds_no_circle_crossing_upward_arrow_or_long_function() -> None:
    done = subprocess.run([sys.executable, str(LOOK)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().splitlines()[-1] == (
        "0 circle(s)/crossing(s)/upward arrow(s), 0 function(s) over 60 lines"), done.stdout
