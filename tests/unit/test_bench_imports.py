"""Every module in bench/ imports: a rename in src/ cannot silently break a benchmark.

(A rename once broke ``bench/floor.py`` and nothing noticed until a bench run.) The
benchmarks never run here: each module's work sits under ``if __name__ == "__main__"``
or in functions, so importing it measures nothing. The modules are imported in one
child interpreter with ``bench/`` first on its path, as ``python bench/run.py`` finds
its neighbours, so their own ``sys.path`` edits and top-level names (``harness``,
``scenarios``, ``cluster``) stay out of the test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(path.stem for path in BENCH.glob("*.py"))

#: Imports each module named on the command line; prints {module: traceback} of failures.
PROBE = """\
import importlib, json, sys, traceback
sys.path.insert(0, sys.argv[1])
failed = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc()
print(json.dumps(failed))
"""


def import_failures(directory: Path, modules: list[str]) -> dict[str, str]:
    """The modules of ``directory`` that fail to import, each with its traceback."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(directory), *modules],
                          capture_output=True, text=True, timeout=120, cwd=directory,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    failed: dict[str, str] = json.loads(proc.stdout.splitlines()[-1])
    return failed


@pytest.fixture(scope="module")
def bench_failures() -> dict[str, str]:
    return import_failures(BENCH, MODULES)


def test_the_bench_modules_are_found() -> None:
    """The list is bench/'s modules, the entry point and the floor bench among them."""
    assert {"run", "floor", "harness", "scenarios"} <= set(MODULES), MODULES


@pytest.mark.parametrize("name", MODULES)
def test_a_bench_module_imports(name: str, bench_failures: dict[str, str]) -> None:
    """The module imports against today's src/ (its names still exist)."""
    assert name not in bench_failures, bench_failures[name]


def test_a_module_whose_import_is_broken_is_reported(tmp_path: Path) -> None:
    """The probe is not vacuous: a module importing a name src/ no longer has is caught."""
    (tmp_path / "fine.py").write_text("import marque.token\n")
    (tmp_path / "renamed.py").write_text("from marque.target.base import NoSuchName\n")
    failed = import_failures(tmp_path, ["fine", "renamed"])
    assert set(failed) == {"renamed"}
    assert "NoSuchName" in failed["renamed"]
