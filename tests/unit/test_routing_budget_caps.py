"""Routing budget caps (docs/harbour.md, "Account routing"): ``max_rows`` and
``max_executions`` on an allow or delegate entry cap the budget a request may ask for."""

from __future__ import annotations

import pytest

from marque.errors import AccountConfigInvalid, AccountDenied
from marque.harbour.routing import (
    BOOTSTRAP_PROFILE_TOML,
    evaluate,
    parse_config,
    require_permitted,
    within_caps,
)

CAPPED = """
[[entry]]
principal = ["claude"]
target = "*"
resource = "*"
operation = ["write"]
outcome = "delegate"
max_rows = 5
max_executions = 1

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = ["write"]
outcome = "delegate"
max_rows = 100

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = ["read"]
outcome = "allow"
"""
WRITE = "UPDATE accounts SET balance = 0 WHERE id = 1"


def test_the_strictest_cap_of_the_entries_that_route_a_request_holds() -> None:
    config = parse_config(CAPPED)
    decision = evaluate(config, "claude", "bank", [WRITE], "sqlite")
    assert (decision.max_rows, decision.max_executions) == (5, 1)
    assert within_caps(decision, 5, 1) is decision
    other = evaluate(config, "alice", "bank", [WRITE], "sqlite")
    assert (other.max_rows, other.max_executions) == (100, None)
    assert within_caps(other, 100, 50) is other
    read = evaluate(config, "claude", "bank", ["SELECT 1 FROM accounts"], "sqlite")
    assert read.max_rows is None and within_caps(read, 10_000, 9) is read


def test_a_budget_over_the_cap_is_denied_and_says_which_cap() -> None:
    decision = evaluate(parse_config(CAPPED), "claude", "bank", [WRITE], "sqlite")
    denied = within_caps(decision, 6, 2)
    assert denied.outcome == "deny" and denied.code == "account_denied"
    assert denied.to_dict()["over_cap"] == ("max_rows 6 is over the routing cap of 5; "
                                            "executions 2 is over the routing cap of 1")
    with pytest.raises(AccountDenied, match="max_rows 6 is over the routing cap of 5"):
        require_permitted(denied)


def test_caps_leave_a_config_without_them_as_it_was() -> None:
    plain = parse_config(BOOTSTRAP_PROFILE_TOML)
    assert all("max_rows" not in e for e in plain.to_canonical()["entries"])
    decision = evaluate(plain, "claude", "bank", [WRITE], "sqlite")
    assert "max_rows" not in decision.to_dict() and "over_cap" not in decision.to_dict()
    capped = parse_config(CAPPED)
    assert capped.to_canonical()["entries"][0]["max_rows"] == 5
    assert capped.config_cid != parse_config(CAPPED.replace("max_rows = 5", "max_rows = 6")
                                             ).config_cid


@pytest.mark.parametrize("line, where", [
    ("max_rows = 0", "entry[0].max_rows"),
    ("max_rows = true", "entry[0].max_rows"),
    ('max_executions = "3"', "entry[0].max_executions"),
])
def test_a_cap_that_is_not_a_positive_integer_is_refused(line: str, where: str) -> None:
    text = CAPPED.replace("max_rows = 5\nmax_executions = 1", line, 1)
    with pytest.raises(AccountConfigInvalid) as refused:
        parse_config(text)
    assert refused.value.detail["where"] == where


def test_a_deny_entry_cannot_set_a_cap() -> None:
    text = ('[[entry]]\nprincipal = "*"\ntarget = "*"\nresource = "*"\noperation = "*"\n'
            'outcome = "deny"\nmax_rows = 1\n')
    with pytest.raises(AccountConfigInvalid, match="a deny entry cannot set max_rows"):
        parse_config(text)
