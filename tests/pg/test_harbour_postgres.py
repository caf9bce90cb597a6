"""`marque harbour …` with its store in PostgreSQL, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from .pgworld import one_json, run_cli


def test_a_harbourmaster_on_a_postgres_store(tmp_path: Path, pg_dsn: str) -> None:
    """init --store postgresql://…: nothing of the store in the home; principals, routing and
    the logbook live in the database and verify; a second init on that store is refused."""
    home = tmp_path / "harbour"
    made = run_cli("harbour", "init", "--home", home, "--store", pg_dsn, "--json")
    assert made.returncode == 0, made.stderr
    body = one_json(made.stdout)
    assert not (home / "harbour.sqlite3").exists()
    assert json.loads((home / "harbour.json").read_text())["store"] == pg_dsn

    added = run_cli("harbour", "principal", "add", "--home", home, "carol", "--role",
                    "approver", "--json")
    assert added.returncode == 0, added.stderr
    token = one_json(added.stdout)["token"]
    with psycopg.connect(pg_dsn) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM marque_harbour.principals")}
        dump = json.dumps(conn.execute("SELECT * FROM marque_harbour.principals").fetchall(),
                          default=str)
    assert names == {"admin", "carol"}
    assert token not in dump and body["admin_token"] not in dump

    head = tmp_path / "head.json"
    assert run_cli("logbook", "head", "--home", home, "--out", head).returncode == 0
    verified = run_cli("logbook", "verify", "--home", home, "--head", head, "--json")
    assert verified.returncode == 0, verified.stderr
    assert one_json(verified.stdout)["entries"] >= 3

    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE marque_harbour.logbook SET actor = 'someone-else' WHERE seq = 2")
    broken = run_cli("logbook", "verify", "--home", home, "--json")
    assert broken.returncode == 8
    assert one_json(broken.stdout)["break"]["seq"] == 2

    again = run_cli("harbour", "init", "--home", tmp_path / "other", "--store", pg_dsn,
                    "--json")
    assert again.returncode == 2, again.stderr
    assert one_json(again.stdout)["error"]["code"] == "conflict"
