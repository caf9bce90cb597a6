"""Routing config parsing (DESIGN §11.3): strict, and identified by the CID of its meaning."""

from __future__ import annotations

import pytest

from marque.cid import cid
from marque.errors import AccountConfigInvalid
from marque.harbour.routing import (
    BOOTSTRAP_PROFILE,
    BOOTSTRAP_PROFILE_TOML,
    parse_config,
    parse_duration,
)

GOOD = """\
[[entry]]
principal = ["alice"]
target = "*"
resource = ["public.orders"]
operation = ["write"]
outcome = "delegate"
"""

BASE = """\
principal = "*"
target = "*"
resource = "*"
operation = "*"
"""


def entry(body: str, selectors: str = BASE) -> str:
    return "[[entry]]\n" + selectors + body


REFUSED = [
    pytest.param("[[entry]\nprincipal = 1", "not valid TOML", id="malformed-toml"),
    pytest.param('principal = "*"\n', "principal", id="top-level-unknown-key"),
    pytest.param("", "at least one", id="no-entries"),
    pytest.param('version = "marque-routing/0.2"\n' + GOOD, "version", id="wrong-version"),
    pytest.param("entry = 3\n", "entry", id="entry-not-tables"),
    pytest.param(entry('outcome = "allow"\nprincipals = ["a"]\n'), "entry[0].principals",
                 id="unknown-entry-key"),
    pytest.param(entry(""), "entry[0].outcome", id="missing-outcome"),
    pytest.param(entry('outcome = "allow"\n', 'principal = "*"\ntarget = "*"\n'
                       'resource = "*"\n'), "entry[0].operation", id="missing-dimension"),
    pytest.param(entry('outcome = "permit"\n'), "entry[0].outcome", id="unknown-outcome"),
    pytest.param(entry("outcome = 1\n"), "entry[0].outcome", id="outcome-not-string"),
    pytest.param(entry('outcome = "allow"\n', BASE.replace('principal = "*"', "principal = []")),
                 "entry[0].principal", id="empty-list"),
    pytest.param(entry('outcome = "allow"\n', BASE.replace('target = "*"', 'target = "prod"')),
                 "entry[0].target", id="bare-string-not-list"),
    pytest.param(entry('outcome = "allow"\n', BASE.replace('target = "*"', 'target = ["*"]')),
                 "entry[0].target[0]", id="star-inside-list"),
    pytest.param(entry('outcome = "allow"\n', BASE.replace('target = "*"', "target = [1]")),
                 "entry[0].target[0]", id="name-not-string"),
    pytest.param(entry('outcome = "allow"\n',
                       BASE.replace('operation = "*"', 'operation = ["select"]')),
                 "entry[0].operation[0]", id="unknown-operation"),
    pytest.param(entry('outcome = "allow"\n',
                       BASE.replace('resource = "*"', 'resource = ["orders"]')),
                 "entry[0].resource[0]", id="unqualified-resource"),
    pytest.param(entry('outcome = "allow"\n',
                       BASE.replace('resource = "*"', 'resource = ["a.b.c"]')),
                 "entry[0].resource[0]", id="three-part-resource"),
    pytest.param(entry('outcome = "allow"\napprovals = 2\n'), "entry[0].approvals",
                 id="approvals-on-allow"),
    pytest.param(entry('outcome = "deny"\nmax_ttl = "1h"\n'), "entry[0].max_ttl",
                 id="max-ttl-on-deny"),
    pytest.param(entry('outcome = "allow"\nself_approval = true\n'), "entry[0].self_approval",
                 id="self-approval-on-allow"),
    pytest.param(entry('outcome = "delegate"\napprovals = "2"\n'), "entry[0].approvals",
                 id="approvals-string"),
    pytest.param(entry('outcome = "delegate"\napprovals = 0\n'), "entry[0].approvals",
                 id="approvals-zero"),
    pytest.param(entry('outcome = "delegate"\napprovals = true\n'), "entry[0].approvals",
                 id="approvals-bool"),
    pytest.param(entry('outcome = "delegate"\napprovals = 1.0\n'), "entry[0].approvals",
                 id="approvals-float"),
    pytest.param(entry('outcome = "delegate"\nself_approval = "no"\n'),
                 "entry[0].self_approval", id="self-approval-string"),
    pytest.param(entry('outcome = "delegate"\nmax_ttl = "2 hours"\n'), "entry[0].max_ttl",
                 id="duration-words"),
    pytest.param(entry('outcome = "delegate"\nmax_ttl = "0s"\n'), "entry[0].max_ttl",
                 id="duration-zero"),
    pytest.param(entry('outcome = "delegate"\nmax_ttl = "1.5h"\n'), "entry[0].max_ttl",
                 id="duration-fraction"),
    pytest.param(entry('outcome = "delegate"\nmax_ttl = 90\n'), "entry[0].max_ttl",
                 id="duration-number"),
    pytest.param(entry('outcome = "delegate"\nmax_ttl = "1h30m"\n'), "entry[0].max_ttl",
                 id="duration-compound"),
    pytest.param(entry('outcome = "allow"\nexcept = {principal = "*"}\n'), "entry[0].except",
                 id="except-not-list"),
    pytest.param(entry('outcome = "allow"\nexcept = [{principal = "*", target = "*", '
                       'resource = "*"}]\n'), "entry[0].except[0].operation",
                 id="except-missing-dimension"),
    pytest.param(entry('outcome = "allow"\nexcept = [{principal = "*", target = "*", '
                       'resource = "*", operation = "*", outcome = "deny"}]\n'),
                 "entry[0].except[0].outcome", id="except-unknown-key"),
    pytest.param(entry('outcome = "allow"\nexcept = [{principal = [], target = "*", '
                       'resource = "*", operation = "*"}]\n'), "entry[0].except[0].principal",
                 id="except-empty-list"),
    pytest.param(GOOD + entry('outcome = "allow"\nnote = "x"\n'), "entry[1].note",
                 id="second-entry-unknown-key"),
]


@pytest.mark.parametrize(("text", "where"), REFUSED)
def test_invalid_configs_are_refused_naming_where(text: str, where: str) -> None:
    """Each malformed config is account_config_invalid, and the message says where."""
    with pytest.raises(AccountConfigInvalid) as caught:
        parse_config(text)
    assert caught.value.code == "account_config_invalid"
    assert where in caught.value.message


def test_non_utf8_bytes_are_refused() -> None:
    """An unreadable config is refused, not treated as empty."""
    with pytest.raises(AccountConfigInvalid):
        parse_config(b"\xff\xfe[[entry]]")
    assert parse_config(GOOD.encode()).config_cid == parse_config(GOOD).config_cid


def test_a_good_config_parses_with_defaults() -> None:
    """A delegate without terms gets approvals 1, no self-approval, no ttl cap."""
    config = parse_config(GOOD)
    (only,) = config.entries
    assert (only.outcome, only.approvals, only.self_approval, only.max_ttl_seconds) == (
        "delegate", 1, False, None)
    assert config.text == GOOD


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200),
                                               ("1d", 86400), ("120m", 7200)])
def test_durations(text: str, seconds: int) -> None:
    """Ns, Nm, Nh, Nd."""
    assert parse_duration(text) == seconds


# -- identity -------------------------------------------------------------------------------


def test_config_cid_is_the_cid_of_the_canonical_form() -> None:
    """config_cid = CID(to_canonical()), whose shape is documented and versioned."""
    config = parse_config(GOOD)
    assert config.config_cid == cid(config.to_canonical())
    assert config.to_canonical() == {
        "version": "marque-routing/0.1",
        "entries": [{"principal": ["alice"], "target": "*", "resource": ["public.orders"],
                     "operation": ["write"], "except": [], "outcome": "delegate",
                     "approvals": 1, "self_approval": False, "max_ttl_seconds": None}],
    }


def test_spelling_does_not_change_the_cid_but_meaning_does() -> None:
    """Defaults spelled out, list order, duplicates, comments, "120m" vs "2h" are one config."""
    a = parse_config(GOOD.replace('outcome = "delegate"', 'outcome = "delegate"\nmax_ttl = "2h"')
                     .replace('["alice"]', '["alice", "bob"]'))
    b = parse_config('version = "marque-routing/0.1"\n# a comment\n'
                     + GOOD.replace('outcome = "delegate"',
                                    'outcome = "delegate"\napprovals = 1\nself_approval = false\n'
                                    'max_ttl = "120m"')
                     .replace('["alice"]', '["bob", "alice", "bob"]'))
    assert a.config_cid == b.config_cid
    all_four = parse_config(GOOD.replace('["write"]', '["read", "write", "ddl", "other"]'))
    star = parse_config(GOOD.replace('["write"]', '"*"'))
    assert all_four.config_cid == star.config_cid
    for changed in (GOOD.replace("alice", "alicia"), GOOD.replace('"delegate"', '"allow"'),
                    GOOD.replace('outcome = "delegate"', 'outcome = "delegate"\napprovals = 2'),
                    GOOD.replace('outcome = "delegate"',
                                 'outcome = "delegate"\nself_approval = true')):
        assert parse_config(changed).config_cid != parse_config(GOOD).config_cid


def test_bootstrap_profile_is_pinned() -> None:
    """The bootstrap profile's CID never changes: it is adopted and recorded by it."""
    assert parse_config(BOOTSTRAP_PROFILE_TOML).config_cid == BOOTSTRAP_PROFILE.config_cid
    assert BOOTSTRAP_PROFILE.config_cid == (
        "sha256:0b3947935868b9d318a325735a76795f2111f30dbb79ad307d63c2e232859c9b"
    )
    outcomes = {(tuple(e.to_canonical()["operation"]), e.outcome, e.approvals)
                for e in BOOTSTRAP_PROFILE.entries}
    assert outcomes == {(("read",), "allow", 0), (("ddl", "other", "write"), "delegate", 1)}
