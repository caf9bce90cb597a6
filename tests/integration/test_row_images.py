"""Row images of rolled-back previews on a real SQLite file and a real PostgreSQL database:
every changed row before and after, keyed by its primary key (or a unique index over NOT
NULL columns, or the row key the operator declared) — or said to be unavailable, never
guessed. One suite, every case on both engines; MERGE is PostgreSQL's alone."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from marque.target import Target, open_target
from marque.target.image_capture import ROW_IMAGE_CAP
from marque.target.row_images import diff_body, diff_cid
from marque.token import Change, Statement

#: Declared row keys of the fixture's tables without a key of their own.
ROW_KEYS = {"lines": ["ref", "n"], "dupes": ["code"], "nullish": ["code"]}


@dataclass
class Engine:
    """One target under test and what differs between the engines."""

    name: str
    target: Target
    dsn: str
    #: The engine's positional placeholder.
    mark: str
    #: Runs one statement on the target outside any preview, committed; its rows.
    run: Callable[[str], list[tuple[Any, ...]]]
    #: How a ``balance`` value reads in an image (PostgreSQL's numeric travels as text).
    num: Callable[[int], Any]

    def sql(self, text: str) -> str:
        """``text`` with ``?`` as this engine's placeholder."""
        return text.replace("?", self.mark)


def _schema(engine: str) -> list[str]:
    pg = engine == "postgres"
    big = (f"INSERT INTO big SELECT g, 0 FROM generate_series(1, {ROW_IMAGE_CAP + 5}) g" if pg
           else f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < "
                f"{ROW_IMAGE_CAP + 5}) INSERT INTO big SELECT n, 0 FROM g")
    return [
        # SQLite's INTEGER PRIMARY KEY is its rowid: a key SQLite makes when none is given.
        "CREATE TABLE accounts (id " + ("int" if pg else "INTEGER") + " PRIMARY KEY, owner "
        "text NOT NULL, balance " + ("numeric NOT NULL)" if pg else "INT)"),
        "INSERT INTO accounts VALUES (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 7)",
        "CREATE TABLE holdings (acct int, sym text, qty int, PRIMARY KEY (sym, acct))",
        "INSERT INTO holdings VALUES (1, 'X', 5), (1, 'Y', 6), (2, 'X', 7)",
        "CREATE TABLE events (msg text)",
        "INSERT INTO events VALUES ('a'), ('b')",
        "CREATE TABLE tags (name text NOT NULL UNIQUE, v int)",
        "INSERT INTO tags VALUES ('red', 1), ('blue', 2)",
        "CREATE TABLE loose (name text UNIQUE, v int)",
        "INSERT INTO loose VALUES ('a', 1)",
        "CREATE TABLE serials (" + ("id serial PRIMARY KEY" if pg else "id INTEGER PRIMARY KEY")
        + ", v int)",
        "CREATE TABLE big (id int PRIMARY KEY, v int)",
        big,
        # No key of their own; pilot.json declares one for each (ROW_KEYS).
        "CREATE TABLE lines (ref text, n int, amount int)",
        "INSERT INTO lines VALUES ('a', 1, 10), ('a', 2, 20), ('b', 1, 5)",
        "CREATE TABLE dupes (code text, v int)",
        "INSERT INTO dupes VALUES ('x', 1), ('x', 2), ('y', 3)",
        "CREATE TABLE nullish (code text, v int)",
        "INSERT INTO nullish VALUES ('x', 1), (NULL, 2)",
    ]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """The fixture's tables in a fresh SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        path = tmp_path / "bank.sqlite3"

        def run(sql: str) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(path)
            try:
                with conn:
                    return conn.execute(sql).fetchall()
            finally:
                conn.close()

        conn = sqlite3.connect(path)
        conn.executescript(";\n".join(_schema("sqlite")) + ";")
        conn.close()
        dsn, mark, num = f"sqlite:///{path}", "?", int
    else:
        import psycopg

        dsn = request.getfixturevalue("pg_dsn")

        def run(sql: str) -> list[tuple[Any, ...]]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                cur = conn.execute(sql)
                return cur.fetchall() if cur.description else []

        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in _schema("postgres"):
                conn.execute(statement)
        mark, num = "%s", str  # type: ignore[assignment]
    target = open_target("bank", dsn, row_keys=ROW_KEYS)
    try:
        yield Engine(request.param, target, dsn, mark, run, num)
    finally:
        target.close()


def _preview(engine: Engine, *statements: Statement) -> list[dict[str, Any]]:
    return engine.target.preview(Change(statements), mode="rollback", sample_rows=5,
                                 statement_timeout_ms=5_000)


def _images(engine: Engine, sql: str, *params: Any) -> dict[str, Any]:
    (statement,) = _preview(engine, Statement(engine.sql(sql), tuple(params)))
    images = statement["row_images"]
    assert isinstance(images, dict)
    return images


def _pg_only(engine: Engine) -> None:
    if engine.name != "postgres":
        pytest.skip("PostgreSQL only: SQLite has no MERGE")


def test_single_row_update_shows_its_row_before_and_after(engine: Engine) -> None:
    """The issue's example: which row, its value before and after, the changed column; the
    target is unchanged."""
    images = _images(engine, "UPDATE accounts SET balance = balance - ? WHERE id = ?", 10, 1)
    assert (images["status"], images["table"], images["key"], images["total"]) == (
        "captured", "accounts", ["id"], 1)
    assert images["truncated"] is False and images["key_source"] == "primary_key"
    assert images["rows"] == [{"key": {"id": 1}, "op": "update",
                               "before": {"id": 1, "owner": "ann", "balance": engine.num(100)},
                               "after": {"id": 1, "owner": "ann", "balance": engine.num(90)},
                               "changed": ["balance"]}]
    assert engine.run("SELECT balance FROM accounts WHERE id = 1") == [(100,)]


def test_multi_row_update_delete_insert_and_upsert(engine: Engine) -> None:
    """Rows in key order; deletes without an after-image, inserts without a before-image;
    an upsert shows the row it updates before and after."""
    updated = _images(engine, "UPDATE accounts SET owner = upper(owner) WHERE balance < ?", 60)
    assert [(r["key"]["id"], r["after"]["owner"]) for r in updated["rows"]] == [
        (2, "BOB"), (3, "CY")]
    deleted = _images(engine, "DELETE FROM accounts AS a WHERE a.id >= 2")
    assert [(r["op"], r["key"], r["after"]) for r in deleted["rows"]] == [
        ("delete", {"id": 2}, None), ("delete", {"id": 3}, None)]
    assert deleted["rows"][0]["before"]["owner"] == "bob"
    inserted = _images(engine, "INSERT INTO accounts (id, owner, balance) VALUES (?, ?, 1)",
                       9, "dee")
    assert [(r["op"], r["before"], r["after"]) for r in inserted["rows"]] == [
        ("insert", None, {"id": 9, "owner": "dee", "balance": engine.num(1)})]
    upsert = _images(engine, "INSERT INTO accounts (id, owner, balance) VALUES (1, 'ann', 5), "
                     "(4, 'eve', 6) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
    assert [(r["op"], r["key"]["id"], r["changed"]) for r in upsert["rows"]] == [
        ("update", 1, ["balance"]), ("insert", 4, ["balance", "id", "owner"])]
    ignored = _images(engine, "INSERT INTO accounts (id, owner, balance) VALUES (1, 'x', 5), "
                      "(4, 'eve', 6) ON CONFLICT DO NOTHING")
    assert [(r["op"], r["key"]["id"]) for r in ignored["rows"]] == [("insert", 4)]
    if engine.name == "sqlite":
        ignored = _images(engine, "INSERT OR IGNORE INTO accounts (id, owner, balance) "
                          "VALUES (1, 'x', 5), (4, 'eve', 6)")
        assert [(r["op"], r["key"]["id"]) for r in ignored["rows"]] == [("insert", 4)]


def test_composite_primary_key(engine: Engine) -> None:
    """A key of several columns, in the key's own order."""
    images = _images(engine, "UPDATE holdings SET qty = qty + 1 WHERE acct = 1")
    assert images["key"] == ["sym", "acct"]
    assert [r["key"] for r in images["rows"]] == [{"sym": "X", "acct": 1},
                                                   {"sym": "Y", "acct": 1}]
    assert [r["after"]["qty"] for r in images["rows"]] == [6, 7]


def test_what_cannot_be_imaged_says_why(engine: Engine) -> None:
    """No key, a key the database makes, a subquery, several tables, a read, DDL: said per
    statement, count only."""
    nokey = _images(engine, "UPDATE events SET msg = 'z'")
    assert nokey["status"] == "unavailable" and "no primary key" in nokey["reason"]
    assert "code" not in nokey  # worded, with no code, as before declared keys existed
    made = _images(engine, "INSERT INTO serials (v) VALUES (1)")
    assert made["status"] == "unavailable" and "makes the inserted rows' keys" in made["reason"]
    assert "sequence" in made["reason"]
    if engine.name == "sqlite":
        rowid = _images(engine, "INSERT INTO accounts (owner, balance) VALUES ('x', 1)")
        assert "makes the inserted rows' keys" in rowid["reason"]
    sub = _images(engine, "DELETE FROM accounts WHERE id IN (SELECT acct FROM holdings)")
    assert sub["status"] == "unavailable" and "subquery" in sub["reason"]
    several = _images(engine, "UPDATE accounts AS a SET balance = 0 FROM holdings AS h "
                      "WHERE h.acct = a.id")
    assert several["status"] == "unavailable" and "several tables" in several["reason"]
    (read,) = _preview(engine, Statement("SELECT * FROM accounts"))
    assert read["row_images"] is None
    ddl = _images(engine, "CREATE TABLE other (id INT)")
    assert ddl["status"] == "unavailable"
    if engine.name == "sqlite":
        replaced = _images(engine, "REPLACE INTO accounts (id, owner, balance) "
                           "VALUES (1, 'x', 1)")
        assert replaced["status"] == "unavailable" and "only the rows of" in replaced["reason"]
    else:
        (cte,) = _preview(engine, Statement(
            "WITH d AS (DELETE FROM accounts WHERE id = 3 RETURNING *) SELECT * FROM d"))
        assert cte["row_images"]["status"] == "unavailable"
        assert "data-modifying WITH" in cte["row_images"]["reason"]


def test_past_the_cap_a_sample_and_the_exact_count(engine: Engine) -> None:
    """More rows than the cap: the first ones in key order, the exact total, truncated."""
    images = _images(engine, "UPDATE big SET v = 1")
    assert (images["total"], images["shown"], images["truncated"]) == (
        ROW_IMAGE_CAP + 5, ROW_IMAGE_CAP, True)
    assert len(images["rows"]) == ROW_IMAGE_CAP
    assert [r["key"]["id"] for r in images["rows"][:3]] == [1, 2, 3]
    assert all(r["after"]["v"] == 1 for r in images["rows"])


def test_the_diff_content_id_follows_the_rows(engine: Engine) -> None:
    """Same data, same diff_cid; other data, another one — and the before_cid changes too."""
    statement = Statement("UPDATE accounts SET balance = 0 WHERE id = 1")
    first = _preview(engine, statement)
    assert diff_cid(first) == diff_cid(_preview(engine, statement))
    assert diff_body(first)["version"] == "marque-row-diff/0.1"
    engine.run("UPDATE accounts SET balance = 99 WHERE id = 1")
    second = _preview(engine, statement)
    assert diff_cid(second) != diff_cid(first)
    assert second[0]["row_images"]["before_cid"] != first[0]["row_images"]["before_cid"]


def test_a_unique_index_over_not_null_columns_keys_a_table_without_a_primary_key(
        engine: Engine) -> None:
    """The schema's own declaration names the rows; a unique index that admits NULLs
    does not, so that table is count only."""
    images = _images(engine, "UPDATE tags SET v = v + 1")
    assert images["status"] == "captured" and images["key"] == ["name"]
    assert images["key_source"] == "unique_index"
    assert [(r["key"], r["after"]["v"]) for r in images["rows"]] == [
        ({"name": "blue"}, 3), ({"name": "red"}, 2)]
    nullable = _images(engine, "UPDATE loose SET v = 2")
    assert nullable["status"] == "unavailable" and "no primary key" in nullable["reason"]


def test_keys_the_database_makes_are_read_back_by_the_statements_own_returning(
        engine: Engine) -> None:
    """Keys a sequence (or SQLite's rowid) makes cannot be named before the insert, but
    RETURNING names them after: the new rows are read back by those keys (the statement
    itself is unchanged)."""
    images = _images(engine, "INSERT INTO serials (v) VALUES (?), (?) RETURNING id", 10, 20)
    assert images["status"] == "captured" and images["total"] == 2
    assert [(r["op"], r["after"]["v"]) for r in images["rows"]] == [("insert", 10),
                                                                    ("insert", 20)]
    starred = _images(engine, "INSERT INTO serials (v) SELECT 7 RETURNING *")
    assert [r["after"]["v"] for r in starred["rows"]] == [7]
    unnamed = _images(engine, "INSERT INTO serials (v) VALUES (1) RETURNING v")
    assert unnamed["status"] == "unavailable"
    if engine.name == "sqlite":  # its rowid, made by SQLite and named by RETURNING
        fay = _images(engine, "INSERT INTO accounts (owner, balance) VALUES (?, 5) "
                      "RETURNING id", "fay")
        assert [(r["op"], r["after"]) for r in fay["rows"]] == [
            ("insert", {"id": 4, "owner": "fay", "balance": 5})]


# -- declared row keys ---------------------------------------------------------------------


def test_a_declared_row_key_names_the_rows_of_a_table_without_one(engine: Engine) -> None:
    """pilot.json's row key keys the images of a table with no key of its own, and the
    preview says the key is declared — in the diff's preimage too."""
    images = _images(engine, "UPDATE lines SET amount = amount + ? WHERE ref = ?", 1, "a")
    assert (images["status"], images["key"], images["key_source"]) == (
        "captured", ["ref", "n"], "declared")
    assert [(r["key"], r["before"]["amount"], r["after"]["amount"]) for r in images["rows"]] == [
        ({"ref": "a", "n": 1}, 10, 11), ({"ref": "a", "n": 2}, 20, 21)]
    deleted = _images(engine, "DELETE FROM lines WHERE ref = 'b'")
    assert [(r["op"], r["key"]) for r in deleted["rows"]] == [("delete", {"ref": "b", "n": 1})]
    inserted = _images(engine, "INSERT INTO lines (ref, n, amount) VALUES ('c', 1, 3)")
    assert [(r["op"], r["after"]) for r in inserted["rows"]] == [
        ("insert", {"ref": "c", "n": 1, "amount": 3})]
    statements = _preview(engine, Statement("UPDATE lines SET amount = 0 WHERE n = 2"),
                          Statement("UPDATE accounts SET balance = 0 WHERE id = 1"))
    preimage = diff_body(statements)["statements"]
    assert preimage[0]["key_source"] == "declared"
    # A schema key's images hash as they did before declared keys existed.
    assert "key_source" not in preimage[1]
    assert {k: v for k, v in statements[1]["row_images"].items()
            if k != "key_source"} == preimage[1]


def test_a_declared_key_that_is_not_unique_is_count_only_never_a_merged_diff(
        engine: Engine) -> None:
    """Two rows holding one declared key: whether both are changed, only one is (the other
    found when the key is read back), or a new row repeats an old one's key, the images are
    dropped with a named reason; a NULL key names no row either."""
    both = _images(engine, "UPDATE dupes SET v = v + 1 WHERE code = 'x'")
    assert (both["status"], both["code"]) == ("unavailable", "declared_key_not_unique")
    assert "not unique" in both["reason"] and '"code": "x"' in both["reason"]
    one = _images(engine, "UPDATE dupes SET v = 9 WHERE v = 1")
    assert one["code"] == "declared_key_not_unique"
    gone = _images(engine, "DELETE FROM dupes WHERE v = 2")
    assert gone["code"] == "declared_key_not_unique"
    again = _images(engine, "INSERT INTO dupes (code, v) VALUES ('y', 4)")
    assert again["code"] == "declared_key_not_unique"
    fine = _images(engine, "UPDATE dupes SET v = 0 WHERE code = 'y'")
    assert fine["status"] == "captured" and fine["rows"][0]["key"] == {"code": "y"}
    null = _images(engine, "UPDATE nullish SET v = 0")
    assert (null["status"], null["code"]) == ("unavailable", "declared_key_null")
    assert diff_body([{"row_images": null}])["statements"][0]["code"] == "declared_key_null"


def test_a_declared_key_is_used_only_where_the_table_has_none(engine: Engine) -> None:
    """A table's own key wins over a declared one; a declaration for another table changes
    nothing; a target without declarations keeps a keyless table count only."""
    dsn = engine.dsn
    declared = open_target("bank", dsn, row_keys={"accounts": ["owner"], "tags": ["v"]})
    plain = open_target("bank", dsn)
    try:
        change = Change((Statement("UPDATE accounts SET balance = 1 WHERE id = 2"),
                         Statement("UPDATE tags SET v = 0 WHERE name = 'red'"),
                         Statement("UPDATE lines SET amount = 0")))
        one, two, three = declared.preview(change, mode="rollback", sample_rows=1,
                                           statement_timeout_ms=5_000)
        assert (one["row_images"]["key"], one["row_images"]["key_source"]) == (
            ["id"], "primary_key")
        assert (two["row_images"]["key"], two["row_images"]["key_source"]) == (
            ["name"], "unique_index")
        assert three["row_images"]["status"] == "unavailable"
        (keyless,) = plain.preview(Change((Statement("UPDATE lines SET amount = 0"),)),
                                   mode="rollback", sample_rows=1, statement_timeout_ms=5_000)
        assert "no primary key" in keyless["row_images"]["reason"]
    finally:
        declared.close()
        plain.close()


# -- MERGE (PostgreSQL 15+) ------------------------------------------------------------------


def test_merge_shows_the_rows_it_updates_deletes_and_inserts(engine: Engine) -> None:
    """A MERGE's images without RETURNING: matched rows before and after (an update that
    keeps a value is still an update, a matched row no WHEN clause takes is not shown),
    deleted rows, inserted rows — and the target is unchanged."""
    _pg_only(engine)
    images = _images(
        engine, "MERGE INTO accounts a USING (VALUES (?::int, ?::int), (2, 50), (3, 0), "
        "(4, 9)) AS s(id, v) ON s.id = a.id "
        "WHEN MATCHED AND s.v = 0 THEN DELETE "
        "WHEN MATCHED AND s.v > 40 THEN UPDATE SET balance = s.v "
        "WHEN NOT MATCHED THEN INSERT (id, owner, balance) VALUES (s.id, 'new', s.v)", 1, 5)
    assert (images["status"], images["key"], images["total"]) == ("captured", ["id"], 3)
    assert [(r["op"], r["key"]["id"], r["changed"]) for r in images["rows"]] == [
        ("update", 2, []), ("delete", 3, ["balance", "id", "owner"]),
        ("insert", 4, ["balance", "id", "owner"])]
    assert images["rows"][0]["before"] == images["rows"][0]["after"] == {
        "id": 2, "owner": "bob", "balance": "50"}
    assert images["rows"][2]["after"] == {"id": 4, "owner": "new", "balance": "9"}
    assert engine.run("SELECT id, balance FROM accounts ORDER BY id") == [
        (1, 100), (2, 50), (3, 7)]


def test_merge_after_an_earlier_write_in_the_same_change(engine: Engine) -> None:
    """Rows an earlier statement of the change wrote are not taken for the MERGE's inserts,
    and the row it updates again is shown as the MERGE saw it."""
    _pg_only(engine)
    first, merged = _preview(
        engine, Statement("INSERT INTO accounts VALUES (5, 'dan', 1)"),
        Statement("MERGE INTO accounts a USING (VALUES (5, 2), (6, 3)) AS s(id, v) "
                  "ON s.id = a.id WHEN MATCHED THEN UPDATE SET balance = s.v "
                  "WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'eve', s.v)"))
    assert [r["op"] for r in first["row_images"]["rows"]] == ["insert"]
    rows = merged["row_images"]["rows"]
    assert [(r["op"], r["key"]["id"]) for r in rows] == [("update", 5), ("insert", 6)]
    assert (rows[0]["before"]["balance"], rows[0]["after"]["balance"]) == ("1", "2")


def test_merge_on_a_declared_key_and_what_it_cannot_image(engine: Engine) -> None:
    """A MERGE keys a keyless table by its declared key, refuses a declared key a new row
    repeats, and is count only where images would be guesses."""
    _pg_only(engine)
    images = _images(engine, "MERGE INTO lines l USING (VALUES ('b', 1)) AS s(r, n) "
                     "ON s.r = l.ref AND s.n = l.n WHEN MATCHED THEN DELETE")
    assert (images["key_source"], images["rows"][0]["key"]) == ("declared", {"ref": "b", "n": 1})
    repeated = _images(engine, "MERGE INTO dupes d USING (VALUES ('y')) AS s(c) "
                       "ON false WHEN NOT MATCHED THEN INSERT VALUES (s.c, 5)")
    assert repeated["code"] == "declared_key_not_unique"
    nokey = _images(engine, "MERGE INTO events e USING (VALUES ('a')) AS s(m) ON s.m = e.msg "
                    "WHEN MATCHED THEN DELETE")
    assert nokey["status"] == "unavailable" and "no primary key" in nokey["reason"]
    rekey = _images(engine, "MERGE INTO accounts a USING holdings h "
                    "ON h.acct = a.id AND h.sym = 'Y' WHEN MATCHED THEN UPDATE SET id = 10")
    assert rekey["status"] == "unavailable" and "key itself" in rekey["reason"]
    tupled = _images(engine, "MERGE INTO accounts a USING holdings h ON h.acct = a.id AND "
                     "h.sym = 'Y' WHEN MATCHED THEN UPDATE SET (balance, id) = (0, 10)")
    assert tupled["status"] == "unavailable" and "key itself" in tupled["reason"]
    volatile = _images(engine, "MERGE INTO accounts a USING holdings h ON h.acct = a.id "
                       "AND h.sym = 'Y' AND random() < 2 WHEN MATCHED THEN DELETE")
    assert volatile["status"] == "unavailable" and "ON calls" in volatile["reason"]
    holding = _images(engine, "MERGE INTO accounts a USING holdings h "
                      "ON h.acct = a.id AND h.sym = 'Y' WHEN MATCHED THEN UPDATE SET balance = 0")
    assert [(r["key"], r["after"]["balance"]) for r in holding["rows"]] == [({"id": 1}, "0")]


def test_merge_binds_the_parameters_of_using_and_on_only(engine: Engine) -> None:
    """Placeholders in USING, ON and the WHEN clauses: the before-read binds the first two
    groups, in order; no alias on either side reads the same."""
    _pg_only(engine)
    images = _images(engine, "MERGE INTO accounts USING (VALUES (?::int)) AS s(id) "
                     "ON s.id = accounts.id AND accounts.balance > ? "
                     "WHEN MATCHED THEN UPDATE SET balance = ?", 2, 10, 77)
    assert [(r["key"], r["before"]["balance"], r["after"]["balance"]) for r in images["rows"]] == [
        ({"id": 2}, "50", "77")]
    missed = _images(engine, "MERGE INTO accounts USING holdings "
                     "ON holdings.acct = accounts.id AND holdings.sym = ? "
                     "WHEN MATCHED THEN DELETE", "nothing")
    assert (missed["status"], missed["total"], missed["rows"]) == ("captured", 0, [])


def test_a_sqlite_primary_key_holding_null_twice_is_never_merged(engine: Engine) -> None:
    """SQLite lets a non-INTEGER primary key hold NULL, in several rows: those rows share a
    key, and the statement is count only rather than a diff that shows one of them."""
    if engine.name != "sqlite":
        pytest.skip("SQLite only: PostgreSQL's primary keys are NOT NULL")
    engine.run("CREATE TABLE sloppy (a TEXT PRIMARY KEY, v INT)")
    engine.run("INSERT INTO sloppy VALUES (NULL, 1), (NULL, 2), ('k', 3)")
    images = _images(engine, "UPDATE sloppy SET v = 0 WHERE a IS NULL")
    assert images["status"] == "unavailable" and "not unique" in images["reason"]
    assert "code" not in images
    keyed = _images(engine, "UPDATE sloppy SET v = 0 WHERE a = 'k'")
    assert keyed["status"] == "captured" and keyed["key_source"] == "primary_key"


def test_a_merge_whose_rows_do_not_add_up_is_count_only(engine: Engine) -> None:
    """A trigger that writes another row of the same table: the MERGE reports one row, its
    images find two new ones, and the images are dropped, said, rather than guessed."""
    _pg_only(engine)
    engine.run("CREATE FUNCTION shadow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "IF NEW.id < 1000 THEN INSERT INTO accounts VALUES (NEW.id + 1000, 'shadow', 0); "
               "END IF; RETURN NEW; END $$")
    engine.run("CREATE TRIGGER shadowing AFTER INSERT ON accounts FOR EACH ROW "
               "EXECUTE FUNCTION shadow()")
    images = _images(engine, "MERGE INTO accounts a USING (VALUES (8, 1)) AS s(id, v) "
                     "ON s.id = a.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'new', s.v)")
    assert images["status"] == "unavailable"
    assert "reports 1 row(s) but its images account for 2" in images["reason"]


#: A table of typed values on each engine, and its row as the image must hold it.
TYPED = {
    "postgres": (
        "CREATE TABLE typed (id int PRIMARY KEY, doc jsonb, raw json, ints int[], "
        "tags text[], blob bytea, amount numeric(40,20), at timestamptz, span interval, "
        "priced jsonb, nothing jsonb)",
        "INSERT INTO typed VALUES (1, '{\"b\": [true, null, \"x\"], \"a\": 1, \"n\": 1.5}', "
        "'{ \"b\":1,  \"a\":2, \"a\":3 }', '{1,NULL,3}', '{\"a b\",\"c,d\",NULL,\"\"}', "
        "'\\x00ff10', 12345678901234567890.12345678901234567890, "
        "'2026-12-04 18:00:00.123456+00', '1 mon 2 days 03:04:05', "
        "'{\"p\": 10.50, \"big\": 12345678901234567890}', 'null')",
        {"id": 1, "doc": {"a": 1, "b": [True, None, "x"], "n": 1.5},
         "raw": '{ "b":1,  "a":2, "a":3 }', "ints": [1, None, 3],
         "tags": ["a b", "c,d", None, ""], "blob": {"$bytes": "AP8Q"},
         "amount": "12345678901234567890.12345678901234567890",
         "at": "2026-12-04 18:00:00.123456+00:00", "span": "1 mon 2 days 03:04:05",
         "priced": {"$json": '{"p": 10.50, "big": 12345678901234567890}'},
         "nothing": {"$json": "null"}},
        {"blob": "bytea", "doc": "jsonb", "ints": "integer[]", "nothing": "jsonb",
         "priced": "jsonb", "raw": "json", "tags": "text[]"}),
    "sqlite": (
        "CREATE TABLE typed (id INTEGER PRIMARY KEY, blob BLOB, amount TEXT, doc TEXT, "
        "big INTEGER)",
        "INSERT INTO typed VALUES (1, x'00ff10', '12345678901234567890.12345678901234567890', "
        "'{\"a\": 1}', 9007199254740993)",
        {"id": 1, "blob": {"$bytes": "AP8Q"},
         "amount": "12345678901234567890.12345678901234567890", "doc": '{"a": 1}',
         "big": "9007199254740993"},
        {"blob": "blob"}),
}


def test_typed_values_are_imaged_exactly(engine: Engine) -> None:
    """jsonb as its JSON (as its text where a double would not carry it, or where it is a
    JSON null), json as its text, arrays as lists, bytes tagged, a 40-digit numeric and a
    timestamptz as their exact text; the image says which columns are typed, and the diff
    is version 0.2 — a plain table's stays 0.1 (test_the_diff_content_id_follows_the_rows)."""
    create, insert, row, types = TYPED[engine.name]
    engine.run(create)
    engine.run(insert)
    images = _images(engine, "DELETE FROM typed WHERE id = 1")
    assert images["rows"] == [{"key": {"id": 1}, "op": "delete", "before": row,
                               "after": None, "changed": sorted(row)}]
    assert images["types"] == types
    (statement,) = _preview(engine, Statement("DELETE FROM typed WHERE id = 1"))
    assert diff_body([statement])["version"] == "marque-row-diff/0.2"


def test_a_value_without_a_faithful_form_says_its_type(engine: Engine) -> None:
    """A PostgreSQL range (read as a Python value the image has no exact form for) is shown
    tagged by its type, never as a guess; SQLite's values all have a form."""
    if engine.name != "postgres":
        pytest.skip("PostgreSQL only: every SQLite value has a form")
    engine.run("CREATE TABLE shapes (id int PRIMARY KEY, r int4range, v int)")
    engine.run("INSERT INTO shapes VALUES (1, '[1,5)', 0)")
    images = _images(engine, "UPDATE shapes SET v = 1")
    (row,) = images["rows"]
    assert row["before"]["r"] == {"$unencoded": "int4range", "text": row["before"]["r"]["text"]}
    assert images["types"] == {"r": "int4range"}
