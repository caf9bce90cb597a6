"""Preview caveats on a PostgreSQL target through real `marque harbour serve` and `marque
pilot serve`: a write to a table with a trigger is previewed with a `triggers` caveat, and
`caveats = "two_approvers"` seals it for two distinct approvers before its marque runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harbour import request_body, routing_toml, writes_delegated

from .test_effects_postgres import PG_ROUTING, PgStack

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


@pytest.fixture
def stack(tmp_path: Path, pg_dsn: str) -> Iterator[PgStack]:
    running = PgStack(tmp_path, pg_dsn)
    try:
        yield running
    finally:
        running.stop()


def test_a_trigger_caveat_needs_two_approvers_on_postgres(stack: PgStack) -> None:
    """The stored preview names the table's trigger; the Checkpoint needs two approvals;
    after both, the marque applies the debit."""
    strict = PG_ROUTING.replace("approvals = 1\n", 'approvals = 1\ncaveats = "two_approvers"\n')
    assert strict != PG_ROUTING
    stack.harbour.set_routing(strict)
    erin = stack.harbour.add("erin", "approver")
    asked = stack.call("POST", "/v1/requests", stack.alice,
                       json=request_body(DEBIT, request_id="caveat-1"))
    assert asked.status_code == 201, asked.text
    request = asked.json()
    assert request["state"] == "awaiting_approval", request
    preview = request["preview"]
    assert preview["caveats"] == ["triggers"]
    (caveat,) = preview["statements"][0]["preview_caveats"]
    assert caveat["detail"] == {"tables": [{"table": "public.accounts",
                                            "triggers": ["items_write_log"]}]}
    assert request["routing"]["approvals"] == 2
    assert request["checkpoint"]["body"]["routing"]["approvals"] == 2
    first = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob,
                       json={"reason": "checked"})
    assert first.status_code == 200 and first.json()["state"] == "awaiting_approval", first.text
    second = stack.call("POST", f"/v1/requests/{request['id']}/approve", erin,
                        json={"reason": "the trigger only logs"})
    assert second.status_code == 200, second.text
    prepared = stack.call("GET", f"/v1/requests/{request['id']}", stack.alice).json()
    assert prepared["state"] == "prepared", prepared
    marque = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice)
    assert marque.status_code == 200, marque.text
    outcome = stack.execute(marque.json()["marque"], "n1")
    assert outcome["status"] == "applied", outcome
    assert stack.balances() == {1: 90, 2: 100, 3: 100}


def test_ddl_that_cannot_run_in_a_transaction_is_named_not_a_server_error(
        stack: PgStack) -> None:
    """CREATE INDEX CONCURRENTLY through both services: the request waits for approval with
    a preview that did not run the statement and says why — never a 500."""
    stack.harbour.set_routing(routing_toml(writes_delegated(1)))
    asked = stack.call("POST", "/v1/requests", stack.alice, json=request_body(
        "CREATE INDEX CONCURRENTLY accounts_balance ON accounts (balance)",
        request_id="caveat-ddl"))
    assert asked.status_code == 201, asked.text
    request = asked.json()
    assert request["state"] == "awaiting_approval", request
    (statement,) = request["preview"]["statements"]
    assert statement["rows"] is None and request["preview"]["total_rows"] is None
    assert [c["code"] for c in statement["preview_caveats"]] == ["non_transactional_ddl"]
    assert statement["preview_caveats"][0]["detail"]["previewed"] is False
