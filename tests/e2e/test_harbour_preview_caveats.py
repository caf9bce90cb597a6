"""Preview caveats through real `marque harbour serve` and `marque pilot serve`: the stored
preview names what it cannot show, `requests show` prints it (and `--json` has it), and
`caveats = "two_approvers"` makes such a request wait for two distinct approvers."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import run_cli
from support.harbour import READS_ALLOWED, routing_toml, writes_delegated
from test_harbour_cli_flow import Stack, request_args

AUDITED = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
PLAIN = "UPDATE ledger SET note = 'x' WHERE id = 1"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path)
    try:
        conn = sqlite3.connect(running.bank.bank)
        with conn:
            conn.execute("CREATE TABLE audit (account INTEGER)")
            conn.execute("CREATE TRIGGER accounts_audit AFTER UPDATE ON accounts "
                         "BEGIN INSERT INTO audit VALUES (new.id); END")
            conn.execute("CREATE TABLE ledger (id INTEGER PRIMARY KEY, note TEXT)")
            conn.execute("INSERT INTO ledger VALUES (1, '')")
        conn.close()
        yield running
    finally:
        running.stop()


def _ask(stack: Stack, sql: str) -> dict[str, Any]:
    asked = stack.as_(stack.alice, *request_args(sql=sql))
    assert asked.returncode == 0, asked
    assert asked.json["state"] == "awaiting_approval", asked.json
    return asked.json


def test_the_stored_preview_names_its_caveats_and_the_cli_prints_them(stack: Stack) -> None:
    """A write to a table with a trigger: the preview names the trigger, under its
    preview_cid; `requests show` says the preview may not show everything."""
    request = _ask(stack, AUDITED)
    shown = stack.as_(stack.bob, "requests", "show", request["id"], "--json")
    assert shown.returncode == 0, shown
    preview = shown.json["preview"]
    assert preview["caveats"] == ["triggers"]
    (caveat,) = preview["statements"][0]["preview_caveats"]
    assert caveat["code"] == "triggers"
    assert caveat["detail"] == {"tables": [{"table": "main.accounts",
                                            "triggers": ["accounts_audit"]}]}
    assert shown.json["checkpoint"]["body"]["preview_cid"] == preview["preview_cid"]
    # Under the bootstrap profile caveats are only shown: one approver, as routed.
    assert shown.json["routing"]["caveats"] == "show"
    assert shown.json["checkpoint"]["body"]["routing"]["approvals"] == 1
    text = stack.as_(stack.bob, "requests", "show", request["id"])
    assert text.returncode == 0, text
    assert "This preview may not show everything: triggers" in text.stdout
    assert "caveat triggers: writes table(s) with triggers (main.accounts: accounts_audit)" \
        in text.stdout


def test_two_approvers_routing_needs_two_when_the_preview_has_caveats(stack: Stack) -> None:
    """caveats = "two_approvers" on the delegate entry: the request with a caveat is sealed
    for two distinct approvers (one approval leaves it waiting, the second issues its
    marque); a request whose preview has no caveat still needs one."""
    stack.harbour.set_routing(routing_toml(
        READS_ALLOWED, writes_delegated(1, caveats="two_approvers")))
    erin = stack.harbour.add("erin", "approver")
    cautious = _ask(stack, AUDITED)
    plain = _ask(stack, PLAIN)
    shown = stack.as_(stack.bob, "requests", "show", cautious["id"], "--json").json
    assert shown["routing"]["caveats"] == "two_approvers"
    assert shown["routing"]["approvals"] == 2
    assert shown["checkpoint"]["body"]["routing"]["approvals"] == 2
    first = stack.as_(stack.bob, "approve", cautious["id"], "--json")
    assert first.returncode == 0, first
    assert first.json["state"] == "awaiting_approval", first.json
    second = stack.as_(erin, "approve", cautious["id"], "--json")
    assert second.returncode == 0, second
    assert second.json["state"] == "prepared", second.json
    shown_plain = stack.as_(stack.bob, "requests", "show", plain["id"], "--json").json
    assert shown_plain["preview"]["caveats"] == []
    assert shown_plain["checkpoint"]["body"]["routing"]["approvals"] == 1
    one = stack.as_(stack.bob, "approve", plain["id"], "--json")
    assert one.returncode == 0 and one.json["state"] == "prepared", one
    text = stack.as_(stack.bob, "requests", "show", cautious["id"])
    assert "at least two when the preview has caveats" in text.stdout


def test_an_unknown_caveats_value_is_account_config_invalid(tmp_path: Path) -> None:
    """`routing check` refuses caveats = "three_approvers", naming the entry and key."""
    config = tmp_path / "bad.toml"
    config.write_text(routing_toml(READS_ALLOWED,
                                   writes_delegated(1, caveats="three_approvers")))
    checked = run_cli("harbour", "routing", "check", config, "--json")
    assert checked.returncode == 3, checked
    assert checked.json["error"]["code"] == "account_config_invalid"
    assert "entry[1].caveats" in checked.json["error"]["message"]
