"""`marque undo`: a verified change put back row by row, fenced on what it wrote.

Through real `harbour serve` and `pilot serve`, on a SQLite and a PostgreSQL
target with the same tables: a change is requested, approved and executed;
its undo is filed with `marque undo` (a subprocess), approved and executed the
same way, and the target's rows are read directly. Each test has its own table,
so the cases share one stack without sharing rows.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support.harbour import (
    HarbourWorld,
    execute_marque,
    wait_for_request,
)
from support.pgcluster import create_database, drop_database
from test_harbour_cli_flow import cli

from marque.pilot.setup import add_target
from marque.target.image_capture import ROW_IMAGE_CAP


class UndoStack(HarbourWorld):
    """The Harbourmaster serving; the Pilot joined, serving `bank` (SQLite) and `pgbank`
    (PostgreSQL); alice and carol (requesters), bob (approver)."""

    def __init__(self, root: Path, pg_dsn: str) -> None:
        self.pg_dsn = pg_dsn
        super().__init__(root, third_account=False,
                         principals=(("carol", "requester"), ("bob", "approver")),
                         keyed=frozenset({"carol"}), serve=True)
        self.carol = self.harbour.tokens["carol"]

    def before_join(self) -> None:
        add_target(self.bank.home, "pgbank", self.pg_dsn)

    # -- the target, read and written directly ------------------------------------------

    def write(self, target: str, *sql: str) -> None:
        if target == "pgbank":
            with psycopg.connect(self.pg_dsn, autocommit=True) as pg:
                for one in sql:
                    pg.execute(one)
            return
        conn = sqlite3.connect(self.bank.bank)
        with conn:
            for one in sql:
                conn.execute(one)
        conn.close()

    def rows(self, target: str, table: str) -> list[tuple[Any, ...]]:
        query = f"SELECT * FROM {table} ORDER BY 1, 2"
        if target == "pgbank":
            with psycopg.connect(self.pg_dsn, autocommit=True) as pg:
                return [tuple(r) for r in pg.execute(query).fetchall()]
        conn = sqlite3.connect(self.bank.bank)
        try:
            return [tuple(r) for r in conn.execute(query).fetchall()]
        finally:
            conn.close()

    def table(self, target: str, columns: str, *inserts: str) -> str:
        """A fresh table of this test (its name), with ``inserts`` run into it."""
        name = "t_" + uuid.uuid4().hex[:10]
        self.write(target, f"CREATE TABLE {name} ({columns})",
                   *(f"INSERT INTO {name} VALUES {values}" for values in inserts))
        return name

    # -- requests -----------------------------------------------------------------------

    def ask(self, target: str, *sql: str) -> dict[str, Any]:
        answer = self.server.call("POST", "/v1/requests", self.alice, json={
            "request_id": "undo-test-" + uuid.uuid4().hex[:8], "pilot_id": "p1",
            "target": target,
            "change": {"statements": [{"sql": s, "params": []} for s in sql]},
            "budget": {"executions": 1, "max_rows": 500}, "ttl_seconds": 600})
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        assert body["state"] == "awaiting_approval", body
        return body

    def approve(self, rq: str) -> dict[str, Any]:
        approved = cli("approve", rq, "--json", token=self.bob, harbour=self.server.url)
        assert approved.returncode == 0, approved
        assert approved.json["state"] == "prepared", approved.json
        body: dict[str, Any] = approved.json
        return body

    def execute(self, rq: str) -> dict[str, Any]:
        """Run the request's marque through the Pilot; the outcome, once reported."""
        found = self.server.call("GET", f"/v1/requests/{rq}/marque", self.alice)
        assert found.status_code == 200, found.text
        outcome = execute_marque(self.bank.url, self.bank.holder_key, found.json()["marque"],
                                 "n-" + uuid.uuid4().hex[:8])
        wait_for_request(self.server.call, rq, self.alice,
                         lambda r: r["state"] not in ("prepared", "executing"), 30)
        return outcome

    def applied(self, target: str, *sql: str) -> dict[str, Any]:
        """A request for ``sql`` approved and applied: its request object."""
        asked = self.ask(target, *sql)
        self.approve(asked["id"])
        outcome = self.execute(asked["id"])
        assert outcome["status"] == "applied", outcome
        return self.show(asked["id"])

    def show(self, rq: str) -> dict[str, Any]:
        shown = self.server.call("GET", f"/v1/requests/{rq}", self.alice)
        assert shown.status_code == 200, shown.text
        body: dict[str, Any] = shown.json()
        return body

    def undo(self, rq: str, *args: str, token: str | None = None) -> Any:
        return cli("undo", rq, *args, token=token or self.alice, harbour=self.server.url)

    def undone(self, rq: str) -> dict[str, Any]:
        """``marque undo`` filed, approved and executed: the undo's request object."""
        filed = self.undo(rq, "--json", "--reason", "put it back")
        assert filed.returncode == 0, filed
        assert filed.json["state"] == "awaiting_approval", filed.json
        assert filed.json["rolls_back"] == rq
        self.approve(filed.json["id"])
        outcome = self.execute(filed.json["id"])
        assert outcome["status"] == "applied", outcome
        return self.show(filed.json["id"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin_dsn: str) -> Iterator[UndoStack]:
    pg_name, pg_dsn = create_database(pg_admin_dsn)
    running = UndoStack(tmp_path_factory.mktemp("undo"), pg_dsn)
    try:
        yield running
    finally:
        running.stop()
        drop_database(pg_admin_dsn, pg_name)


BOTH = pytest.mark.parametrize("target", ["bank", "pgbank"])
ACCOUNTS = "id INT PRIMARY KEY, balance INT, note TEXT"


@BOTH
@pytest.mark.parametrize(("columns", "inserts", "sql"), [
    (ACCOUNTS, ("(1, 100, NULL)", "(2, 100, 'x')"),
     ("UPDATE {t} SET balance = balance - 10 WHERE id = 1",)),
    (ACCOUNTS, ("(1, 100, NULL)", "(2, 50, 'x')", "(3, 7, 'y')"),
     ("UPDATE {t} SET balance = 0, note = 'zeroed' WHERE id >= 2",)),
    (ACCOUNTS, ("(1, 100, NULL)", "(2, 50, 'x')"), ("DELETE FROM {t} WHERE id = 2",)),
    (ACCOUNTS, ("(1, 100, NULL)",),
     ("INSERT INTO {t} (id, balance, note) VALUES (7, 70, NULL), (8, 80, 'new')",)),
    ("acct INT, sym TEXT, qty INT, PRIMARY KEY (sym, acct)",
     ("(1, 'X', 5)", "(1, 'Y', 6)", "(2, 'X', 7)"),
     ("UPDATE {t} SET qty = qty * 2 WHERE acct = 1",)),
    (ACCOUNTS, ("(1, 100, NULL)", "(2, 50, 'x')"),
     ("UPDATE {t} SET balance = balance + 1 WHERE id = 1",
      "UPDATE {t} SET balance = balance * 3 WHERE id = 1", "DELETE FROM {t} WHERE id = 2")),
], ids=["single-update", "multi-update", "delete", "insert", "composite-key",
        "two-statements-one-row"])
def test_an_undo_puts_every_row_back(stack: UndoStack, target: str, columns: str,
                                     inserts: tuple[str, ...], sql: tuple[str, ...]) -> None:
    """The change applied, then `marque undo`, approved and executed: the table holds
    exactly what it held before, the undo names each row by key, and the original ends
    rolled_back."""
    table = stack.table(target, columns, *inserts)
    before = stack.rows(target, table)
    original = stack.applied(target, *(s.format(t=table) for s in sql))
    assert stack.rows(target, table) != before
    undo = stack.undone(original["id"])
    assert undo["state"] == "verified", undo
    assert stack.rows(target, table) == before
    assert stack.show(original["id"])["state"] == "rolled_back"
    assert undo["undo"]["of"] == original["id"] and undo["undo"]["conflicts"] == []
    # Every row the original's images named is one fenced statement of the undo.
    imaged = sum(len((s["row_images"] or {}).get("rows") or [])
                 for s in original["preview"]["statements"])
    assert len(undo["change"]["statements"]) == len(undo["undo"]["rows"]) <= imaged
    assert all(s["expect_rows"] == 1 for s in undo["change"]["statements"])


#: Typed columns on each target, a row of them, and a change of every one.
TYPED = {
    "pgbank": ("id INT PRIMARY KEY, doc jsonb, raw json, ints int[], tags text[], blob bytea, "
               "amount numeric(40,20), at timestamptz",
               "(1, '{\"a\": [1, null], \"p\": 10.50}', '{ \"b\":1,  \"b\":2 }', "
               "'{1,NULL}', '{\"a b\",\"\"}', '\\x00ff', "
               "12345678901234567890.12345678901234567890, '2026-12-04 18:00:00.5+00')",
               "doc = '{}', raw = '[]', ints = '{}', tags = NULL, blob = '\\x01', "
               "amount = 1, at = at + interval '1 day'"),
    "bank": ("id INTEGER PRIMARY KEY, blob BLOB, amount TEXT",
             "(1, x'00ff', '12345678901234567890.12345678901234567890')",
             "blob = x'01', amount = '1'"),
}


@BOTH
def test_an_undo_puts_typed_values_back_byte_for_byte(stack: UndoStack, target: str) -> None:
    """jsonb, json, arrays, bytes, a 40-digit numeric, a timestamptz: the undo, filed,
    approved and executed through the Pilot, gives the row its exact text back; `requests
    show` prints the bytes tagged."""
    columns, row, change = TYPED[target]
    table = stack.table(target, columns, row)

    def exact() -> list[Any]:
        if target == "bank":
            return stack.rows(target, table)  # bytes and text, as SQLite holds them
        with psycopg.connect(stack.pg_dsn, autocommit=True) as pg:
            return pg.execute(f"SELECT {table}::text FROM {table}").fetchall()

    before = exact()
    original = stack.applied(target, f"UPDATE {table} SET {change} WHERE id = 1")
    images = original["preview"]["statements"][0]["row_images"]
    assert images["rows"][0]["before"]["blob"] == {"$bytes": "AP8="}
    shown = cli("requests", "show", original["id"], token=stack.alice, harbour=stack.server.url)
    assert "| blob | bytes:AP8= → bytes:AQ==" in shown.stdout, shown.stdout
    alice = _console(stack, stack.alice)
    try:
        page = alice.get(f"/requests/{original['id']}").text
    finally:
        alice.close()
    assert "bytes:AP8=" in page and "bytes:AQ==" in page  # the console's diff table
    undo = stack.undone(original["id"])
    assert undo["state"] == "verified", undo
    assert exact() == before


@BOTH
def test_a_row_changed_since_is_an_undo_conflict_at_preview(stack: UndoStack,
                                                            target: str) -> None:
    """Row 2 is changed by someone else after the original ran: `marque undo` is refused
    with undo_conflict (exit 4) naming row 2 by key; the undo request is stored failed,
    and no row is touched — not even row 1, which could have been restored."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied(target, f"UPDATE {table} SET balance = 0")
    stack.write(target, f"UPDATE {table} SET balance = 55 WHERE id = 2")
    refused = stack.undo(original["id"], "--json")
    assert refused.returncode == 4, refused
    error = refused.json["error"]
    assert error["code"] == "undo_conflict", error
    assert error["detail"]["conflicts"] == [
        {"statement": 0, "table": table, "key": {"id": 2}, "op": "restore"}]
    assert "id=2" in error["message"]
    assert stack.rows(target, table) == [(1, 0, None), (2, 55, None)]
    failed = stack.show(error["detail"]["id"])
    assert failed["state"] == "failed" and failed["failure"]["code"] == "undo_conflict"
    assert failed["undo"]["conflicts"][0]["key"] == {"id": 2}
    assert stack.show(original["id"])["state"] == "verified"
    human = stack.undo(original["id"])
    assert human.returncode == 4 and "undo_conflict" in human.stderr


@BOTH
def test_a_row_changed_after_approval_aborts_the_whole_undo(stack: UndoStack,
                                                            target: str) -> None:
    """The row changes between the undo's approval and its execution: the Pilot's fenced
    statement touches no row, the whole attempt rolls back (row 1 keeps its value too),
    the outcome is aborted_not_applied with undo_conflict, and the undo ends failed naming
    the key; the original stays verified (rollback_failed carries it)."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied(target, f"UPDATE {table} SET balance = balance - 1")
    filed = stack.undo(original["id"], "--json")
    assert filed.returncode == 0 and filed.json["state"] == "awaiting_approval", filed
    stack.approve(filed.json["id"])
    stack.write(target, f"UPDATE {table} SET note = 'later' WHERE id = 2")
    outcome = stack.execute(filed.json["id"])
    assert outcome["status"] == "aborted_not_applied", outcome
    assert outcome["error"]["code"] == "undo_conflict", outcome
    assert stack.rows(target, table) == [(1, 99, None), (2, 99, "later")]
    undo = stack.show(filed.json["id"])
    assert undo["state"] == "failed" and undo["failure"]["code"] == "undo_conflict", undo
    assert [c["key"] for c in undo["undo"]["conflicts"]] == [{"id": 2}]
    assert stack.show(original["id"])["state"] == "rollback_failed"


@BOTH
def test_a_change_between_preview_and_approval_is_an_undo_conflict(stack: UndoStack,
                                                                   target: str) -> None:
    """The row changes after the undo was previewed, before it is approved: the approval's
    re-preview finds the fence broken, issues no marque, and answers undo_conflict."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)")
    original = stack.applied(target, f"DELETE FROM {table} WHERE id = 1")
    filed = stack.undo(original["id"], "--json")
    assert filed.returncode == 0, filed
    stack.write(target, f"INSERT INTO {table} VALUES (1, 5, 'someone else')")
    refused = cli("approve", filed.json["id"], "--json", token=stack.bob,
                  harbour=stack.server.url)
    assert refused.returncode == 4, refused
    assert refused.json["error"]["code"] == "undo_conflict", refused.json
    shown = stack.show(filed.json["id"])
    assert shown["state"] == "failed" and shown["marque"] is None
    assert shown["undo"]["conflicts"][0]["key"] == {"id": 1}
    assert stack.rows(target, table) == [(1, 5, "someone else")]


@BOTH
def test_an_undo_of_a_capped_or_keyless_preview_is_refused(stack: UndoStack,
                                                           target: str) -> None:
    """Past the cap the rest were counted, not imaged; a table without a key is counted
    only: either way `marque undo` is undo_unavailable (exit 3) and files nothing."""
    big = stack.table(target, "id INT PRIMARY KEY, v INT",
                      ", ".join(f"({i}, 0)" for i in range(1, ROW_IMAGE_CAP + 3)))
    capped = stack.applied(target, f"UPDATE {big} SET v = 1")
    keyless = stack.table(target, "msg TEXT", "('a')")
    counted = stack.applied(target, f"UPDATE {keyless} SET msg = 'b'")
    for original, words in ((capped, "counted, not imaged"), (counted, "no primary key")):
        refused = stack.undo(original["id"], "--json")
        assert refused.returncode == 3, refused
        assert refused.json["error"]["code"] == "undo_unavailable", refused.json
        assert words in refused.json["error"]["message"]
        assert stack.show(original["id"])["state"] == "verified"
    listed = stack.server.call("GET", "/v1/requests", stack.alice).json()["requests"]
    assert not any(r["rolls_back"] in (capped["id"], counted["id"]) for r in listed)


def test_only_who_may_see_the_original_may_undo_it(stack: UndoStack) -> None:
    """Carol, another requester, is answered exactly as for a missing id (404 over HTTP,
    not_found from the CLI); asking twice answers the same undo (200, nothing new)."""
    table = stack.table("bank", ACCOUNTS, "(1, 100, NULL)")
    original = stack.applied("bank", f"UPDATE {table} SET balance = 1")
    foreign = stack.server.call("POST", f"/v1/requests/{original['id']}/undo", stack.carol,
                                json={})
    assert foreign.status_code == 404, foreign.text
    missing = stack.server.call("POST", "/v1/requests/rq_0000/undo", stack.carol, json={})
    assert foreign.json()["code"] == missing.json()["code"] == "not_found"
    by_cli = stack.undo(original["id"], "--json", token=stack.carol)
    assert by_cli.returncode == 2 and by_cli.json["error"]["code"] == "not_found", by_cli
    first = stack.server.call("POST", f"/v1/requests/{original['id']}/undo", stack.alice,
                              json={"reason": "oops"})
    again = stack.server.call("POST", f"/v1/requests/{original['id']}/undo", stack.alice,
                              json={"reason": "oops"})
    assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["request_id"] == f"undo-{original['id']}"
    human = cli("requests", "show", first.json()["id"], token=stack.alice,
                harbour=stack.server.url)
    assert human.returncode == 0, human
    assert f"undo of {original['id']}: 1 row(s)" in human.stdout
    assert "balance | 1 → 100" in human.stdout


def _console(stack: UndoStack, token: str) -> httpx.Client:
    """A console session logged in through its form (its cookie kept)."""
    client = httpx.Client(base_url=stack.server.url, timeout=60)
    form = client.get("/login")
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert match, form.text
    answer = client.post("/login", data={"token": token, "csrf": match.group(1)})
    assert answer.status_code == 303, answer.text
    return client


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


def test_the_console_offers_the_requester_an_undo_button(stack: UndoStack) -> None:
    """The requester's page of an applied change has the undo form; posting it (with its
    CSRF token) files the undo and shows its page, with the rows it puts back. The
    approver is offered no undo, a form without the CSRF token is refused, and a
    change whose rows were counted only says why it cannot be undone."""
    table = stack.table("bank", ACCOUNTS, "(1, 100, NULL)")
    original = stack.applied("bank", f"UPDATE {table} SET balance = 7")
    alice, bob = _console(stack, stack.alice), _console(stack, stack.bob)
    try:
        assert 'data-testid="undo-form"' not in bob.get(f"/requests/{original['id']}").text
        page = alice.get(f"/requests/{original['id']}")
        assert page.status_code == 200 and 'data-testid="undo-form"' in page.text
        forged = alice.post(f"/requests/{original['id']}/undo", data={"reason": "x"})
        assert forged.status_code == 403, forged.text
        filed = alice.post(f"/requests/{original['id']}/undo",
                           data={"csrf": _csrf(page.text), "reason": "wrong balance"},
                           follow_redirects=False)
        assert filed.status_code == 303, filed.text
        undo_page = alice.get(filed.headers["location"])
        assert 'data-testid="undo-rows"' in undo_page.text
        assert "The undo is filed as this request" in undo_page.text
        listed = stack.server.call("GET", "/v1/requests", stack.alice).json()["requests"]
        undo = next(r for r in listed if r["rolls_back"] == original["id"])
        assert undo["state"] == "awaiting_approval" and undo["reason"] == "wrong balance"
        assert undo["id"] in filed.headers["location"]
        keyless = stack.table("bank", "msg TEXT", "('a')")
        counted = stack.applied("bank", f"UPDATE {keyless} SET msg = 'b'")
        refused = alice.get(f"/requests/{counted['id']}").text
        assert 'data-testid="undo-unavailable"' in refused and "no primary key" in refused
    finally:
        alice.close()
        bob.close()
