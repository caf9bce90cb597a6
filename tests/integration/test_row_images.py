"""Row images of rolled-back previews on a real SQLite target: every changed row before and
after, keyed by its primary key — or said to be unavailable, never guessed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from marque.target.row_images import ROW_IMAGE_CAP, diff_body, diff_cid
from marque.target.sqlite import SqliteTarget
from marque.token import Change, Statement


@pytest.fixture
def target(tmp_path: Path) -> SqliteTarget:
    path = tmp_path / "bank.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(f"""
        CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance INT);
        INSERT INTO accounts VALUES (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 7);
        CREATE TABLE holdings (acct INT, sym TEXT, qty INT, PRIMARY KEY (sym, acct));
        INSERT INTO holdings VALUES (1, 'X', 5), (1, 'Y', 6), (2, 'X', 7);
        CREATE TABLE events (msg TEXT);
        CREATE TABLE tags (name TEXT NOT NULL UNIQUE, v INT);
        INSERT INTO tags VALUES ('red', 1), ('blue', 2);
        CREATE TABLE loose (name TEXT UNIQUE, v INT);
        INSERT INTO loose VALUES ('a', 1);
        INSERT INTO events VALUES ('a'), ('b');
        CREATE TABLE big (id INTEGER PRIMARY KEY, v INT);
        WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g
                                WHERE n < {ROW_IMAGE_CAP + 5})
        INSERT INTO big SELECT n, 0 FROM g;
    """)
    conn.commit()
    conn.close()
    return SqliteTarget("bank", str(path))


def _preview(target: SqliteTarget, *statements: Statement) -> list[dict[str, Any]]:
    return target.preview(Change(statements), mode="rollback", sample_rows=5,
                          statement_timeout_ms=5_000)


def _images(target: SqliteTarget, sql: str, *params: Any) -> dict[str, Any]:
    (statement,) = _preview(target, Statement(sql, tuple(params)))
    images = statement["row_images"]
    assert isinstance(images, dict)
    return images


def test_single_row_update_shows_its_row_before_and_after(target: SqliteTarget) -> None:
    """Which row, its value before and after, the changed column; the file is unchanged."""
    images = _images(target, "UPDATE accounts SET balance = balance - ? WHERE id = ?", 10, 1)
    assert (images["status"], images["table"], images["key"], images["total"]) == (
        "captured", "accounts", ["id"], 1)
    assert images["rows"] == [{"key": {"id": 1}, "op": "update",
                               "before": {"id": 1, "owner": "ann", "balance": 100},
                               "after": {"id": 1, "owner": "ann", "balance": 90},
                               "changed": ["balance"]}]
    conn = sqlite3.connect(target.path)
    assert conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone() == (100,)
    conn.close()


def test_multi_row_update_delete_insert_and_upsert(target: SqliteTarget) -> None:
    """Rows in key order; deletes without, inserts without a before-image; an upsert both."""
    updated = _images(target, "UPDATE accounts SET owner = upper(owner) WHERE balance < ?", 60)
    assert [(r["key"]["id"], r["after"]["owner"]) for r in updated["rows"]] == [
        (2, "BOB"), (3, "CY")]
    deleted = _images(target, "DELETE FROM accounts WHERE id >= 2")
    assert [(r["op"], r["after"]) for r in deleted["rows"]] == [("delete", None)] * 2
    inserted = _images(target, "INSERT INTO accounts (id, owner, balance) VALUES (?, ?, 1)",
                       9, "dee")
    assert inserted["rows"][0]["op"] == "insert" and inserted["rows"][0]["before"] is None
    upsert = _images(target, "INSERT INTO accounts (id, owner, balance) VALUES (1, 'ann', 5), "
                     "(4, 'eve', 6) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
    assert [(r["op"], r["key"]["id"], r["changed"]) for r in upsert["rows"]] == [
        ("update", 1, ["balance"]), ("insert", 4, ["balance", "id", "owner"])]
    ignored = _images(target, "INSERT OR IGNORE INTO accounts (id, owner, balance) "
                      "VALUES (1, 'x', 5), (4, 'eve', 6)")
    assert [(r["op"], r["key"]["id"]) for r in ignored["rows"]] == [("insert", 4)]


def test_composite_primary_key(target: SqliteTarget) -> None:
    """A key of several columns, in the key's own order."""
    images = _images(target, "UPDATE holdings SET qty = qty + 1 WHERE acct = 1")
    assert images["key"] == ["sym", "acct"]
    assert [r["key"] for r in images["rows"]] == [{"sym": "X", "acct": 1},
                                                   {"sym": "Y", "acct": 1}]


def test_what_cannot_be_imaged_says_why(target: SqliteTarget) -> None:
    """No key, a key the database makes, a subquery, a read: said per statement."""
    nokey = _images(target, "UPDATE events SET msg = 'z'")
    assert nokey["status"] == "unavailable" and "no primary key" in nokey["reason"]
    made = _images(target, "INSERT INTO accounts (owner, balance) VALUES ('x', 1)")
    assert made["status"] == "unavailable" and "makes the inserted rows' keys" in made["reason"]
    sub = _images(target, "DELETE FROM accounts WHERE id IN (SELECT acct FROM holdings)")
    assert sub["status"] == "unavailable" and "subquery" in sub["reason"]
    (read,) = _preview(target, Statement("SELECT * FROM accounts"))
    assert read["row_images"] is None
    replaced = _images(target, "REPLACE INTO accounts (id, owner, balance) VALUES (1, 'x', 1)")
    assert replaced["status"] == "unavailable" and "only the rows of" in replaced["reason"]
    ddl = _images(target, "CREATE TABLE other (id INT)")
    assert ddl["status"] == "unavailable"


def test_past_the_cap_a_sample_and_the_exact_count(target: SqliteTarget) -> None:
    """More rows than the cap: the first ones in key order, the exact total, truncated."""
    images = _images(target, "UPDATE big SET v = 1")
    assert (images["total"], images["shown"], images["truncated"]) == (
        ROW_IMAGE_CAP + 5, ROW_IMAGE_CAP, True)
    assert [r["key"]["id"] for r in images["rows"][:3]] == [1, 2, 3]


def test_the_diff_content_id_follows_the_rows(target: SqliteTarget) -> None:
    """Same data, same diff_cid; other data, another one — and the before_cid changes too."""
    statement = Statement("UPDATE accounts SET balance = 0 WHERE id = 1")
    first = _preview(target, statement)
    assert diff_cid(first) == diff_cid(_preview(target, statement))
    assert diff_body(first)["version"] == "marque-row-diff/0.1"
    conn = sqlite3.connect(target.path)
    conn.execute("UPDATE accounts SET balance = 99 WHERE id = 1")
    conn.commit()
    conn.close()
    second = _preview(target, statement)
    assert diff_cid(second) != diff_cid(first)
    assert second[0]["row_images"]["before_cid"] != first[0]["row_images"]["before_cid"]


def test_a_unique_index_over_not_null_columns_keys_a_table_without_a_primary_key(
        target: SqliteTarget) -> None:
    """The schema's own declaration names the rows; a unique index that admits NULLs
    does not, so that table is count only."""
    images = _images(target, "UPDATE tags SET v = v + 1")
    assert images["status"] == "captured" and images["key"] == ["name"]
    assert [(r["key"], r["after"]["v"]) for r in images["rows"]] == [
        ({"name": "blue"}, 3), ({"name": "red"}, 2)]
    nullable = _images(target, "UPDATE loose SET v = 2")
    assert nullable["status"] == "unavailable" and "no primary key" in nullable["reason"]


def test_keys_the_database_makes_are_read_back_by_the_statements_own_returning(
        target: SqliteTarget) -> None:
    """An INTEGER PRIMARY KEY the insert leaves to SQLite: RETURNING names it."""
    images = _images(target, "INSERT INTO accounts (owner, balance) VALUES (?, 5) RETURNING id",
                     "fay")
    assert images["status"] == "captured"
    assert [(r["op"], r["after"]) for r in images["rows"]] == [
        ("insert", {"id": 4, "owner": "fay", "balance": 5})]
