"""Statement classification for routing (DESIGN §11.3): conservative, never raising."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.errors import InvalidInput
from marque.harbour.routing import OPERATIONS, Access, classify

BOTH = ("postgres", "sqlite")


@pytest.fixture(autouse=True)
def _quiet_sqlglot() -> None:
    # sqlglot warns when it falls back to an opaque command; that is expected here.
    logging.getLogger("sqlglot").setLevel(logging.ERROR)


def _pairs(sql: str, dialect: str) -> set[tuple[str, str]]:
    return {(a.operation, a.resource) for a in classify(sql, dialect)}


def _schema(dialect: str) -> str:
    return "public" if dialect == "postgres" else "main"


# -- reads: only a plain query ---------------------------------------------------------


@pytest.mark.parametrize("dialect", BOTH)
@pytest.mark.parametrize(
    "sql",
    ["SELECT f()", "SELECT nextval('s')", "SELECT delete_all()", "SELECT 1",
     "SELECT s.f(1)"],
)
def test_function_calls_are_reads_on_any_resource(sql: str, dialect: str) -> None:
    """A function's body is invisible: it is a read (the database enforces read-only) on '*'."""
    assert _pairs(sql, dialect) == {("read", "*")}


@pytest.mark.parametrize("dialect", BOTH)
def test_plain_select_reads_every_table_it_names(dialect: str) -> None:
    """Joins, subqueries and set operations of plain selects are reads of each table."""
    sql = ("SELECT a.x FROM a JOIN s.b ON a.id = b.id WHERE a.y IN (SELECT y FROM c) "
           "UNION SELECT x FROM d")
    schema = _schema(dialect)
    assert _pairs(sql, dialect) == {
        ("read", f"{schema}.a"), ("read", "s.b"), ("read", f"{schema}.c"), ("read", f"{schema}.d")
    }


@pytest.mark.parametrize("dialect", BOTH)
def test_a_query_calling_an_unknown_function_also_reads_any_resource(dialect: str) -> None:
    """Named tables plus '*' when a user function is called alongside them."""
    assert _pairs("SELECT my_fn(x) FROM t", dialect) == {
        ("read", f"{_schema(dialect)}.t"), ("read", "*")
    }


@pytest.mark.parametrize("dialect", BOTH)
def test_known_builtins_do_not_widen_a_read(dialect: str) -> None:
    """lower(), count() are built-ins sqlglot knows: no '*' tuple."""
    assert _pairs("SELECT lower(x), count(*) FROM t", dialect) == {
        ("read", f"{_schema(dialect)}.t")
    }


# -- queries that are not reads -------------------------------------------------------


@pytest.mark.parametrize("dialect", BOTH)
def test_data_modifying_cte_is_a_write(dialect: str) -> None:
    """WITH d AS (DELETE … RETURNING *) SELECT … FROM d writes t; d is no resource."""
    pairs = _pairs("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", dialect)
    assert pairs == {("write", f"{_schema(dialect)}.t")}


@pytest.mark.parametrize("dialect", BOTH)
def test_select_into_is_a_write(dialect: str) -> None:
    """SELECT … INTO t2 writes t2 and reads t."""
    schema = _schema(dialect)
    assert _pairs("SELECT * INTO t2 FROM t", dialect) == {
        ("write", f"{schema}.t2"), ("read", f"{schema}.t")
    }


@pytest.mark.parametrize("dialect", BOTH)
@pytest.mark.parametrize(
    "clause", ["FOR UPDATE", "FOR SHARE", "FOR NO KEY UPDATE SKIP LOCKED", "FOR KEY SHARE",
               "FOR UPDATE OF t NOWAIT"],
)
def test_locking_clauses_are_writes(clause: str, dialect: str) -> None:
    """A locking clause makes the locked tables write tuples, never reads."""
    pairs = _pairs(f"SELECT * FROM t WHERE x = 1 {clause}", dialect)
    assert pairs == {("write", f"{_schema(dialect)}.t")}


def test_a_lock_inside_a_subquery_is_a_write() -> None:
    """The lock is found wherever the select sits."""
    assert _pairs("SELECT (SELECT 1 FROM t FOR UPDATE)", "postgres") == {("write", "public.t")}


def test_substring_for_is_not_a_lock() -> None:
    """The token backstop does not mistake substring(… FOR n) for a locking clause."""
    assert _pairs("SELECT substring(x FROM 1 FOR 2) FROM t", "postgres") == {("read", "public.t")}


# -- other ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "dialect"),
    [
        ("COPY t FROM PROGRAM 'x'", "postgres"),
        ("COPY t TO STDOUT", "postgres"),
        ("COPY (SELECT * FROM t) TO '/tmp/x'", "postgres"),
        ("CALL p()", "postgres"),
        ("DO $$ BEGIN DELETE FROM t; END $$", "postgres"),
        ("SET search_path = evil", "postgres"),
        ("EXPLAIN ANALYZE DELETE FROM t", "postgres"),
        ("LOCK TABLE t", "postgres"),
        ("GRANT SELECT ON t TO bob", "postgres"),
        ("BEGIN", "postgres"),
        ("COMMIT", "postgres"),
        ("PRAGMA query_only = 0", "sqlite"),
        ("PRAGMA writable_schema = 1", "sqlite"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "sqlite"),
        ("VACUUM", "sqlite"),
        ("SET x = 1", "sqlite"),
    ],
)
def test_commands_are_other_on_any_resource(sql: str, dialect: str) -> None:
    """COPY, CALL, DO, PRAGMA, SET, EXPLAIN, … are 'other' on '*'."""
    assert classify(sql, dialect) == [Access("other", "*")]


@pytest.mark.parametrize("dialect", BOTH)
@pytest.mark.parametrize(
    "sql", ["", "   ", "-- only a comment", "garbage words here", "SELECT 'unterminated",
            "SELEC * FROM t", "DELETE FROM", "\x00\x01", "SELECT (((("],
)
def test_unclassifiable_sql_is_other(sql: str, dialect: str) -> None:
    """Text sqlglot cannot parse (or only half understands) is other on '*', never an error."""
    assert classify(sql, dialect) == [Access("other", "*")]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60), st.sampled_from(BOTH))
def test_classify_never_raises(sql: str, dialect: str) -> None:
    """Any text at all yields at least one well-formed tuple."""
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    accesses = classify(sql, dialect)
    assert accesses
    assert all(a.operation in OPERATIONS and a.resource for a in accesses)


def test_unknown_dialect_is_a_usage_error() -> None:
    """Only postgres and sqlite are classified."""
    with pytest.raises(InvalidInput):
        classify("SELECT 1", "mysql")


# -- writes and ddl ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", BOTH)
@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("INSERT INTO a (x) VALUES (1)", {("write", "{s}.a")}),
        ("INSERT INTO a SELECT * FROM b", {("write", "{s}.a"), ("read", "{s}.b")}),
        ("UPDATE a SET x = (SELECT max(x) FROM a)", {("write", "{s}.a"), ("read", "{s}.a")}),
        ("DELETE FROM a WHERE x IN (SELECT y FROM b)", {("write", "{s}.a"), ("read", "{s}.b")}),
        ("INSERT INTO a (x) VALUES (gen_id())", {("write", "{s}.a"), ("write", "*")}),
        ("CREATE TABLE n (x int)", {("ddl", "{s}.n")}),
        ("CREATE TABLE n AS SELECT * FROM b", {("ddl", "{s}.n"), ("read", "{s}.b")}),
        ("CREATE INDEX i ON a (x)", {("ddl", "{s}.a")}),
        ("ALTER TABLE a ADD COLUMN y int", {("ddl", "{s}.a")}),
        ("DROP TABLE a", {("ddl", "{s}.a")}),
        ("CREATE VIEW v AS SELECT * FROM b", {("ddl", "{s}.v"), ("read", "{s}.b")}),
        ("DROP INDEX i", {("ddl", "*")}),
    ],
)
def test_writes_and_ddl(sql: str, expected: set[tuple[str, str]], dialect: str) -> None:
    """DML writes its target and reads its sources; DDL acts on its table or on '*'."""
    schema = _schema(dialect)
    assert _pairs(sql, dialect) == {(op, r.format(s=schema)) for op, r in expected}


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("UPDATE a SET x = 1 FROM b WHERE a.id = b.id", {("write", "public.a"),
                                                         ("read", "public.b")}),
        ("DELETE FROM a USING b WHERE a.id = b.id", {("write", "public.a"),
                                                     ("read", "public.b")}),
        ("MERGE INTO a USING b ON a.id = b.id WHEN MATCHED THEN DELETE",
         {("write", "public.a"), ("read", "public.b")}),
        ("INSERT INTO a (x) VALUES (1) ON CONFLICT (x) DO UPDATE SET x = 2",
         {("write", "public.a")}),
        ("TRUNCATE a, s.b", {("ddl", "public.a"), ("ddl", "s.b")}),
        ("DROP TABLE a, b", {("ddl", "public.a"), ("ddl", "public.b")}),
        ("ALTER TABLE a RENAME TO c", {("ddl", "public.a"), ("ddl", "public.c")}),
        ("CREATE FUNCTION f() RETURNS int AS 'select 1' LANGUAGE sql", {("ddl", "*")}),
        ("CREATE SEQUENCE q", {("ddl", "*")}),
        ("DROP FUNCTION f", {("ddl", "*")}),
    ],
)
def test_postgres_only_statements(sql: str, expected: set[tuple[str, str]]) -> None:
    """PostgreSQL's UPDATE … FROM, DELETE … USING, MERGE, TRUNCATE (ddl), functions."""
    assert _pairs(sql, "postgres") == expected


def test_sqlite_insert_or_replace_is_a_write() -> None:
    """SQLite's INSERT OR REPLACE writes its table."""
    assert _pairs("INSERT OR REPLACE INTO t VALUES (1)", "sqlite") == {("write", "main.t")}


# -- resource names --------------------------------------------------------------------------


def test_postgres_names_fold_unquoted_and_keep_quoted() -> None:
    """public. for bare names, lower-case unless quoted, the database qualifier dropped."""
    sql = 'SELECT * FROM Orders JOIN "Users" ON true JOIN S."Mixed" ON true JOIN db.x.y ON true'
    assert _pairs(sql, "postgres") == {
        ("read", "public.orders"), ("read", "public.Users"), ("read", "s.Mixed"), ("read", "x.y")
    }


def test_sqlite_names_are_case_insensitive() -> None:
    """main. for bare names; every SQLite name lower-cased, quoted or not."""
    assert _pairs('SELECT * FROM Main.T JOIN "Users" ON 1 JOIN aux.Z ON 1', "sqlite") == {
        ("read", "main.t"), ("read", "main.users"), ("read", "aux.z")
    }


def test_cte_names_are_not_resources_but_shadowed_tables_are() -> None:
    """A CTE reference is no table; a CTE's own body still reads the real table it names."""
    assert _pairs("WITH x AS (SELECT * FROM t) SELECT * FROM x", "postgres") == {
        ("read", "public.t")
    }
    assert _pairs("WITH users AS (SELECT * FROM users) SELECT * FROM users", "postgres") == {
        ("read", "public.users")
    }
    # A non-recursive CTE does not see a later sibling: b here is the table.
    assert _pairs("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a",
                  "postgres") == {("read", "public.b")}
    # A qualified name is never a CTE.
    assert _pairs("WITH t AS (SELECT 1) SELECT * FROM public.t", "postgres") == {
        ("read", "public.t")
    }


def test_multi_statement_text_is_the_union() -> None:
    """Text with several statements yields the tuples of all of them."""
    assert _pairs("SELECT * FROM a; DELETE FROM b", "postgres") == {
        ("read", "public.a"), ("write", "public.b")
    }
