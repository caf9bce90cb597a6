"""Preview caveats (DESIGN §10) on a real Pilot home over a real SQLite bank: what a
rolled-back preview cannot show is named per statement, inside the preview_cid."""

from __future__ import annotations

import sqlite3
from typing import Any

from marque.cid import cid
from marque.pilot.preview import run_preview
from marque.preview_caveats import CAVEAT_CODES, caveat_codes, shape, statement_caveats
from marque.target.caveat_catalog import SqliteCatalog
from marque.token import Change, Statement
from marque.token.service_tokens import PreviewGrant, issue_preview_token

from .conftest import Env


def _preview(env: Env, *sql: str) -> dict[str, Any]:
    token = issue_preview_token(env.issuer, PreviewGrant(
        change=Change(tuple(Statement(s) for s in sql)),
        pilot_id=env.pilot.pilot_id, incarnation=env.pilot.incarnation, target="bank"))
    return run_preview(env.pilot, token)


def _bank(env: Env, *sql: str) -> None:
    conn = sqlite3.connect(env.bank_path, isolation_level=None)
    try:
        for statement in sql:
            conn.execute(statement)
    finally:
        conn.close()


def _codes(statement: dict[str, Any]) -> list[str]:
    return [c["code"] for c in statement["preview_caveats"]]


def test_a_plain_update_has_no_caveat(env: Env) -> None:
    """An UPDATE of a table without triggers, calling nothing, previews with no caveat."""
    result = _preview(env, "UPDATE accounts SET balance = balance - 1 WHERE id = 1")
    assert result["statements"][0]["preview_caveats"] == []
    assert result["caveats"] == []


def test_triggers_on_a_written_table_are_listed_by_name(env: Env) -> None:
    """A write to a table with triggers names each trigger; a read of it names none."""
    _bank(env, "CREATE TABLE audit (account INTEGER, at TEXT)",
          "CREATE TRIGGER accounts_audit AFTER UPDATE ON accounts "
          "BEGIN INSERT INTO audit VALUES (new.id, 'x'); END",
          "CREATE TRIGGER accounts_guard BEFORE DELETE ON accounts BEGIN SELECT 1; END")
    result = _preview(env, "UPDATE accounts SET balance = 0 WHERE id = 1",
                      "SELECT id FROM accounts")
    update, select = result["statements"]
    (found,) = update["preview_caveats"]
    assert found["code"] == "triggers"
    assert found["detail"] == {"tables": [{"table": "main.accounts",
                                           "triggers": ["accounts_audit", "accounts_guard"]}]}
    assert "accounts_audit" in found["message"]
    assert select["preview_caveats"] == []
    assert result["caveats"] == ["triggers"]
    assert update["rows"] == 1  # the trigger's audit row is not in the count: hence the caveat
    assert env.pilot.logbook is not None
    (logged,) = env.pilot.logbook.entries("preview.run")
    assert logged["body"]["caveats"] == ["triggers"]


def test_volatile_functions_are_named_deterministic_ones_are_not(env: Env) -> None:
    """random(), changes() and datetime('now') are volatile; abs() and a fixed date are not."""
    result = _preview(env, "UPDATE accounts SET balance = abs(random()) % 10 WHERE id = 1",
                      "SELECT changes(), datetime('now'), date('2020-01-01'), abs(-1), "
                      "CURRENT_TIMESTAMP")
    first, second = result["statements"]
    assert first["preview_caveats"][0]["detail"] == {"functions": ["random()"]}
    assert second["preview_caveats"][0]["detail"] == {
        "functions": ["changes()", "datetime()", "current_timestamp"]}
    assert result["caveats"] == ["volatile_function"]


def test_autoincrement_is_rolled_back_on_sqlite_so_no_sequence_caveat(env: Env) -> None:
    """SQLite keeps AUTOINCREMENT's counter in an ordinary table: the preview leaves no trace."""
    _bank(env, "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)",
          "INSERT INTO notes (body) VALUES ('a')")
    result = _preview(env, "INSERT INTO notes (body) VALUES ('b') RETURNING id")
    assert result["statements"][0]["sample"]["rows"] == [[2]]
    assert result["statements"][0]["preview_caveats"] == []
    conn = sqlite3.connect(env.bank_path)
    try:
        assert conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'notes'"
                            ).fetchone() == (1,)
    finally:
        conn.close()


def test_caveats_are_inside_the_preview_cid(env: Env) -> None:
    """Approvers approve what they saw: changing a caveat changes the preview's CID."""
    _bank(env, "CREATE TRIGGER t1 AFTER UPDATE ON accounts BEGIN SELECT 1; END")
    result = _preview(env, "UPDATE accounts SET balance = 1")
    assert result["preview_cid"] == cid(result, exclude="preview_cid")
    edited = {**result, "statements": [{**result["statements"][0], "preview_caveats": []}]}
    assert cid(edited, exclude="preview_cid") != result["preview_cid"]


def test_vacuum_is_not_previewed_but_named() -> None:
    """SQLite's VACUUM cannot run in a transaction: a caveat, and the statement is not run."""
    conn = sqlite3.connect(":memory:")
    try:
        found, previewable = statement_caveats("VACUUM", "sqlite", SqliteCatalog(conn, None))
    finally:
        conn.close()
    assert previewable is False
    assert [c["code"] for c in found] == ["non_transactional_ddl"]
    assert found[0]["detail"] == {"statement_kind": "VACUUM", "previewed": False}


def test_postgres_statements_are_classified_from_their_text() -> None:
    """The text alone names non-transactional DDL, nextval/setval and pg_notify."""
    cases = {
        "CREATE INDEX CONCURRENTLY i ON t (a)": "CREATE INDEX CONCURRENTLY",
        "create unique index /* x */ concurrently i on t (a)": "CREATE INDEX CONCURRENTLY",
        "DROP INDEX CONCURRENTLY i": "DROP INDEX CONCURRENTLY",
        "REINDEX TABLE CONCURRENTLY t": "REINDEX CONCURRENTLY",
        "REINDEX DATABASE d": "REINDEX DATABASE",
        "CREATE DATABASE d": "CREATE DATABASE",
        "DROP DATABASE d": "DROP DATABASE",
        "ALTER SYSTEM SET work_mem = '1MB'": "ALTER SYSTEM",
        "CLUSTER": "CLUSTER without a table",
        "CREATE TABLESPACE s LOCATION '/x'": "CREATE TABLESPACE",
        "VACUUM t": "VACUUM",
    }
    for sql, kind in cases.items():
        found, previewable = statement_caveats(sql, "postgres", None)
        assert (previewable, found[0]["detail"]["statement_kind"]) == (False, kind), sql
    for sql in ("CLUSTER t USING i", "CREATE INDEX i ON t (a)", "SELECT 'CREATE DATABASE x'"):
        assert shape(sql, "postgres").non_transactional is None, sql
    found, previewable = statement_caveats(
        "SELECT nextval('public.orders_id_seq'), setval('s', 5), pg_notify('jobs', 'x')",
        "postgres", None)
    assert previewable is True
    assert [c["code"] for c in found] == ["sequence_advanced", "notify"]
    assert found[0]["detail"]["sequences"] == [
        {"sequence": "public.orders_id_seq", "through": "nextval"},
        {"sequence": "s", "through": "setval"}]
    assert found[1]["detail"] == {"channels": ["jobs"]}


def test_sql_that_cannot_be_read_is_unanalysed_and_still_previewable() -> None:
    """Text sqlglot cannot parse, or an opaque command nothing recognises, is named as
    unanalysed (never as free of caveats); the statement still runs."""
    found, previewable = statement_caveats("THIS IS NOT SQL ((", "sqlite", None)
    assert ([c["code"] for c in found], previewable) == (["unanalysed"], True)
    found, _ = statement_caveats("CREATE EXTENSION file_fdw", "postgres", None)
    assert [c["code"] for c in found] == ["unanalysed"]
    for plain in ("CLUSTER t USING i", "REINDEX TABLE t", "ALTER TYPE m RENAME TO n",
                  "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$SELECT 1$$"):
        assert statement_caveats(plain, "postgres", None)[0] == [], plain


def test_caveat_codes_of_a_preview_are_distinct_and_closed() -> None:
    """caveat_codes lists each code once, and only what statement entries carry."""
    preview = {"statements": [{"preview_caveats": [{"code": "triggers"}]},
                              {"preview_caveats": [{"code": "notify"}, {"code": "triggers"}]},
                              {"sql": "x"}]}
    assert caveat_codes(preview) == ["triggers", "notify"]
    assert caveat_codes({"version": "actql-effect-preview/0.1"}) == []
    assert set(caveat_codes(preview)) <= set(CAVEAT_CODES)


def test_an_explain_preview_names_caveats_too(env: Env) -> None:
    """In explain mode nothing runs, yet the catalog still tells of the table's triggers."""
    _bank(env, "CREATE TRIGGER t1 AFTER UPDATE ON accounts BEGIN SELECT 1; END")
    token = issue_preview_token(env.issuer, PreviewGrant(
        change=Change((Statement("UPDATE accounts SET balance = 1"),)),
        pilot_id=env.pilot.pilot_id, incarnation=env.pilot.incarnation, target="bank"))
    result = run_preview(env.pilot, token, modes={"bank": "explain"})
    assert result["mode"] == "explain"
    assert result["caveats"] == ["triggers"]
    assert result["statements"][0]["preview_caveats"][0]["detail"]["tables"][0][
        "triggers"] == ["t1"]
