"""`marque pilot target row-key` through the real CLI: a declared row key is checked against
the target (SQLite and PostgreSQL), written to pilot.json only when it holds, shown, withdrawn,
and the Pilot its home opens previews a table without a key of its own by it."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import psycopg
from e2e_support import EXIT, Result, World

from marque.pilot import open_pilot
from marque.pilot.preview import run_preview
from marque.token import Change, Statement
from marque.token.service_tokens import PreviewGrant, issue_preview_token


def error_of(res: Result) -> dict[str, Any]:
    body = res.json
    assert isinstance(body.get("error"), dict), body
    return body["error"]


def _keyless(world: World) -> None:
    with sqlite3.connect(world.bank) as conn:
        conn.execute("CREATE TABLE lines (ref TEXT, n INT, amount INT)")
        conn.execute("INSERT INTO lines VALUES ('a', 1, 10), ('a', 2, 20)")
    conn.close()


def _pilot_json(world: World) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((world.home / "pilot.json").read_text())
    return body


def test_a_row_key_is_checked_written_shown_and_withdrawn(world: World) -> None:
    """Declared on a keyless table: stored as the target spells it; on a table with its own
    key: stored but said to be unused; bad names, missing tables and columns: row_key_invalid
    (exit 2) and pilot.json unchanged."""
    _keyless(world)
    row_key = ("pilot", "target", "row-key", "--home", world.home)
    declared = world.run(*row_key, "bank", "lines", "REF, n", "--json")
    assert declared.returncode == 0, declared
    assert declared.json == {"target": "bank", "table": "lines", "columns": ["ref", "n"],
                             "checked": True, "own_key": None, "own_key_source": None,
                             "used": True}
    assert _pilot_json(world)["row_keys"] == {"bank": {"lines": ["ref", "n"]}}
    own = world.run(*row_key, "bank", "accounts", "balance")
    assert own.returncode == 0, own
    assert "key of its own, id (primary key)" in own.stdout

    before = (world.home / "pilot.json").read_bytes()
    for args, rule in (
            (("bank", "nowhere", "id"), "table_missing"),
            (("bank", "lines", "ref,nope"), "column_missing"),
            (("bank", "lines;drop", "ref"), "table_name"),
            (("bank", "lines", "ref,ref"), "columns"),
            (("bank", "lines", "re f"), "column_name")):
        refused = world.run(*row_key, *args, "--json")
        assert refused.returncode == EXIT["usage"], refused
        assert (error_of(refused)["code"], error_of(refused)["detail"]["rule"]) == (
            "row_key_invalid", rule), refused.json
    assert "its columns: ref, n, amount" in error_of(
        world.run(*row_key, "bank", "lines", "ref,nope", "--json"))["message"]
    unknown = world.run(*row_key, "nobank", "lines", "ref", "--json")
    assert error_of(unknown)["code"] == "not_found"
    neither = world.run(*row_key, "bank", "lines", "--json")
    assert error_of(neither)["code"] == "input_invalid"
    assert (world.home / "pilot.json").read_bytes() == before

    unchecked = world.run(*row_key, "bank", "later", "id", "--no-check", "--json")
    assert unchecked.json["checked"] is False and unchecked.json["columns"] == ["id"]
    shown = world.run("pilot", "show", "--home", world.home, "--json")
    assert shown.json["row_keys"] == {"bank": {"accounts": ["balance"], "later": ["id"],
                                               "lines": ["ref", "n"]}}
    assert "row key of lines: ref, n (declared)" in world.run(
        "pilot", "show", "--home", world.home).stdout
    for table in ("accounts", "later", "lines"):
        removed = world.run(*row_key, "bank", table, "--remove", "--json")
        assert removed.returncode == 0 and removed.json["columns"] is None, removed
    assert "row_keys" not in _pilot_json(world)
    again = world.run(*row_key, "bank", "lines", "--remove", "--json")
    assert error_of(again)["code"] == "not_found"


def test_a_hand_edited_row_key_is_config_invalid(world: World) -> None:
    """pilot.json is read strictly: a row key for an unknown target or with an odd column
    stops the Pilot before anything runs."""
    for bad in ({"ghost": {"lines": ["ref"]}}, {"bank": {"lines": []}},
                {"bank": {"lines": ["ref; drop"]}}):
        config = _pilot_json(world)
        config["row_keys"] = bad
        (world.home / "pilot.json").write_text(json.dumps(config))
        res = world.run("pilot", "show", "--home", world.home, "--json")
        assert res.returncode == EXIT["usage"], res
        assert error_of(res)["code"] == "config_invalid" and "row_keys" in \
            error_of(res)["message"]


def test_the_pilot_previews_a_keyless_table_by_its_declared_key(world: World) -> None:
    """Declared with the CLI, used by the Pilot the home opens; removing the target drops
    its row keys and preview mode, so pilot.json still loads."""
    _keyless(world)
    assert world.run("pilot", "target", "row-key", "--home", world.home, "bank", "lines",
                     "ref,n").returncode == 0
    pilot = open_pilot(world.home)
    try:
        token = issue_preview_token(json.loads(world.issuer_key.read_text()), PreviewGrant(
            pilot_id=world.pilot_id, incarnation=world.incarnation, target="bank",
            change=Change((Statement("UPDATE lines SET amount = 0 WHERE n = 2"),))))
        preview = run_preview(pilot, token)
    finally:
        pilot.close()
    images = preview["statements"][0]["row_images"]
    assert (images["key"], images["key_source"], images["rows"][0]["key"]) == (
        ["ref", "n"], "declared", {"ref": "a", "n": 2})
    config = _pilot_json(world)
    config["previews"] = {"bank": "explain"}  # a preview mode goes with its target too
    (world.home / "pilot.json").write_text(json.dumps(config))
    removed = world.run("pilot", "target", "remove", "--home", world.home, "bank", "--json")
    assert removed.returncode == 0, removed
    assert "row_keys" not in _pilot_json(world) and "previews" not in _pilot_json(world)


def test_a_postgresql_row_key_is_checked_against_its_catalog(world: World, pg_dsn: str) -> None:
    """On PostgreSQL: a schema-qualified table, a column whose case differs from the
    catalog's stored as the catalog spells it, a table that is not there refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA books")
        conn.execute('CREATE TABLE books.lines (ref text, "Line" int, amount int)')
    assert world.run("pilot", "target", "add", "--home", world.home, "pg",
                     pg_dsn).returncode == 0
    row_key = ("pilot", "target", "row-key", "--home", world.home, "pg")
    declared = world.run(*row_key, "books.lines", "ref,line", "--json")
    assert declared.returncode == 0, declared
    assert (declared.json["columns"], declared.json["used"]) == (["ref", "Line"], True)
    missing = world.run(*row_key, "lines", "ref", "--json")  # not on the search_path
    assert (error_of(missing)["code"], error_of(missing)["detail"]["rule"]) == (
        "row_key_invalid", "table_missing")
