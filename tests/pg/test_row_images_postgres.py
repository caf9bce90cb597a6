"""Row images of rolled-back previews on a real PostgreSQL target: every changed row before
and after, keyed by its primary key — or said to be unavailable, never guessed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from marque.target.postgres import PostgresTarget
from marque.target.row_images import ROW_IMAGE_CAP
from marque.token import Change, Statement


@pytest.fixture
def target(pg_dsn: str) -> Iterator[PostgresTarget]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, "
                     "balance numeric NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (1, 'ann', 100), (2, 'bob', 50), "
                     "(3, 'cy', 7)")
        conn.execute("CREATE TABLE holdings (acct int, sym text, qty int, "
                     "PRIMARY KEY (sym, acct))")
        conn.execute("INSERT INTO holdings VALUES (1, 'X', 5), (1, 'Y', 6), (2, 'X', 7)")
        conn.execute("CREATE TABLE events (msg text)")
        conn.execute("CREATE TABLE tags (name text NOT NULL UNIQUE, v int)")
        conn.execute("INSERT INTO tags VALUES ('red', 1), ('blue', 2)")
        conn.execute("CREATE TABLE loose (name text UNIQUE, v int)")
        conn.execute("INSERT INTO loose VALUES ('a', 1)")
        conn.execute("INSERT INTO events VALUES ('a'), ('b')")
        conn.execute("CREATE TABLE serials (id serial PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v int)")
        conn.execute(f"INSERT INTO big SELECT g, 0 FROM generate_series(1, "
                     f"{ROW_IMAGE_CAP + 5}) g")
    target = PostgresTarget("bank", pg_dsn)
    try:
        yield target
    finally:
        target.close()


def _images(target: PostgresTarget, sql: str, *params: Any) -> dict[str, Any]:
    (statement,) = target.preview(Change((Statement(sql, tuple(params)),)), mode="rollback",
                                  sample_rows=5, statement_timeout_ms=5_000)
    images = statement["row_images"]
    assert isinstance(images, dict)
    return images


def test_single_row_update_shows_its_row_before_and_after(target: PostgresTarget) -> None:
    """The issue's example: which row, and its value before and after; nothing changed."""
    images = _images(target, "UPDATE accounts SET balance = balance - %s WHERE id = %s", 10, 1)
    assert images["status"] == "captured" and images["key"] == ["id"]
    assert images["total"] == 1 and images["truncated"] is False
    (row,) = images["rows"]
    assert row["key"] == {"id": 1} and row["op"] == "update"
    assert row["before"] == {"id": 1, "owner": "ann", "balance": "100"}
    assert row["after"] == {"id": 1, "owner": "ann", "balance": "90"}
    assert row["changed"] == ["balance"]
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone() == (100,)


def test_multi_row_update_and_delete(target: PostgresTarget) -> None:
    """Every matched row, in key order; a delete's rows have no after-image."""
    images = _images(target, "UPDATE accounts SET owner = upper(owner) WHERE balance < %s", 60)
    assert [r["key"]["id"] for r in images["rows"]] == [2, 3]
    assert [r["after"]["owner"] for r in images["rows"]] == ["BOB", "CY"]
    deleted = _images(target, "DELETE FROM accounts a WHERE a.id >= 2")
    assert [(r["op"], r["key"], r["after"]) for r in deleted["rows"]] == [
        ("delete", {"id": 2}, None), ("delete", {"id": 3}, None)]
    assert deleted["rows"][0]["before"]["owner"] == "bob"


def test_insert_and_upsert(target: PostgresTarget) -> None:
    """Inserted rows are marked; an upsert shows the row it updates before and after."""
    inserted = _images(target, "INSERT INTO accounts (id, owner, balance) VALUES (%s, %s, 1)",
                       9, "dee")
    assert [(r["op"], r["before"], r["after"]) for r in inserted["rows"]] == [
        ("insert", None, {"id": 9, "owner": "dee", "balance": "1"})]
    upsert = _images(target, "INSERT INTO accounts (id, owner, balance) VALUES (1, 'ann', 5), "
                     "(4, 'eve', 6) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
    assert [(r["op"], r["key"]["id"], r["changed"]) for r in upsert["rows"]] == [
        ("update", 1, ["balance"]), ("insert", 4, ["balance", "id", "owner"])]
    ignored = _images(target, "INSERT INTO accounts (id, owner, balance) VALUES (1, 'x', 5), "
                      "(4, 'eve', 6) ON CONFLICT DO NOTHING")
    assert [(r["op"], r["key"]["id"]) for r in ignored["rows"]] == [("insert", 4)]


def test_composite_primary_key(target: PostgresTarget) -> None:
    """A key of several columns, in the key's own order."""
    images = _images(target, "UPDATE holdings SET qty = qty + 1 WHERE acct = 1")
    assert images["key"] == ["sym", "acct"]
    assert [r["key"] for r in images["rows"]] == [{"sym": "X", "acct": 1},
                                                   {"sym": "Y", "acct": 1}]
    assert [r["after"]["qty"] for r in images["rows"]] == [6, 7]


def test_what_cannot_be_imaged_says_why(target: PostgresTarget) -> None:
    """No key, keys a sequence makes, a subquery: count only, with the reason."""
    nokey = _images(target, "UPDATE events SET msg = 'z'")
    assert nokey["status"] == "unavailable" and "no primary key" in nokey["reason"]
    serial = _images(target, "INSERT INTO serials (v) VALUES (1)")
    assert serial["status"] == "unavailable" and "sequence" in serial["reason"]
    sub = _images(target, "DELETE FROM accounts WHERE id IN (SELECT acct FROM holdings)")
    assert sub["status"] == "unavailable" and "subquery" in sub["reason"]
    (cte,) = target.preview(Change((Statement(
        "WITH d AS (DELETE FROM accounts WHERE id = 3 RETURNING *) SELECT * FROM d"),)),
        mode="rollback", sample_rows=5, statement_timeout_ms=5_000)
    assert cte["row_images"]["status"] == "unavailable"
    assert "data-modifying WITH" in cte["row_images"]["reason"]
    several = _images(target, "UPDATE accounts a SET balance = 0 FROM holdings h "
                      "WHERE h.acct = a.id")
    assert several["status"] == "unavailable" and "several tables" in several["reason"]
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        version = conn.info.server_version
    if version >= 150000:
        merged = _images(target, "MERGE INTO accounts a USING holdings h "
                         "ON h.acct = a.id AND h.sym = 'Y' "
                         "WHEN MATCHED THEN UPDATE SET balance = 0")
        assert merged == {"status": "unavailable",
                          "reason": "MERGE is previewed by count only"}


def test_past_the_cap_a_sample_and_the_exact_count(target: PostgresTarget) -> None:
    """More rows than the cap: the first ones in key order, the total, and truncated."""
    images = _images(target, "UPDATE big SET v = 1")
    assert images["total"] == ROW_IMAGE_CAP + 5 and images["truncated"] is True
    assert images["shown"] == ROW_IMAGE_CAP == len(images["rows"])
    assert images["rows"][0]["key"] == {"id": 1}
    assert all(r["after"]["v"] == 1 for r in images["rows"])


def test_a_unique_index_over_not_null_columns_keys_a_table_without_a_primary_key(
        target: PostgresTarget) -> None:
    """The schema's own declaration names the rows; a unique index that admits NULLs
    does not, so that table is count only."""
    images = _images(target, "UPDATE tags SET v = v + 1")
    assert images["status"] == "captured" and images["key"] == ["name"]
    assert [(r["key"], r["after"]["v"]) for r in images["rows"]] == [
        ({"name": "blue"}, 3), ({"name": "red"}, 2)]
    nullable = _images(target, "UPDATE loose SET v = 2")
    assert nullable["status"] == "unavailable" and "no primary key" in nullable["reason"]


def test_keys_the_database_makes_are_read_back_by_the_statements_own_returning(
        target: PostgresTarget) -> None:
    """A sequence's keys cannot be named before the insert, but RETURNING names them after:
    the new rows are read back by those keys (the statement itself is unchanged)."""
    images = _images(target, "INSERT INTO serials (v) VALUES (%s), (%s) RETURNING id", 10, 20)
    assert images["status"] == "captured" and images["total"] == 2
    assert [(r["op"], r["after"]["v"]) for r in images["rows"]] == [("insert", 10),
                                                                    ("insert", 20)]
    starred = _images(target, "INSERT INTO serials (v) SELECT 7 RETURNING *")
    assert [r["after"]["v"] for r in starred["rows"]] == [7]
    unnamed = _images(target, "INSERT INTO serials (v) VALUES (1) RETURNING v")
    assert unnamed["status"] == "unavailable"
