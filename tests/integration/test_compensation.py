"""The undo SQL derived from row images, run on real SQLite and PostgreSQL databases.

Each case previews a change with the real target (its row images), applies the
change, derives the undo (:func:`marque.target.compensation.compensate`), and
runs the undo's statements in one transaction with the engine's own driver:
every statement touches exactly its one row and the table is back to what it
held — typed values (JSON, arrays, bytes, long numerics) byte for byte. A value
changed since makes its fence miss — an undo that refuses, never one that
writes something else.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from marque.errors import UndoUnavailable
from marque.target.compensation import compensate
from marque.target.postgres import PostgresTarget
from marque.target.sqlite import SqliteTarget, provide_unhex
from marque.token import Change, Statement


class Engine:
    """One real database, its Marque target, and a way to run SQL on it directly."""

    def __init__(self, dialect: str, target: Any, connect: Any) -> None:
        self.dialect = dialect
        self.target = target
        self._connect = connect

    def run(self, *sql: str) -> None:
        conn = self._connect()
        try:
            for one in sql:
                conn.execute(one)
            conn.commit()
        finally:
            conn.close()

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            return [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2")]
        finally:
            conn.close()

    def preview(self, *sql: str) -> dict[str, Any]:
        statements = self.target.preview(Change(tuple(Statement(s) for s in sql)),
                                         mode="rollback", sample_rows=5,
                                         statement_timeout_ms=5_000)
        return {"mode": "rollback", "statements": statements}

    def apply(self, statements: tuple[Statement, ...]) -> list[int]:
        """Run ``statements`` in one transaction; each one's row count (committed)."""
        conn = self._connect()
        counts = []
        try:
            for statement in statements:
                cur = conn.execute(statement.sql, statement.params)
                counts.append(len(cur.fetchall()) if cur.description else cur.rowcount)
            conn.commit()
        finally:
            conn.close()
        return counts


def _sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    provide_unhex(conn)  # as the Pilot's own connections have it (SQLite before 3.41)
    return conn


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        path = tmp_path / "db.sqlite3"
        sqlite3.connect(path).close()
        yield Engine("sqlite", SqliteTarget("db", str(path)), lambda: _sqlite(path))
        return
    dsn = request.getfixturevalue("pg_dsn")
    target = PostgresTarget("db", dsn)
    try:
        yield Engine("postgres", target, lambda: psycopg.connect(dsn))
    finally:
        target.close()


def _round_trip(engine: Engine, table: str, *change: str) -> Any:
    before = engine.rows(table)
    preview = engine.preview(*change)
    engine.run(*change)
    assert engine.rows(table) != before
    undo = compensate(preview, engine.dialect)
    # The undo's own rolled-back preview sees every fence hold, one row each.
    previewed = engine.target.preview(Change(undo.statements), mode="rollback",
                                      sample_rows=5, statement_timeout_ms=5_000)
    assert [s["rows"] for s in previewed] == [1] * len(undo.statements)
    assert engine.apply(undo.statements) == [1] * len(undo.statements)
    assert engine.rows(table) == before
    return undo


TYPED = {
    "sqlite": ("id INTEGER PRIMARY KEY, n REAL, big INTEGER, t TEXT, z TEXT",
               "(1, 1.25, 9007199254740993, 'a''b', NULL), (2, -0.5, 3, '', 'x')"),
    "postgres": ("id int PRIMARY KEY, n numeric(10,2), big bigint, t text, z timestamptz, "
                 "d date, f double precision, ok boolean",
                 "(1, 1.25, 9007199254740993, 'a''b', NULL, '2026-01-02', 0.1, true), "
                 "(2, -0.50, 3, '', '2026-12-04 18:00:00.123456+00', NULL, -2.5, NULL)"),
}


def test_updated_rows_of_every_common_type_are_restored(engine: Engine) -> None:
    """Numbers, a key past 2**53, quotes, empty text, NULLs, dates, times, booleans: each
    updated row gets its exact before-values back, fenced on its exact after-values."""
    columns, values = TYPED[engine.dialect]
    engine.run(f"CREATE TABLE typed ({columns})", f"INSERT INTO typed VALUES {values}")
    assignments = ("n = n + 1, big = big - 1, t = 'changed', z = NULL" +
                   (", d = DATE '2030-01-01', f = f * 2, ok = NOT ok"
                    if engine.dialect == "postgres" else ""))
    undo = _round_trip(engine, "typed", f"UPDATE typed SET {assignments}")
    assert [r.op for r in undo.rows] == ["restore", "restore"]
    assert [r.key for r in undo.rows] == [{"id": 2}, {"id": 1}]  # reverse key order


def test_deleted_and_inserted_rows_and_a_composite_key(engine: Engine) -> None:
    """A delete is inserted again (every column), an insert is deleted, by a two-column key;
    two statements over one row are walked back through both."""
    engine.run("CREATE TABLE h (acct INT, sym TEXT, qty INT, note TEXT, "
               "PRIMARY KEY (sym, acct))",
               "INSERT INTO h VALUES (1, 'X', 5, NULL), (1, 'Y', 6, 'y'), (2, 'X', 7, NULL)")
    undo = _round_trip(engine, "h", "DELETE FROM h WHERE sym = 'Y'",
                       "INSERT INTO h (acct, sym, qty, note) VALUES (3, 'Z', 1, NULL)",
                       "UPDATE h SET qty = qty + 1 WHERE acct = 1",
                       "UPDATE h SET qty = qty * 10 WHERE acct = 1")
    assert [(r.statement, r.op) for r in undo.rows] == [
        (3, "restore"), (2, "restore"), (1, "remove"), (0, "reinsert")]
    assert undo.rows[-1].key == {"sym": "Y", "acct": 1}


def test_a_row_changed_since_makes_its_fence_miss(engine: Engine) -> None:
    """Another writer changed row 2's untouched column after the change: the undo's
    statement for row 2 touches no row (no overwrite), row 1's still touches its own."""
    engine.run("CREATE TABLE a (id INT PRIMARY KEY, v INT, note TEXT)",
               "INSERT INTO a VALUES (1, 1, NULL), (2, 2, NULL)")
    preview = engine.preview("UPDATE a SET v = 0")
    engine.run("UPDATE a SET v = 0", "UPDATE a SET note = 'later' WHERE id = 2")
    undo = compensate(preview, engine.dialect)
    assert [r.key for r in undo.rows] == [{"id": 2}, {"id": 1}]
    assert engine.apply(undo.statements) == [0, 1]
    assert engine.rows("a") == [(1, 1, None), (2, 0, "later")]


def test_a_key_taken_again_makes_a_reinsert_touch_nothing(engine: Engine) -> None:
    """A deleted row whose key someone used again is not inserted over it."""
    engine.run("CREATE TABLE k (id INT PRIMARY KEY, v INT)", "INSERT INTO k VALUES (1, 1)")
    preview = engine.preview("DELETE FROM k")
    engine.run("DELETE FROM k", "INSERT INTO k VALUES (1, 99)")
    assert engine.apply(compensate(preview, engine.dialect).statements) == [0]
    assert engine.rows("k") == [(1, 99)]


#: Tables of typed values: (columns, rows to insert with the driver, a change of every
#: typed column). PostgreSQL's: jsonb (one a double carries, one it does not, a top-level
#: JSON null), json keeping its spacing and a repeated key, int[] and text[] with NULLs,
#: bytea, a 40-digit numeric, a timestamptz, an interval of months.
TYPED_VALUES = {
    "postgres": (
        "id int PRIMARY KEY, doc jsonb, raw json, ints int[], tags text[], blob bytea, "
        "amount numeric(40,20), at timestamptz, span interval, priced jsonb",
        [(1, '{"a": 1, "b": [true, null, "x"], "n": 1.5}', '{ "b":1,  "a":2, "a":3 }',
          "{1,NULL,3}", '{"a b","c,d",NULL,""}', b"\x00\xff\x10",
          "12345678901234567890.12345678901234567890", "2026-12-04 18:00:00.123456+00",
          "1 mon 2 days 03:04:05", '{"p": 10.50, "big": 12345678901234567890}'),
         (2, "null", "[]", "{}", "{{a,b},{c,d}}", b"", "-0.00000000000000000001", None,
          None, None)],
        "doc = '{\"changed\": true}', raw = '{}', ints = ARRAY[9], tags = ARRAY['z'], "
        "blob = '\\x01', amount = amount + 1, at = at + interval '1 hour', span = '1 day', "
        "priced = '{\"p\": 1}'"),
    "sqlite": (
        "id INTEGER PRIMARY KEY, blob BLOB, amount TEXT, doc TEXT",
        [(1, b"\x00\xff\x10", "12345678901234567890.12345678901234567890", '{"a": 1}'),
         (2, b"", "-1e-20", None)],
        "blob = x'01', amount = 'x', doc = '{}'"),
}


def _typed_table(engine: Engine) -> str:
    columns, rows, change = TYPED_VALUES[engine.dialect]
    engine.run(f"CREATE TABLE tv ({columns})")
    conn = engine._connect()
    mark = "%s" if engine.dialect == "postgres" else "?"
    for row in rows:
        conn.execute(f"INSERT INTO tv VALUES ({', '.join([mark] * len(row))})", row)
    conn.commit()
    conn.close()
    return change


def _exact(engine: Engine) -> list[Any]:
    """Every row of ``tv`` as the engine writes it: text and bytes, nothing parsed."""
    conn = engine._connect()
    try:
        sql = ("SELECT tv::text FROM tv ORDER BY id" if engine.dialect == "postgres" else
               "SELECT id, hex(blob), typeof(blob), amount, typeof(amount), doc FROM tv "
               "ORDER BY id")
        return [tuple(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def test_typed_values_are_restored_byte_for_byte(engine: Engine) -> None:
    """jsonb, json, arrays, bytes, a long numeric, a timestamptz, an interval: updated,
    deleted and inserted rows are put back exactly (the rows' own text compared)."""
    change = _typed_table(engine)
    before = _exact(engine)
    copy = ("INSERT INTO tv SELECT id + 10, " + ", ".join(
        c.split()[0] for c in TYPED_VALUES[engine.dialect][0].split(", ")[1:])
        + " FROM tv WHERE id = 1 RETURNING id")
    statements = (f"UPDATE tv SET {change} WHERE id = 1", "DELETE FROM tv WHERE id = 2")
    preview = engine.preview(*statements)
    engine.run(*statements)
    assert _exact(engine) != before
    undo = compensate(preview, engine.dialect)
    assert [r.op for r in undo.rows] == ["reinsert", "restore"]
    previewed = engine.target.preview(Change(undo.statements), mode="rollback",
                                      sample_rows=5, statement_timeout_ms=5_000)
    assert [s["rows"] for s in previewed] == [1, 1]
    # decode() and unhex() are catalogued, deterministic functions: no caveat for them.
    assert [s["preview_caveats"] for s in previewed] == [[], []]
    assert engine.apply(undo.statements) == [1, 1]
    assert _exact(engine) == before
    # An inserted row of every typed value is removed again, fenced on all of them.
    preview = engine.preview(copy)
    engine.run(copy)
    undo = compensate(preview, engine.dialect)
    assert engine.apply(undo.statements) == [1]
    assert _exact(engine) == before


def test_a_later_change_to_a_typed_column_makes_its_fence_miss(engine: Engine) -> None:
    """Someone changed a json, array or bytes value after the change: the fence on that
    column misses, the row is not overwritten."""
    change = _typed_table(engine)
    later = {"postgres": ["raw = '{ \"b\":1,  \"a\":2 }'", "ints = ARRAY[9, 9]",
                          "blob = '\\x02'", "doc = '{\"changed\": false}'"],
             "sqlite": ["blob = x'02'", "doc = '{ }'"]}[engine.dialect]
    for edit in later:
        engine.run("DROP TABLE tv")
        _typed_table(engine)
        preview = engine.preview(f"UPDATE tv SET {change} WHERE id = 1")
        engine.run(f"UPDATE tv SET {change} WHERE id = 1", f"UPDATE tv SET {edit} WHERE id = 1")
        changed = _exact(engine)
        assert engine.apply(compensate(preview, engine.dialect).statements) == [0], edit
        assert _exact(engine) == changed


def test_a_value_the_image_cannot_carry_makes_the_undo_unavailable(engine: Engine) -> None:
    """A value stored as ``{"$unencoded": type}`` is shown, never restored."""
    preview = {"mode": "rollback", "statements": [{"row_images": {
        "status": "captured", "table": "tv", "key": ["id"], "total": 1, "shown": 1,
        "truncated": False, "types": {"p": "point"},
        "rows": [{"key": {"id": 1}, "op": "update", "changed": ["v"],
                  "before": {"id": 1, "v": 1, "p": {"$unencoded": "point", "text": "(1,2)"}},
                  "after": {"id": 1, "v": 2,
                            "p": {"$unencoded": "point", "text": "(1,2)"}}}]}}]}
    with pytest.raises(UndoUnavailable, match="column p holds a value of type point") as caught:
        compensate(preview, engine.dialect)
    assert caught.value.code == "undo_unavailable"


def test_what_was_not_imaged_cannot_be_undone(engine: Engine) -> None:
    """A table without a key (count only) and an explain preview: undo_unavailable, with
    the preview's own reason."""
    engine.run("CREATE TABLE loose (v INT)", "INSERT INTO loose VALUES (1)")
    with pytest.raises(UndoUnavailable, match="no primary key"):
        compensate(engine.preview("UPDATE loose SET v = 2"), engine.dialect)
    with pytest.raises(UndoUnavailable, match="explain"):
        compensate({"mode": "explain", "statements": []}, engine.dialect)
    with pytest.raises(UndoUnavailable, match="never previewed"):
        compensate(None, engine.dialect)


def test_a_row_changed_while_the_undo_waits_for_it_is_not_touched(engine: Engine) -> None:
    """Another transaction holds row 1, and commits a change to it while the undo's fenced
    statement waits for the row: the statement, once it runs, touches no row (PostgreSQL
    checks the fence again on the row's new version under read committed; SQLite lets the
    undo write only after the other writer committed). Whenever the waiting starts, the
    outcome is the same."""
    engine.run("CREATE TABLE w (id INT PRIMARY KEY, v INT)", "INSERT INTO w VALUES (1, 1)")
    preview = engine.preview("UPDATE w SET v = 2")
    engine.run("UPDATE w SET v = 2")
    (statement,) = compensate(preview, engine.dialect).statements
    holder = engine._connect()
    if engine.dialect == "sqlite":
        holder.isolation_level = None
        holder.execute("BEGIN IMMEDIATE")
    holder.execute("UPDATE w SET v = 3 WHERE id = 1")
    counts: list[int] = []

    def undo() -> None:
        conn = psycopg.connect(engine.target.dsn) if engine.dialect == "postgres" \
            else sqlite3.connect(engine.target.path, timeout=30)
        try:
            counts.append(conn.execute(statement.sql, statement.params).rowcount)
            conn.commit()
        finally:
            conn.close()

    waiting = threading.Thread(target=undo)
    waiting.start()
    holder.commit()
    holder.close()
    waiting.join(30)
    assert counts == [0]
    assert engine.rows("w") == [(1, 3)]
