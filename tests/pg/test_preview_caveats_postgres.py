"""Preview caveats on a real PostgreSQL target: sequences the preview advanced for good,
triggers by name, foreign tables, volatile and unknown functions, pg_notify, and DDL that
cannot run in a transaction (named, not run, never a failure)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from marque.target.postgres import PostgresTarget
from marque.token import Change, Statement


@pytest.fixture
def target(pg_dsn: str) -> Iterator[PostgresTarget]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100), (3, 100)")
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, item text)")
        conn.execute("CREATE TABLE tickets (id int GENERATED ALWAYS AS IDENTITY, what text)")
    target = PostgresTarget("bank", pg_dsn)
    try:
        yield target
    finally:
        target.close()


def _sql(target: PostgresTarget, sql: str) -> Any:
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description is not None else None


def _preview(target: PostgresTarget, *sql: str) -> list[dict[str, Any]]:
    return target.preview(Change(tuple(Statement(s) for s in sql)), mode="rollback",
                          sample_rows=5, statement_timeout_ms=5_000)


def _codes(statement: dict[str, Any]) -> list[str]:
    return [c["code"] for c in statement["preview_caveats"]]


def test_a_plain_update_has_no_caveat(target: PostgresTarget) -> None:
    """No trigger, no sequence, no function: nothing to warn about."""
    (statement,) = _preview(target, "UPDATE accounts SET balance = balance - 1")
    assert statement["rows"] == 3 and statement["preview_caveats"] == []


def test_an_insert_into_serial_and_identity_columns_advanced_their_sequences(
        target: PostgresTarget) -> None:
    """The preview's INSERTs took sequence values ROLLBACK does not give back: named."""
    orders, tickets, given = _preview(
        target, "INSERT INTO orders (item) VALUES ('a') RETURNING id",
        "INSERT INTO tickets (what) VALUES ('b')",
        "INSERT INTO orders (id, item) VALUES (50, 'c')")
    assert _codes(orders) == ["sequence_advanced"]
    assert orders["preview_caveats"][0]["detail"]["sequences"] == [
        {"sequence": "public.orders_id_seq", "through": "default", "table": "public.orders",
         "column": "id"}]
    assert tickets["preview_caveats"][0]["detail"]["sequences"][0]["sequence"] == \
        "public.tickets_id_seq"
    assert given["preview_caveats"] == []  # an explicit id takes nothing from the sequence
    # What the caveat warns of is real: the sequence stayed advanced after the ROLLBACK.
    assert _sql(target, "SELECT last_value, is_called FROM orders_id_seq") == [(1, True)]
    assert _sql(target, "SELECT count(*) FROM orders") == [(0,)]


def test_nextval_and_pg_notify_are_named(target: PostgresTarget) -> None:
    """Calling nextval advances a sequence; pg_notify sends only on commit."""
    (statement,) = _preview(
        target, "SELECT nextval('orders_id_seq'), pg_notify('jobs', 'go')")
    assert _codes(statement) == ["sequence_advanced", "notify"]
    assert statement["preview_caveats"][1]["detail"] == {"channels": ["jobs"]}


def test_triggers_on_the_written_table_are_listed_even_when_created_by_the_change(
        target: PostgresTarget) -> None:
    """The catalog is read in the preview's transaction: a trigger an earlier statement
    created is listed; internal (foreign-key) triggers are not."""
    result = _preview(
        target,
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN RETURN NEW; END$$",
        "CREATE TRIGGER accounts_audit AFTER UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION audit()",
        "CREATE TABLE refs (account int REFERENCES accounts (id))",
        "UPDATE accounts SET balance = 0 WHERE id = 1")
    update = result[3]
    assert _codes(update) == ["triggers"]
    assert update["preview_caveats"][0]["detail"] == {
        "tables": [{"table": "public.accounts", "triggers": ["accounts_audit"]}]}
    assert _sql(target, "SELECT count(*) FROM pg_trigger WHERE tgname = 'accounts_audit'") \
        == [(0,)]


def test_volatile_user_and_unknown_functions(target: PostgresTarget) -> None:
    """random() and a VOLATILE user function are volatile; a STABLE one is not; a function
    the catalog does not know is unknown (only reachable as text the server resolves)."""
    _sql(target, "CREATE FUNCTION bump() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT 1'")
    _sql(target, "CREATE FUNCTION calm() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1'")
    (statement,) = _preview(
        target, "UPDATE accounts SET balance = bump() + calm() + (random() * 0)::int "
                "WHERE id = coalesce(1, 2)")
    assert _codes(statement) == ["volatile_function"]
    assert statement["preview_caveats"][0]["detail"] == {"functions": ["bump()", "random()"]}
    # A function in another schema the statement names but the catalog lacks is unknown;
    # the statement then fails to run, so it is shown through the classifier directly.
    from marque.preview_caveats import statement_caveats
    from marque.target.caveat_catalog import PostgresCatalog
    with psycopg.connect(target.dsn) as conn:
        found, _ = statement_caveats("SELECT ops.nowhere(1)", "postgres", PostgresCatalog(conn))
    assert [c["code"] for c in found] == ["unknown_function"]
    assert found[0]["detail"] == {"functions": ["ops.nowhere()"]}


def test_a_procedure_call_and_a_do_block_are_volatile_code(target: PostgresTarget) -> None:
    """CALL runs a procedure (volatile in the catalog) and DO runs a block: both named."""
    _sql(target, "CREATE PROCEDURE ops_touch() LANGUAGE sql AS $$SELECT 1$$")
    call, block = _preview(target, "CALL ops_touch()",
                           "DO $$BEGIN PERFORM 1; END$$")
    assert call["preview_caveats"][0]["code"] == "volatile_function"
    assert call["preview_caveats"][0]["detail"] == {"functions": ["ops_touch()"]}
    assert block["preview_caveats"][0]["detail"] == {"functions": ["DO block"]}


def test_non_transactional_ddl_is_not_run_and_never_fails_the_preview(
        target: PostgresTarget) -> None:
    """CREATE INDEX CONCURRENTLY cannot run in a transaction: the preview names it, runs the
    rest, and reports no rows for it rather than failing."""
    index, update = _preview(target, "CREATE INDEX CONCURRENTLY accounts_balance "
                                     "ON accounts (balance)",
                             "UPDATE accounts SET balance = 1 WHERE id = 2")
    assert _codes(index) == ["non_transactional_ddl"]
    assert index["rows"] is None and index["sample"] is None
    assert index["preview_caveats"][0]["detail"] == {
        "statement_kind": "CREATE INDEX CONCURRENTLY", "previewed": False}
    assert update["rows"] == 1
    assert _sql(target, "SELECT count(*) FROM pg_indexes WHERE indexname = "
                        "'accounts_balance'") == [(0,)]


def test_alter_type_add_value_is_transactional_on_this_server(target: PostgresTarget) -> None:
    """PostgreSQL 12 and later run ALTER TYPE … ADD VALUE in a transaction: no caveat."""
    _sql(target, "CREATE TYPE mood AS ENUM ('ok')")
    (statement,) = _preview(target, "ALTER TYPE mood ADD VALUE 'sad'")
    assert statement["preview_caveats"] == []
    assert _sql(target, "SELECT count(*) FROM pg_enum") == [(1,)]


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    """A directory the server's own user may read (pytest's tmp_path is private)."""
    path = Path(tempfile.mkdtemp(prefix="marque-fdw-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_foreign_table_is_named_with_its_server(target: PostgresTarget,
                                                  readable_dir: Path) -> None:
    """A statement reading a foreign table (file_fdw) names the table and its server."""
    available = _sql(target, "SELECT count(*) FROM pg_available_extensions "
                             "WHERE name = 'file_fdw'")
    if available != [(1,)]:
        pytest.skip("file_fdw is not among this server's extensions: no foreign table to make")
    data = readable_dir / "rates.csv"
    data.write_text("1,5\n2,7\n")
    data.chmod(0o644)
    _sql(target, "CREATE EXTENSION file_fdw")
    _sql(target, "CREATE SERVER files FOREIGN DATA WRAPPER file_fdw")
    _sql(target, "CREATE FOREIGN TABLE rates (id int, rate int) SERVER files "
                 f"OPTIONS (filename '{data}', format 'csv')")
    (statement,) = _preview(
        target, "UPDATE accounts SET balance = r.rate FROM rates r WHERE r.id = accounts.id")
    assert statement["rows"] == 2
    assert _codes(statement) == ["foreign_table"]
    assert statement["preview_caveats"][0]["detail"] == {
        "tables": [{"table": "public.rates", "server": "files"}]}
