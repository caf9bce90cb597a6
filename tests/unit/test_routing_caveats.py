"""Routing's ``caveats`` term (DESIGN §11.3): ``show`` or ``two_approvers``, strict, in the
config's identity only when set, combined strictly, applied once the preview is known."""

from __future__ import annotations

import pytest

from marque.errors import AccountConfigInvalid
from marque.harbour.routing import (
    BOOTSTRAP_PROFILE,
    BOOTSTRAP_PROFILE_TOML,
    approvals_with_caveats,
    evaluate,
    parse_config,
)

SELECT = 'principal = "*"\ntarget = "*"\nresource = "*"\n'


def config(*entries: str) -> str:
    return "".join(f"[[entry]]\n{SELECT}{e}" for e in entries)


READS = 'operation = ["read"]\noutcome = "allow"\n'
WRITES = 'operation = ["write"]\noutcome = "delegate"\n'
WITH_CAVEATS = {"statements": [{"preview_caveats": [{"code": "triggers"}]}]}
WITHOUT = {"statements": [{"preview_caveats": []}]}


@pytest.mark.parametrize("value", ['"three_approvers"', '"SHOW"', "2", "true", '["show"]'])
def test_an_unknown_caveats_value_is_refused(value: str) -> None:
    """Anything but "show" or "two_approvers" is account_config_invalid naming the key."""
    with pytest.raises(AccountConfigInvalid) as caught:
        parse_config(config(WRITES + f"caveats = {value}\n"))
    assert caught.value.detail["where"] == "entry[0].caveats"


def test_caveats_on_an_allow_entry_is_refused() -> None:
    """Like approvals, caveats is a delegate's term only."""
    with pytest.raises(AccountConfigInvalid) as caught:
        parse_config(config(READS + 'caveats = "two_approvers"\n'))
    assert caught.value.detail["where"] == "entry[0].caveats"


def test_the_default_keeps_every_existing_cid() -> None:
    """Spelling out "show" changes nothing; the bootstrap profile keeps its CID; setting
    "two_approvers" is a change of meaning and of CID."""
    plain = parse_config(config(WRITES))
    spelled = parse_config(config(WRITES + 'caveats = "show"\n'))
    strict = parse_config(config(WRITES + 'caveats = "two_approvers"\n'))
    assert plain.config_cid == spelled.config_cid
    assert "caveats" not in plain.to_canonical()["entries"][0]
    assert strict.to_canonical()["entries"][0]["caveats"] == "two_approvers"
    assert strict.config_cid != plain.config_cid
    assert parse_config(BOOTSTRAP_PROFILE_TOML).config_cid == BOOTSTRAP_PROFILE.config_cid


def test_two_approvers_raises_only_a_delegate_with_caveats() -> None:
    """The sealed approvals become max(approvals, 2) when the preview names a caveat."""
    strict = parse_config(config(READS, WRITES + 'caveats = "two_approvers"\n'))
    decision = evaluate(strict, "alice", "bank", ["UPDATE t SET a = 1"], "sqlite")
    assert (decision.approvals, decision.caveats) == (1, "two_approvers")
    assert decision.to_dict()["caveats"] == "two_approvers"
    assert approvals_with_caveats(decision, WITH_CAVEATS).approvals == 2
    assert approvals_with_caveats(decision, WITHOUT).approvals == 1
    three = parse_config(config(READS, WRITES + 'approvals = 3\ncaveats = "two_approvers"\n'))
    decided = evaluate(three, "alice", "bank", ["UPDATE t SET a = 1"], "sqlite")
    assert approvals_with_caveats(decided, WITH_CAVEATS).approvals == 3
    shown = parse_config(config(READS, WRITES))
    decided = evaluate(shown, "alice", "bank", ["UPDATE t SET a = 1"], "sqlite")
    assert approvals_with_caveats(decided, WITH_CAVEATS).approvals == 1


def test_the_strictest_caveats_term_wins_when_entries_combine() -> None:
    """A request touching two delegate entries takes two_approvers if either sets it."""
    strict = parse_config(
        "[[entry]]\nprincipal = \"*\"\ntarget = \"*\"\nresource = [\"main.a\"]\n"
        + WRITES + 'caveats = "two_approvers"\n'
        + "[[entry]]\nprincipal = \"*\"\ntarget = \"*\"\nresource = [\"main.b\"]\n" + WRITES)
    decision = evaluate(strict, "alice", "bank", ["UPDATE a SET x = 1", "UPDATE b SET x = 1"],
                        "sqlite")
    assert decision.caveats == "two_approvers"
