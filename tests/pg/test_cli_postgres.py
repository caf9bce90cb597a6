"""The CLI end to end with a PostgreSQL ledger and a PostgreSQL target."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from support.pgcluster import create_database, drop_database

from marque.token import new_key, public_jwk

from .pgworld import build_world, one_json, run_cli

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = %s"


def test_cli_with_postgres_ledger_and_target(tmp_path: Path, pg_admin_dsn: str,
                                             pg_dsn: str) -> None:
    """`pilot init --ledger postgresql://…` makes a PostgreSQL ledger the CLI uses for exec."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100)")
    ledger_name, ledger_dsn = create_database(pg_admin_dsn)
    try:
        home = tmp_path / "pilot"
        issuer, holder = new_key(), new_key()
        for name, key in (("issuer", issuer), ("holder", holder)):
            (tmp_path / f"{name}.jwk").write_text(json.dumps(key))
            (tmp_path / f"{name}.pub.jwk").write_text(json.dumps(public_jwk(key)))

        init = run_cli("pilot", "init", "--home", home, "--pilot-id", "pg-pilot",
                       "--ledger", ledger_dsn, "--json")
        assert init.returncode == 0, init.stderr
        incarnation = one_json(init.stdout)["incarnation"]
        assert not (home / "ledger.sqlite3").exists()
        with psycopg.connect(ledger_dsn) as conn:
            row = conn.execute(
                "SELECT value FROM marque_ledger.meta WHERE key = 'incarnation'").fetchone()
        assert row == (incarnation,)
        again = run_cli("pilot", "init", "--home", home, "--pilot-id", "pg-pilot",
                        "--ledger", ledger_dsn, "--json")
        assert again.returncode == 2 and one_json(again.stdout)["error"]["code"] == "ledger_exists"

        trusted = run_cli("pilot", "trust", "--home", home, tmp_path / "issuer.pub.jwk")
        assert trusted.returncode == 0
        assert run_cli("pilot", "target", "add", "--home", home, "bank", pg_dsn).returncode == 0
        issued = run_cli("issue", "--issuer-key", tmp_path / "issuer.jwk", "--pilot-id", "pg-pilot",
                         "--incarnation", incarnation, "--target", "bank",
                         "--holder-key", tmp_path / "holder.pub.jwk", "--sql", DEBIT,
                         "--param", "[1]", "--executions", "1", "--max-rows", "1")
        assert issued.returncode == 0, issued.stderr
        marque = tmp_path / "change.marque"
        marque.write_text(issued.stdout)

        first = run_cli("exec", "--home", home, "--marque", marque,
                        "--key", tmp_path / "holder.jwk", "--nonce", "pay-1", "--json")
        again_exec = run_cli("exec", "--home", home, "--marque", marque,
                             "--key", tmp_path / "holder.jwk", "--nonce", "pay-1", "--json")
        other = run_cli("exec", "--home", home, "--marque", marque,
                        "--key", tmp_path / "holder.jwk", "--nonce", "pay-2", "--json")

        assert first.returncode == 0, first.stderr
        assert one_json(first.stdout)["status"] == "applied"
        assert again_exec.returncode == 0 and one_json(again_exec.stdout)["replayed"] is True
        assert other.returncode == 3
        assert one_json(other.stdout)["error"]["code"] == "budget_exhausted"
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone() == (90,)
        with psycopg.connect(ledger_dsn) as conn:
            claims = conn.execute("SELECT count(*) FROM marque_ledger.claims").fetchone()
        assert claims == (1,)
    finally:
        drop_database(pg_admin_dsn, ledger_name)


def test_a_durability_warning_is_a_json_line_under_json(tmp_path: Path, pg_admin_dsn: str,
                                                        pg_dsn: str) -> None:
    """`"durability": "warn"` on a ledger whose database commits asynchronously: `exec
    --json` runs, and its stderr stays JSON lines — the warning is one, with its code."""
    ledger_name, ledger_dsn = create_database(pg_admin_dsn)
    try:
        world = build_world(tmp_path, pg_dsn, ledger="postgres", ledger_dsn=ledger_dsn)
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{ledger_name}" SET synchronous_commit = off')
        config_path = world.home / "pilot.json"
        config = json.loads(config_path.read_text())
        config["durability"] = "warn"
        config_path.write_text(json.dumps(config))
        marque = tmp_path / "change.marque"
        marque.write_text(world.issue("UPDATE accounts SET balance = balance - 10 WHERE id = 1"))
        holder = tmp_path / "holder.jwk"
        holder.write_text(json.dumps(world.holder))

        ran = run_cli("exec", "--home", world.home, "--marque", marque, "--key", holder,
                      "--nonce", "pay-1", "--json")

        assert ran.returncode == 0, ran.stderr
        assert one_json(ran.stdout)["status"] == "applied"
        lines = [json.loads(line) for line in ran.stderr.splitlines() if line.strip()]
        warnings = [line for line in lines if line.get("event") == "warning"]
        assert [w["code"] for w in warnings] == ["ledger_not_durable"]
        assert "synchronous_commit = off" in warnings[0]["message"]
        assert {"claimed", "committed"} <= {line.get("event") for line in lines}
    finally:
        world.close()
        drop_database(pg_admin_dsn, ledger_name)
