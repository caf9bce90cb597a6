"""Approvers see every row they change, through real `harbour serve` and `pilot serve`.

One Harbourmaster (bootstrap profile: writes need one approval) and one joined
Pilot serving a SQLite ``bank`` and a PostgreSQL ``pgbank`` with the same
tables. Requests go in over HTTP; approvals and `requests show` run as `marque`
subprocesses. Every preview is a real rolled-back run on the real target.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.harbour import HarbourWorld, cli_json
from support.pgcluster import create_database, drop_database
from test_harbour_cli_flow import cli

from marque.pilot.setup import add_target
from marque.target.image_capture import ROW_IMAGE_CAP

TABLES = (
    "CREATE TABLE holdings (acct INT, sym TEXT, qty INT, PRIMARY KEY (sym, acct))",
    "INSERT INTO holdings VALUES (1, 'X', 5), (1, 'Y', 6), (2, 'X', 7)",
    "CREATE TABLE events (msg TEXT)",
    "INSERT INTO events VALUES ('a'), ('b')",
    "CREATE TABLE big (id INT PRIMARY KEY, v INT)",
    # No key of its own: its operator declares one (`marque pilot target row-key`).
    "CREATE TABLE lines (ref TEXT, n INT, amount INT)",
    "INSERT INTO lines VALUES ('a', 1, 10), ('a', 2, 20), ('b', 1, 5)",
)
BIG = ROW_IMAGE_CAP + 23


class DiffStack(HarbourWorld):
    """The Harbourmaster serving, the Pilot joined and serving both targets, alice (requester)
    and bob (approver)."""

    def __init__(self, root: Path, pg_dsn: str) -> None:
        self.pg_dsn = pg_dsn
        with psycopg.connect(pg_dsn, autocommit=True) as pg:
            pg.execute("CREATE TABLE accounts (id integer PRIMARY KEY, balance integer)")
            pg.execute("INSERT INTO accounts VALUES (1, 100), (2, 100), (3, 100)")
            for sql in TABLES:
                pg.execute(sql)
            pg.execute(f"INSERT INTO big SELECT g, 0 FROM generate_series(1, {BIG}) g")
        super().__init__(root, bank_sql=TABLES, serve=True)
        self.count = 0

    def before_join(self) -> None:
        conn = sqlite3.connect(self.bank.bank)
        with conn:
            conn.executemany("INSERT INTO big VALUES (?, 0)", [(i,) for i in range(1, BIG + 1)])
        conn.close()
        add_target(self.bank.home, "pgbank", self.pg_dsn)
        for name in ("bank", "pgbank"):
            declared = cli_json("pilot", "target", "row-key", "--home", self.bank.home, name,
                                "lines", "ref,n")
            assert (declared["columns"], declared["used"]) == (["ref", "n"], True), declared

    def ask(self, target: str, sql: str, *params: Any, max_rows: int = 500) -> dict[str, Any]:
        """POST a one-statement write request as alice; the request object answered."""
        self.count += 1
        answer = self.server.call("POST", "/v1/requests", self.alice, json={
            "request_id": f"diff-{self.count}", "pilot_id": "p1", "target": target,
            "change": {"statements": [{"sql": sql, "params": list(params)}]},
            "budget": {"executions": 1, "max_rows": max_rows}, "ttl_seconds": 600,
            "reason": "a test"})
        assert answer.status_code in (200, 201), answer.text
        body: dict[str, Any] = answer.json()
        assert body["state"] == "awaiting_approval", body
        return body

    def show(self, rq: str, *json_flag: str) -> Any:
        shown = cli("requests", "show", rq, *json_flag, token=self.alice,
                    harbour=self.server.url)
        assert shown.returncode == 0, shown
        return shown



@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin_dsn: str) -> Iterator[DiffStack]:
    pg_name, pg_dsn = create_database(pg_admin_dsn)
    running = DiffStack(tmp_path_factory.mktemp("row-diff"), pg_dsn)
    try:
        yield running
    finally:
        running.stop()
        drop_database(pg_admin_dsn, pg_name)


def _mark(target: str) -> str:
    return "%s" if target == "pgbank" else "?"


def _images(request: dict[str, Any], index: int = 0) -> dict[str, Any]:
    images: dict[str, Any] = request["preview"]["statements"][index]["row_images"]
    return images


BOTH = pytest.mark.parametrize("target", ["bank", "pgbank"])


@BOTH
def test_the_approval_is_the_diff(stack: DiffStack, target: str) -> None:
    """The issue's debit: the request shows row 1 at 100 before and 90 after, `requests
    show` prints it, the Checkpoint seals the diff's CID, and approving issues the marque."""
    asked = stack.ask(target, f"UPDATE accounts SET balance = balance - {_mark(target)} "
                      f"WHERE id = {_mark(target)}", 10, 1)
    images = _images(asked)
    assert images["status"] == "captured" and images["total"] == 1
    assert images["rows"] == [{"key": {"id": 1}, "op": "update",
                               "before": {"id": 1, "balance": 100},
                               "after": {"id": 1, "balance": 90}, "changed": ["balance"]}]
    shown = stack.show(asked["id"], "--json").json
    assert shown["preview"] == asked["preview"]
    body = shown["checkpoint"]["body"]
    assert body["version"] == "marque-checkpoint/0.2"
    assert body["diff_cid"] == asked["preview"]["diff_cid"]
    assert body["preview_cid"] == asked["preview"]["preview_cid"]
    human = stack.show(asked["id"]).stdout
    assert "1 row(s) of accounts, by key id:" in human
    assert "~ id=1 | balance | 100 → 90" in human
    approved = cli("approve", asked["id"], "--json", token=stack.bob, harbour=stack.server.url)
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved


@BOTH
@pytest.mark.parametrize(("sql", "check"), [
    ("UPDATE accounts SET balance = 0 WHERE id >= 2",
     lambda i: [(r["op"], r["key"]["id"], r["after"]["balance"]) for r in i["rows"]] == [
         ("update", 2, 0), ("update", 3, 0)]),
    ("DELETE FROM accounts WHERE id = 3",
     lambda i: [(r["op"], r["before"], r["after"]) for r in i["rows"]] == [
         ("delete", {"id": 3, "balance": 100}, None)]),
    ("INSERT INTO accounts (id, balance) VALUES (7, 70), (8, 80)",
     lambda i: [(r["op"], r["before"], r["after"]) for r in i["rows"]] == [
         ("insert", None, {"id": 7, "balance": 70}), ("insert", None, {"id": 8, "balance": 80})]),
    ("INSERT INTO accounts (id, balance) VALUES (2, 5), (9, 90) "
     "ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
     lambda i: [(r["op"], r["key"]["id"], r["changed"]) for r in i["rows"]] == [
         ("update", 2, ["balance"]), ("insert", 9, ["balance", "id"])]),
    ("UPDATE holdings SET qty = qty * 2 WHERE acct = 1",
     lambda i: i["key"] == ["sym", "acct"] and [r["key"] for r in i["rows"]] == [
         {"sym": "X", "acct": 1}, {"sym": "Y", "acct": 1}]),
    ("UPDATE events SET msg = 'z'",
     lambda i: i["status"] == "unavailable" and "no primary key" in i["reason"]),
    ("UPDATE big SET v = 1",
     lambda i: (i["total"], i["shown"], i["truncated"]) == (BIG, ROW_IMAGE_CAP, True)),
], ids=["multi-update", "delete", "insert", "upsert", "composite-key", "no-key", "cap"])
def test_every_kind_of_write_shows_its_rows(stack: DiffStack, target: str, sql: str,
                                            check: Callable[[dict[str, Any]], bool]) -> None:
    """Updates, deletes, inserts, upserts, a composite key, a table without a key (count
    only, said) and more rows than the cap (a sample and the exact count, said)."""
    asked = stack.ask(target, sql)
    images = _images(asked)
    assert check(images), images
    human = stack.show(asked["id"]).stdout
    if images["status"] != "captured":
        assert "rows not shown: table events has no primary key" in human
    elif images["truncated"]:
        assert f"showing {ROW_IMAGE_CAP} of {BIG} rows of big" in human


@BOTH
def test_an_over_budget_preview_is_not_approvable(stack: DiffStack, target: str) -> None:
    """rows > max_rows: `approve` refuses with preview_over_budget (exit 3) and stores
    nothing; `requests show` says why; a reject is still taken."""
    asked = stack.ask(target, "UPDATE accounts SET balance = balance + 1", max_rows=2)
    assert asked["preview"]["within_max_rows"] is False
    refused = cli("approve", asked["id"], "--json", token=stack.bob, harbour=stack.server.url)
    assert refused.returncode == 3, refused
    assert refused.json["error"]["code"] == "preview_over_budget", refused.json
    shown = stack.show(asked["id"], "--json").json
    assert shown["state"] == "awaiting_approval" and shown["resolutions"] == []
    assert "not approvable" in stack.show(asked["id"]).stdout
    rejected = cli("reject", asked["id"], "--reason", "too wide", "--json", token=stack.bob,
                   harbour=stack.server.url)
    assert rejected.returncode == 0 and rejected.json["state"] == "rejected", rejected


def _write_directly(stack: DiffStack, target: str, sql: str) -> None:
    if target == "pgbank":
        with psycopg.connect(stack.pg_dsn, autocommit=True) as pg:
            pg.execute(sql)
    else:
        conn = sqlite3.connect(stack.bank.bank)
        with conn:
            conn.execute(sql)
        conn.close()


@BOTH
def test_an_approval_never_applies_to_rows_it_did_not_see(stack: DiffStack,
                                                          target: str) -> None:
    """Row 2 changes between the preview and the approval: the approval re-previews, finds
    other before-images, issues no marque (revalidation_failed, diff_changed) and the
    request fails. Asking again gives another diff, a new Checkpoint and no approval."""
    sql = "UPDATE accounts SET balance = balance - 1 WHERE id = 2"
    _write_directly(stack, target, "UPDATE accounts SET balance = 100 WHERE id = 2")
    asked = stack.ask(target, sql)
    assert _images(asked)["rows"][0]["before"] == {"id": 2, "balance": 100}
    _write_directly(stack, target, "UPDATE accounts SET balance = 5 WHERE id = 2")
    refused = cli("approve", asked["id"], "--json", token=stack.bob, harbour=stack.server.url)
    assert refused.returncode == 3, refused
    assert refused.json["error"]["code"] == "revalidation_failed", refused.json
    assert "diff_changed" in refused.json["error"]["message"]
    shown = stack.show(asked["id"], "--json").json
    assert shown["state"] == "failed" and shown["marque"] is None
    again = stack.ask(target, sql)
    assert _images(again)["rows"][0]["before"] == {"id": 2, "balance": 5}
    assert again["preview"]["diff_cid"] != asked["preview"]["diff_cid"]
    assert again["checkpoint"]["cid"] != asked["checkpoint"]["cid"]
    assert again["resolutions"] == []


def test_a_pilot_away_at_approval_issues_nothing_and_keeps_the_approval(
        tmp_path: Path, pg_admin_dsn: str) -> None:
    """The approval that completes a Checkpoint cannot re-preview (the Pilot is down): it is
    answered pilot_unavailable, no marque is issued, the approval stays; once the Pilot is
    back, the same approval again issues the marque."""
    pg_name, pg_dsn = create_database(pg_admin_dsn)
    stack = DiffStack(tmp_path, pg_dsn)
    try:
        asked = stack.ask("bank", "UPDATE accounts SET balance = balance - 1 WHERE id = 3")
        stack.bank.stop()
        away = cli("approve", asked["id"], "--reason", "ok", "--json", token=stack.bob,
                   harbour=stack.server.url)
        assert away.returncode == 7, away
        assert away.json["error"]["code"] == "pilot_unavailable", away.json
        shown = stack.show(asked["id"], "--json").json
        assert shown["state"] == "awaiting_approval" and shown["marque"] is None
        assert [r["approver"] for r in shown["resolutions"]] == ["bob"]
        stack.bank.start(listen=f"127.0.0.1:{stack.port}")
        again = cli("approve", asked["id"], "--reason", "ok", "--json", token=stack.bob,
                    harbour=stack.server.url)
        assert again.returncode == 0 and again.json["state"] == "prepared", again
    finally:
        stack.stop()
        drop_database(pg_admin_dsn, pg_name)


@BOTH
def test_a_declared_row_key_is_the_diff_of_a_table_without_one(stack: DiffStack,
                                                              target: str) -> None:
    """`pilot target row-key` before `pilot serve`: a request on the keyless table shows its
    rows by the declared key, says so, and approving it (a re-preview through the Pilot)
    issues the marque."""
    asked = stack.ask(target, f"UPDATE lines SET amount = amount + 1 WHERE ref = "
                      f"{_mark(target)}", "a")
    images = _images(asked)
    assert (images["status"], images["key"], images["key_source"]) == (
        "captured", ["ref", "n"], "declared")
    assert [(r["key"], r["after"]["amount"]) for r in images["rows"]] == [
        ({"ref": "a", "n": 1}, 11), ({"ref": "a", "n": 2}, 21)]
    human = stack.show(asked["id"]).stdout
    assert "2 row(s) of lines, by key ref, n (declared in the Pilot's pilot.json" in human
    approved = cli("approve", asked["id"], "--json", token=stack.bob, harbour=stack.server.url)
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved


def test_a_merge_on_postgresql_is_the_diff(stack: DiffStack) -> None:
    """A MERGE that updates one row and inserts another: both shown, sealed and approvable."""
    asked = stack.ask("pgbank", "MERGE INTO accounts a USING (VALUES (1, 55), (4, 44)) "
                      "AS s(id, v) ON s.id = a.id WHEN MATCHED THEN UPDATE SET balance = s.v "
                      "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v)")
    images = _images(asked)
    assert [(r["op"], r["key"]["id"], r["after"]["balance"]) for r in images["rows"]] == [
        ("update", 1, 55), ("insert", 4, 44)]
    shown = stack.show(asked["id"], "--json").json
    assert shown["checkpoint"]["body"]["diff_cid"] == asked["preview"]["diff_cid"]
    approved = cli("approve", asked["id"], "--json", token=stack.bob, harbour=stack.server.url)
    assert approved.returncode == 0 and approved.json["state"] == "prepared", approved
