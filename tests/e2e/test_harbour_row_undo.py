"""`marque undo --per-row`: each row put back on its own, an Effect Set with a receipt per row.

Through real `harbour serve` and `pilot serve` (the stack of test_harbour_undo),
on a SQLite and a PostgreSQL target: a change is applied, a row is changed by
someone else, and the per-row undo is filed, approved and executed — the rows
that still hold what the original wrote are put back, the changed one fails
alone as `undo_conflict`, named by key in the receipt, and the target's rows
are read directly. Asking twice, and asking both modes, are checked too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.pgcluster import create_database, drop_database
from test_harbour_cli_flow import cli
from test_harbour_undo import ACCOUNTS, BOTH, UndoStack, _console, _csrf


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin_dsn: str) -> Iterator[UndoStack]:
    pg_name, pg_dsn = create_database(pg_admin_dsn)
    running = UndoStack(tmp_path_factory.mktemp("rowundo"), pg_dsn)
    try:
        yield running
    finally:
        running.stop()
        drop_database(pg_admin_dsn, pg_name)


def _per_row(stack: UndoStack, rq: str) -> dict[str, Any]:
    """`marque undo --per-row` filed: the undo's request object (awaiting approval)."""
    filed = stack.undo(rq, "--per-row", "--json", "--reason", "row by row")
    assert filed.returncode == 0, filed
    body: dict[str, Any] = filed.json
    assert body["state"] == "awaiting_approval", body
    assert body["rolls_back"] == rq and body["request_id"] == f"undo-{rq}"
    assert "effect_set" in body["change"], body["change"]
    assert body["undo"]["mode"] == "per_row", body["undo"]
    return body


def _executed(stack: UndoStack, rq: str) -> tuple[dict[str, Any], dict[str, Any]]:
    stack.approve(rq)
    outcome = stack.execute(rq)
    return outcome, stack.show(rq)


@BOTH
def test_a_per_row_undo_puts_back_what_it_can_and_names_the_row_it_cannot(
        stack: UndoStack, target: str) -> None:
    """Three rows zeroed; row 2 changed by someone else since. The per-row undo's preview
    already shows row 2 in conflict; executed, rows 1 and 3 get their balance back, row 2
    keeps the later value, and the receipt fails that row alone as undo_conflict by key."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)", "(2, 100, 'x')", "(3, 30, NULL)")
    original = stack.applied(target, f"UPDATE {table} SET balance = 0")
    stack.write(target, f"UPDATE {table} SET balance = 55 WHERE id = 2")
    filed = _per_row(stack, original["id"])
    assert [c["key"] for c in filed["undo"]["conflicts"]] == [{"id": 2}]
    assert len(filed["undo"]["rows"]) == 3
    members = filed["preview"]["members"]
    assert all(m["fence"]["state"] == "present" and m["max_items"] == 1 for m in members)
    outcome, undo = _executed(stack, filed["id"])
    assert outcome["status"] == "applied", outcome
    assert stack.rows(target, table) == [(1, 100, None), (2, 55, "x"), (3, 30, None)]
    assert undo["state"] == "verified", undo
    receipt = undo["receipt"]
    assert receipt["status"] == "partial_failure", receipt
    assert receipt["failed_rows"] == [
        {"effect_id": "restore_1", "key": {"id": 2}, "code": "undo_conflict"}]
    assert sorted(s for states in receipt["row_states"].values() for s in states) == [
        "applied", "applied", "failed"]
    assert undo["undo"]["conflicts"] == [{"statement": 0, "table": table, "key": {"id": 2},
                                          "op": "restore", "effect_id": "restore_1"}]
    assert stack.show(original["id"])["state"] == "rolled_back"
    human = cli("requests", "show", filed["id"], token=stack.alice, harbour=stack.server.url)
    assert human.returncode == 0, human
    assert "row by row" in human.stdout and "id=2" in human.stdout
    assert "this row is not put back, the others are" in human.stdout


@BOTH
def test_a_per_row_undo_without_conflicts_puts_every_row_back(stack: UndoStack,
                                                              target: str) -> None:
    """An update, a delete and an insert in one change: the per-row undo (restore,
    reinsert, remove) leaves the table exactly as it was, every row applied."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)", "(2, 50, 'x')")
    before = stack.rows(target, table)
    original = stack.applied(target, f"UPDATE {table} SET balance = 1 WHERE id = 1",
                             f"DELETE FROM {table} WHERE id = 2",
                             f"INSERT INTO {table} VALUES (9, 90, 'new')")
    filed = _per_row(stack, original["id"])
    assert filed["undo"]["conflicts"] == []
    assert sorted(r["op"] for r in filed["undo"]["rows"]) == ["reinsert", "remove", "restore"]
    outcome, undo = _executed(stack, filed["id"])
    assert outcome["status"] == "applied", outcome
    assert stack.rows(target, table) == before
    assert undo["state"] == "verified" and undo["receipt"]["status"] == "applied", undo
    assert undo["receipt"]["failed_rows"] == [] and undo["undo"]["conflicts"] == []
    assert stack.show(original["id"])["state"] == "rolled_back"


def test_asking_twice_and_asking_both_modes(stack: UndoStack) -> None:
    """Asking for the per-row undo twice answers the same request (exit 0, nothing new);
    asking the all-or-nothing undo while it is active is refused (conflict, naming the
    active undo): one request id holds both modes. Filed under another request id, both
    exist, but once one is approved the other's approval is refused: the original moves to
    rolling_back once."""
    table = stack.table("bank", ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied("bank", f"UPDATE {table} SET balance = 3")
    first = _per_row(stack, original["id"])
    again = stack.undo(original["id"], "--per-row", "--json")
    assert again.returncode == 0 and again.json["id"] == first["id"], again
    again_human = stack.undo(original["id"], "--per-row")
    assert again_human.returncode == 0 and "already filed" in again_human.stdout
    other_mode = stack.undo(original["id"], "--json")
    assert other_mode.returncode != 0, other_mode
    assert other_mode.json["error"]["code"] == "conflict", other_mode.json
    assert "per-row undo" in other_mode.json["error"]["message"]
    assert other_mode.json["error"]["detail"]["id"] == first["id"]
    # Under another request id the all-or-nothing undo is filed too: only one can apply.
    second = stack.undo(original["id"], "--json", "--request-id", "undo-again")
    assert second.returncode == 0 and second.json["state"] == "awaiting_approval", second
    stack.approve(first["id"])
    refused = cli("approve", second.json["id"], "--json", token=stack.bob,
                  harbour=stack.server.url)
    assert refused.returncode != 0, refused
    assert stack.show(second.json["id"])["state"] != "prepared"
    assert stack.show(original["id"])["state"] == "rolling_back"
    outcome = stack.execute(first["id"])
    assert outcome["status"] == "applied", outcome
    assert stack.rows("bank", table) == [(1, 100, None), (2, 100, None)]


def test_the_console_offers_the_requester_both_undos(stack: UndoStack) -> None:
    """The requester's undo form has a second button, "Undo row by row"; posting it
    (mode=per_row) files the per-row undo and shows its page, which says it is per row;
    the approver's page of it says which request it compensates."""
    table = stack.table("bank", ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied("bank", f"UPDATE {table} SET balance = 8")
    alice, bob = _console(stack, stack.alice), _console(stack, stack.bob)
    try:
        page = alice.get(f"/requests/{original['id']}").text
        assert 'data-testid="undo-per-row"' in page and 'value="per_row"' in page
        filed = alice.post(f"/requests/{original['id']}/undo",
                           data={"csrf": _csrf(page), "reason": "by row", "mode": "per_row"},
                           follow_redirects=False)
        assert filed.status_code == 303, filed.text
        undo_page = alice.get(filed.headers["location"]).text
        assert "Per row: each row is its own member of an Effect Set" in undo_page
        listed = stack.server.call("GET", "/v1/requests", stack.alice).json()["requests"]
        undo = next(r for r in listed if r["rolls_back"] == original["id"])
        assert undo["id"] in filed.headers["location"]
        shown = stack.show(undo["id"])
        assert "effect_set" in shown["change"] and shown["undo"]["mode"] == "per_row"
        approver = bob.get(f"/requests/{undo['id']}").text
        assert 'data-testid="compensates"' in approver and original["id"] in approver
    finally:
        alice.close()
        bob.close()


def test_the_report_names_the_fenced_statement_in_a_field(stack: UndoStack) -> None:
    """An all-or-nothing undo whose row changed after its approval: the Pilot's outcome
    error carries detail.statement (not only its message), the request's execution keeps
    it, and the undo names the row by key from it."""
    table = stack.table("pgbank", ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied("pgbank", f"UPDATE {table} SET balance = balance - 1")
    filed = stack.undo(original["id"], "--json")
    assert filed.returncode == 0, filed
    stack.approve(filed.json["id"])
    stack.write("pgbank", f"UPDATE {table} SET note = 'later' WHERE id = 1")
    outcome = stack.execute(filed.json["id"])
    assert outcome["error"]["code"] == "undo_conflict", outcome
    # The undo's statements run last row first: row 1 is statement 1.
    assert outcome["error"]["detail"] == {"statement": 1}, outcome["error"]
    undo = stack.show(filed.json["id"])
    assert [e["error"].get("detail") for e in undo["executions"]] == [{"statement": 1}]
    assert undo["undo"]["conflicts"] == [
        {"statement": 1, "table": table, "key": {"id": 1}, "op": "restore"}]


@BOTH
def test_a_row_changed_after_approval_fails_alone_at_execution(stack: UndoStack,
                                                               target: str) -> None:
    """The per-row undo is previewed and approved with every row holding its fence; then
    row 1 changes. Apply admission does not make the whole set stale: the row's own
    transaction finds its fence broken under the write lock and fails it alone
    (undo_conflict), and row 2 is put back."""
    table = stack.table(target, ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied(target, f"UPDATE {table} SET balance = 5")
    filed = _per_row(stack, original["id"])
    assert filed["undo"]["conflicts"] == []
    stack.approve(filed["id"])
    stack.write(target, f"UPDATE {table} SET note = 'later' WHERE id = 1")
    outcome = stack.execute(filed["id"])
    assert outcome["status"] == "applied", outcome
    assert stack.rows(target, table) == [(1, 5, "later"), (2, 100, None)]
    undo = stack.show(filed["id"])
    assert [(f["key"], f["code"]) for f in undo["receipt"]["failed_rows"]] == [
        ({"id": 1}, "undo_conflict")]
    assert [c["key"] for c in undo["undo"]["conflicts"]] == [{"id": 1}]


def test_after_an_all_or_nothing_conflict_the_per_row_undo_puts_back_the_rest(
        stack: UndoStack) -> None:
    """The all-or-nothing undo is refused (undo_conflict, stored failed): its request id is
    free again, so `--per-row` files under the same `undo-<id>` and puts back the row that
    still can be; asking the all-or-nothing undo while that one is active is refused."""
    table = stack.table("bank", ACCOUNTS, "(1, 100, NULL)", "(2, 100, NULL)")
    original = stack.applied("bank", f"UPDATE {table} SET balance = 0")
    stack.write("bank", f"UPDATE {table} SET balance = 55 WHERE id = 2")
    refused = stack.undo(original["id"], "--json")
    assert refused.returncode == 4 and refused.json["error"]["code"] == "undo_conflict"
    filed = _per_row(stack, original["id"])
    assert filed["id"] != refused.json["error"]["detail"]["id"]
    again = stack.undo(original["id"], "--json")
    assert again.returncode == 2 and again.json["error"]["code"] == "conflict", again
    assert "the per-row undo" in again.json["error"]["message"]
    outcome, undo = _executed(stack, filed["id"])
    assert outcome["status"] == "applied", outcome
    assert stack.rows("bank", table) == [(1, 100, None), (2, 55, None)]
    assert [c["key"] for c in undo["undo"]["conflicts"]] == [{"id": 2}]
