"""An installation without the ``postgres`` extra, given a ``postgresql://`` DSN.

The CLI runs as a real process whose Python cannot import the PostgreSQL
driver: a ``sitecustomize`` on ``PYTHONPATH`` puts an import hook first on
``sys.meta_path`` that answers ``psycopg`` and ``psycopg_pool`` as a Python
without them would (``ModuleNotFoundError``). Marque's own code is untouched.
Every command that meets such a DSN says, in one line (one JSON object with
``--json``), that PostgreSQL support needs the extra — ``postgres_support_missing``,
exit 2 — and leaves nothing behind. ``init`` that fails for any reason removes
the home it made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_support import EXIT, World, run_cli

PG = "postgresql://marque:s3cret@127.0.0.1:1/nowhere"
ADVICE = "PostgreSQL support needs `pip install 'marque[postgres]'`"

_HOOK = '''
import sys


class _WithoutPostgres:
    """As if the postgres extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("psycopg", "psycopg_pool", "psycopg_binary"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _WithoutPostgres())
'''


@pytest.fixture(scope="module")
def no_postgres(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a CLI process that cannot import the PostgreSQL driver."""
    hooks = tmp_path_factory.mktemp("no-postgres")
    (hooks / "sitecustomize.py").write_text(_HOOK)
    env = {"PYTHONPATH": str(hooks)}
    probe = run_cli("pilot", "init", "--home", hooks / "probe", "--pilot-id", "p1",
                    "--ledger", PG, "--json", env=env)
    assert "psycopg" in probe.stdout + probe.stderr, probe  # the hook is in force
    return env


def refused(res: Any) -> dict[str, Any]:
    """The one JSON error of a command refused for want of the driver."""
    assert res.returncode == EXIT["usage"], res
    assert "Traceback" not in res.stderr, res.stderr
    error = res.json["error"]
    assert error["code"] == "postgres_support_missing", error
    assert error["message"].startswith(ADVICE), error
    assert error["detail"] == {"missing_module": "psycopg"}
    assert "s3cret" not in res.stdout + res.stderr
    return error


def test_pilot_init_says_what_to_install_and_makes_no_home(
        tmp_path: Path, no_postgres: dict[str, str]) -> None:
    home = tmp_path / "deep" / "pilot"
    refused(run_cli("pilot", "init", "--home", home, "--pilot-id", "p1", "--ledger", PG,
                    "--json", env=no_postgres))
    assert not (tmp_path / "deep").exists()

    human = run_cli("pilot", "init", "--home", home, "--pilot-id", "p1", "--ledger", PG,
                    env=no_postgres)
    assert human.returncode == EXIT["usage"], human
    assert human.stdout == ""
    [line] = human.stderr.splitlines()
    assert line.startswith(f"usage: postgres_support_missing — {ADVICE}"), line
    assert not (tmp_path / "deep").exists()


def test_harbour_init_says_what_to_install_and_makes_no_home(
        tmp_path: Path, no_postgres: dict[str, str]) -> None:
    home = tmp_path / "harbour"
    refused(run_cli("harbour", "init", "--home", home, "--store", PG, "--json",
                    env=no_postgres))
    assert not home.exists()


def test_a_postgres_target_is_refused_even_unchecked(
        world: World, no_postgres: dict[str, str]) -> None:
    before = json.loads((world.home / "pilot.json").read_text())
    for extra in ((), ("--no-check",)):
        refused(world.run("pilot", "target", "add", "--home", world.home, "pg", PG, *extra,
                          "--json", env=no_postgres))
    assert json.loads((world.home / "pilot.json").read_text()) == before


def test_a_home_holding_a_postgres_target_says_so_where_it_is_used(
        world: World, no_postgres: dict[str, str]) -> None:
    """A target added where the driver was (or by hand), the home then used where it is
    not: opening the Pilot says what to install instead of failing deep inside."""
    added = world.run("pilot", "target", "add", "--home", world.home, "pg", PG, "--no-check",
                      "--json")  # with the driver: stored, unchecked
    assert added.returncode == 0, added
    refused(world.run("reconcile", "--home", world.home, "--json", env=no_postgres))
    refused(world.exec(world.issue(["UPDATE accounts SET balance = 0 WHERE id = 1"]), "n-1",
                       env=no_postgres))
    assert world.balances()[1] == 100


@pytest.mark.parametrize("store", [PG, "sqlite:///{tmp}/nodir/store.sqlite3"])
def test_any_failed_harbour_init_removes_the_home_it_made(tmp_path: Path, store: str) -> None:
    """Whatever stops init (here with the driver: PostgreSQL refusing the connection, or a
    store directory that does not exist), the home it made — parents included — goes."""
    res = run_cli("harbour", "init", "--home", tmp_path / "a" / "b",
                  "--store", store.format(tmp=tmp_path), "--json")
    assert res.returncode in (2, 7), res
    assert res.json["error"]["code"] in ("harbour_unavailable", "input_invalid"), res
    assert not (tmp_path / "a").exists()
