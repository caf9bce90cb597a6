"""Routing configs with known answers (DESIGN §11.3): overlap at load, decisions per request.

Each case is one config: either refused at load for an overlap between two
named entries, or valid with a list of requests and their expected decisions.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.errors import AccountConfigInvalid, AccountDenied, AccountNoMatch, InvalidInput
from marque.harbour.routing import (
    BOOTSTRAP_PROFILE,
    Access,
    evaluate,
    evaluate_accesses,
    parse_config,
    require_permitted,
)
from marque.harbour.routing.overlap import ALL, OPERATIONS, Box, Region, intersection_witness

DIMS = ("principal", "target", "resource", "operation")


def _value(v: Any) -> str:
    if v == "*":
        return '"*"'
    return json.dumps(v)


def E(principal: Any, target: Any, resource: Any, operation: Any, outcome: str,
      except_: list[tuple[Any, Any, Any, Any]] | None = None, **extra: Any) -> str:
    """One [[entry]] as TOML."""
    lines = ["[[entry]]", f"principal = {_value(principal)}", f"target = {_value(target)}",
             f"resource = {_value(resource)}", f"operation = {_value(operation)}",
             f'outcome = "{outcome}"']
    for key, value in extra.items():
        lines.append(f"{key} = {json.dumps(value)}")
    if except_:
        tables = ", ".join(
            "{ " + ", ".join(f"{d} = {_value(x)}" for d, x in zip(DIMS, ex, strict=True)) + " }"
            for ex in except_
        )
        lines.append(f"except = [{tables}]")
    return "\n".join(lines) + "\n"


@dataclass
class Ask:
    """A request and its expected decision."""

    principal: str
    statements: list[str]
    outcome: str
    code: str | None = None
    target: str = "prod"
    dialect: str = "postgres"
    approvals: int = 0
    self_approval: bool = False
    max_ttl_seconds: int | None = None


@dataclass
class Case:
    name: str
    entries: list[str]
    overlap: tuple[int, int] | None = None  # the entry indexes a refusal must name
    asks: list[Ask] = field(default_factory=list)


R, W = "SELECT * FROM t", "UPDATE t SET x = 1"
ALLOWED, DENIED, NO_MATCH = "allow", "account_denied", "account_no_match"


def allow(p: str, sql: list[str], **kw: Any) -> Ask:
    return Ask(p, sql, "allow", **kw)


def deny(p: str, sql: list[str], **kw: Any) -> Ask:
    return Ask(p, sql, "deny", "account_denied", **kw)


def nomatch(p: str, sql: list[str], **kw: Any) -> Ask:
    return Ask(p, sql, "deny", "account_no_match", **kw)


def delegate(p: str, sql: list[str], approvals: int = 1, **kw: Any) -> Ask:
    return Ask(p, sql, "delegate", None, approvals=approvals, **kw)


CASES = [
    # -- overlaps through "*" ------------------------------------------------------------
    Case("star-vs-finite-principal", [E("*", "*", "*", "*", "allow"),
                                      E(["bob"], "*", "*", "*", "deny")], overlap=(0, 1)),
    Case("star-target-vs-finite-target", [E(["alice"], "*", ["public.t"], ["write"], "allow"),
                                          E(["alice"], ["prod"], ["public.t"], "*", "delegate")],
         overlap=(0, 1)),
    Case("star-resource-future-tables", [E("*", "*", "*", ["read"], "allow"),
                                         E("*", "*", ["public.secret"], ["read"], "deny")],
         overlap=(0, 1)),
    Case("overlap-named-by-the-later-pair", [E(["alice"], "*", "*", ["read"], "allow"),
                                             E(["bob"], "*", "*", ["read"], "deny"),
                                             E("*", ["prod"], "*", ["read"], "delegate")],
         overlap=(0, 2)),
    # -- overlaps through finite lists -------------------------------------------------------
    Case("finite-lists-share-one-member", [E(["alice", "bob"], "*", "*", "*", "allow"),
                                           E(["bob", "carol"], "*", "*", "*", "deny")],
         overlap=(0, 1)),
    Case("finite-lists-disjoint", [E(["alice", "bob"], "*", "*", "*", "allow"),
                                   E(["carol"], "*", "*", "*", "deny")],
         asks=[allow("bob", [W]), deny("carol", [R]), nomatch("dave", [R])]),
    Case("disjoint-on-operation-alone", [E("*", "*", "*", ["read"], "allow"),
                                         E("*", "*", "*", ["write", "ddl"], "deny")],
         asks=[allow("anyone", [R]), deny("anyone", [W]), nomatch("anyone", ["CALL p()"])]),
    Case("disjoint-on-resource-alone", [E("*", "*", ["public.a"], "*", "allow"),
                                        E("*", "*", ["public.b"], "*", "deny")],
         asks=[allow("x", ["SELECT * FROM a"]), deny("x", ["DELETE FROM b"]),
               nomatch("x", ["SELECT * FROM c"])]),
    # -- exclusions that cancel an overlap exactly ----------------------------------------------
    Case("except-cancels-exactly", [
        E("*", "*", "*", "*", "allow", except_=[(["bob"], "*", "*", "*")]),
        E(["bob"], "*", "*", "*", "deny")],
        asks=[allow("alice", [W]), deny("bob", [R]), allow("newcomer", [R])]),
    Case("except-union-covers-the-deny", [
        E("*", "*", "*", "*", "allow", except_=[(["bob"], "*", "*", ["read"]),
                                                (["bob"], "*", "*", ["write", "ddl", "other"])]),
        E(["bob"], "*", "*", "*", "deny")],
        asks=[deny("bob", [W]), allow("carol", [W])]),
    Case("except-over-covers", [
        E("*", "*", "*", "*", "allow", except_=[("*", ["prod"], "*", "*")]),
        E(["bob"], ["prod"], ["public.t"], ["write"], "deny")],
        asks=[deny("bob", [W]), nomatch("bob", [R]), allow("bob", [W], target="dev")]),
    Case("except-on-the-deny-side", [
        E(["alice"], "*", ["public.t"], "*", "allow"),
        E("*", "*", "*", "*", "deny", except_=[(["alice"], "*", ["public.t"], "*")])],
        asks=[allow("alice", [W]), deny("alice", ["SELECT * FROM u"]), deny("bob", [R])]),
    Case("both-sides-except", [
        E("*", "*", "*", "*", "allow", except_=[(["alice"], "*", "*", "*")]),
        E(["alice", "bob"], "*", "*", "*", "deny", except_=[(["bob"], "*", "*", "*")])],
        asks=[deny("alice", [R]), allow("bob", [R])]),
    Case("star-except-star-resource-then-the-table", [
        E("*", "*", "*", ["read"], "allow", except_=[("*", "*", ["public.secret"], "*")]),
        E("*", "*", ["public.secret"], ["read"], "deny")],
        asks=[allow("x", [R]), deny("x", ["SELECT * FROM secret"]),
              deny("x", ["SELECT f()"])]),
    Case("closed-operations-except-all-four", [
        E("*", "*", "*", "*", "allow", except_=[("*", "*", "*", ["read", "write", "ddl",
                                                                 "other"])]),
        E("*", "*", "*", "*", "deny")],
        asks=[deny("x", [R])]),
    # -- exclusions that leave part of an overlap -------------------------------------------------
    Case("partial-except-leaves-a-member", [
        E("*", "*", "*", "*", "allow", except_=[(["bob"], "*", "*", "*")]),
        E(["bob", "carol"], "*", "*", "*", "deny")], overlap=(0, 1)),
    Case("partial-except-one-dimension", [
        E("*", "*", "*", "*", "allow", except_=[("*", "*", "*", ["write"])]),
        E(["bob"], "*", "*", ["write", "ddl"], "deny")], overlap=(0, 1)),
    Case("except-names-only-todays-members", [
        E("*", "*", "*", "*", "allow", except_=[(["alice", "bob"], "*", "*", "*")]),
        E("*", ["prod"], "*", "*", "deny")], overlap=(0, 1)),
    Case("except-narrower-target", [
        E("*", "*", "*", "*", "allow", except_=[(["bob"], ["prod"], "*", "*")]),
        E(["bob"], "*", "*", "*", "deny")], overlap=(0, 1)),
    Case("open-principals-except-all-named", [
        E("*", "*", "*", ["read"], "allow", except_=[(["a", "b", "c"], "*", "*", "*")]),
        E("*", "*", "*", ["read"], "delegate")], overlap=(0, 1)),
    # -- future members of "*" -----------------------------------------------------------------
    Case("future-principal-and-table", [
        E("*", "*", "*", ["read"], "allow"), E("*", "*", "*", ["write"], "delegate")],
        asks=[allow("hired-tomorrow", ["SELECT * FROM created_tomorrow"], target="new-db"),
              delegate("hired-tomorrow", ["DELETE FROM created_tomorrow"])]),
    Case("finite-lists-exclude-future-members", [
        E(["alice"], ["prod"], ["public.t"], ["read"], "allow")],
        asks=[allow("alice", [R]), nomatch("bob", [R]), nomatch("alice", [R], target="dev"),
              nomatch("alice", ["SELECT * FROM u"]), nomatch("alice", ["SELECT 1"])]),
    # -- same-outcome overlaps, strictest terms -----------------------------------------------
    Case("same-outcome-overlap-is-fine", [
        E("*", "*", "*", ["write"], "delegate", approvals=2, max_ttl="2h", self_approval=True),
        E(["bob"], "*", ["public.t"], ["write"], "delegate", approvals=3, max_ttl="30m")],
        asks=[delegate("bob", [W], approvals=3, max_ttl_seconds=1800),
              delegate("alice", [W], approvals=2, self_approval=True, max_ttl_seconds=7200),
              nomatch("bob", [R])]),
    Case("strictest-across-statements", [
        E("*", "*", ["public.a"], ["write"], "delegate", approvals=2, max_ttl="1h"),
        E("*", "*", ["public.b"], ["write"], "delegate", approvals=1, max_ttl="1d",
          self_approval=True),
        E("*", "*", "*", ["read"], "allow")],
        asks=[delegate("x", ["DELETE FROM a", "DELETE FROM b"], approvals=2,
                       max_ttl_seconds=3600),
              delegate("x", ["DELETE FROM b", "SELECT * FROM a"], approvals=1,
                       self_approval=True, max_ttl_seconds=86400)]),
    # -- no-match vs deny, multi-statement combination --------------------------------------------
    Case("deny-beats-no-match-and-is-distinct", [
        E(["alice"], "*", ["public.t"], ["read"], "allow"),
        E(["bob"], "*", "*", "*", "deny")],
        asks=[nomatch("carol", [R]), deny("bob", [R]), nomatch("alice", [W]),
              allow("alice", [R, "SELECT x FROM t"]),
              nomatch("alice", [R, "SELECT * FROM u"]),
              deny("bob", [R, "SELECT * FROM u"])]),
    Case("one-statement-denied-denies-the-request", [
        E("*", "*", ["public.t"], "*", "allow"), E("*", "*", ["public.x"], "*", "deny")],
        asks=[deny("a", [R, "SELECT * FROM t JOIN x ON true"]),
              deny("a", ["SELECT * FROM t", "SELECT * FROM u", "DELETE FROM x"])]),
    Case("allow-plus-delegate-delegates", [
        E("*", "*", "*", ["read"], "allow"),
        E("*", "*", "*", ["write", "ddl"], "delegate", approvals=2)],
        asks=[delegate("a", [R, W], approvals=2), allow("a", [R, R]),
              nomatch("a", [R, "CALL p()"])]),
    # -- SQL that cannot be classified is "other" on "*" -----------------------------------------
    Case("unclassifiable-is-other", [
        E("*", "*", "*", ["read", "write"], "allow"),
        E("*", "*", "*", ["other"], "delegate", approvals=2)],
        asks=[delegate("a", ["this is not sql"], approvals=2),
              delegate("a", ["COPY t FROM PROGRAM 'x'"], approvals=2),
              delegate("a", ["DO $$ BEGIN END $$"], approvals=2),
              allow("a", [W])]),
    Case("other-with-no-entry-is-no-match", [E("*", "*", "*", ["read", "write", "ddl"],
                                               "allow")],
         asks=[nomatch("a", ["SELEC broken"]), nomatch("a", ["PRAGMA writable_schema = 1"],
                                                        dialect="sqlite")]),
    Case("any-resource-tuple-against-finite-denies", [
        E("*", "*", "*", ["read"], "allow", except_=[("*", "*", ["public.hr"], "*")])],
        asks=[nomatch("a", ["SELECT f()"]), allow("a", [R]), nomatch("a", ["SELECT * FROM hr"])]),
    Case("sqlite-resources", [E("*", ["lite"], ["main.t"], "*", "allow"),
                              E("*", ["lite"], ["main.u"], "*", "deny")],
         asks=[allow("a", [W], target="lite", dialect="sqlite"),
               deny("a", ["DELETE FROM u"], target="lite", dialect="sqlite"),
               nomatch("a", [W], target="lite")]),
]


def _config_text(case: Case) -> str:
    return "\n".join(case.entries)


def test_there_are_at_least_thirty_configs() -> None:
    """The table is the issue's minimum size."""
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_config_has_its_known_answers(case: Case) -> None:
    """Refused naming both overlapping entries, or every request decided as expected."""
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    if case.overlap is not None:
        with pytest.raises(AccountConfigInvalid) as caught:
            parse_config(_config_text(case))
        assert caught.value.code == "account_config_invalid"
        assert caught.value.detail["entries"] == list(case.overlap)
        first, second = case.overlap
        assert f"entry[{first}]" in caught.value.message
        assert f"entry[{second}]" in caught.value.message
        return
    config = parse_config(_config_text(case))
    assert case.asks, "a valid case needs requests to decide"
    for ask in case.asks:
        decision = evaluate(config, ask.principal, ask.target, ask.statements, ask.dialect)
        got = (decision.outcome, decision.code, decision.approvals, decision.self_approval,
               decision.max_ttl_seconds)
        want = (ask.outcome, ask.code, ask.approvals, ask.self_approval, ask.max_ttl_seconds)
        assert got == want, (ask, decision.to_dict())
        assert decision.config_cid == config.config_cid


def test_config_order_never_resolves_an_overlap() -> None:
    """The same two overlapping entries are refused in either order (no first-match)."""
    a, b = E("*", "*", "*", "*", "allow"), E(["bob"], "*", "*", "*", "deny")
    for text in (a + b, b + a):
        with pytest.raises(AccountConfigInvalid):
            parse_config(text)


# -- the decision value ------------------------------------------------------------------------


def test_decision_records_every_tuple_and_matching_entry() -> None:
    """Per-tuple outcomes and entry indexes, the config CID, and all_read."""
    config = parse_config(E("*", "*", "*", ["read"], "allow")
                          + E("*", "*", ["public.t"], ["write"], "delegate"))
    decision = evaluate(config, "alice", "prod", ["UPDATE t SET x = (SELECT y FROM u)"],
                        "postgres")
    assert decision.to_dict()["tuples"] == [
        {"statement": 0, "operation": "write", "resource": "public.t", "outcome": "delegate",
         "entries": [1]},
        {"statement": 0, "operation": "read", "resource": "public.u", "outcome": "allow",
         "entries": [0]},
    ]
    assert decision.all_read is False
    assert decision.to_dict()["config_cid"] == config.config_cid
    reads = evaluate(config, "alice", "prod", ["SELECT * FROM t", "SELECT nextval('s')"],
                     "postgres")
    assert reads.outcome == "allow" and reads.all_read is True


def test_require_permitted_raises_the_typed_refusal() -> None:
    """account_denied and account_no_match are distinct errors; allow/delegate pass."""
    config = parse_config(E(["alice"], "*", "*", ["read"], "allow")
                          + E(["bob"], "*", "*", "*", "deny"))
    with pytest.raises(AccountDenied) as denied:
        require_permitted(evaluate(config, "bob", "prod", [R], "postgres"))
    assert denied.value.code == "account_denied"
    assert denied.value.detail["config_cid"] == config.config_cid
    with pytest.raises(AccountNoMatch) as unmatched:
        require_permitted(evaluate(config, "carol", "prod", [R], "postgres"))
    assert unmatched.value.code == "account_no_match"
    ok = evaluate(config, "alice", "prod", [R], "postgres")
    assert require_permitted(ok) is ok


def test_bootstrap_profile_reads_allowed_everything_else_one_approver() -> None:
    """The bootstrap profile: read → allow; write, ddl, other → delegate to one approver."""
    for sql, outcome in [(R, "allow"), (W, "delegate"), ("DROP TABLE t", "delegate"),
                         ("CALL p()", "delegate"), ("SELECT f()", "allow")]:
        decision = evaluate(BOOTSTRAP_PROFILE, "anyone", "any", [sql], "postgres")
        assert decision.outcome == outcome
        assert decision.approvals == (1 if outcome == "delegate" else 0)
        assert decision.self_approval is False


def test_evaluation_needs_statements() -> None:
    """An empty request is a usage error, not a vacuous allow."""
    with pytest.raises(InvalidInput):
        evaluate(BOOTSTRAP_PROFILE, "a", "t", [], "postgres")
    with pytest.raises(InvalidInput):
        evaluate(BOOTSTRAP_PROFILE, "a", "t", "SELECT 1", "postgres")
    with pytest.raises(InvalidInput):
        evaluate_accesses(BOOTSTRAP_PROFILE, "a", "t", [[]])


def test_evaluate_accesses_takes_classified_tuples() -> None:
    """The same decision from tuples classified elsewhere."""
    decision = evaluate_accesses(BOOTSTRAP_PROFILE, "a", "t", [[Access("read", "public.t")],
                                                              [Access("ddl", "*")]])
    assert decision.outcome == "delegate" and not decision.all_read


# -- the overlap test against brute force -----------------------------------------------------

_NAMES = ["a", "b", "c"]
_FRESH = ["fresh-1", "fresh-2"]  # members no config names: the open universe's future


def _selector(draw_from: list[str]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(ALL), st.frozensets(st.sampled_from(draw_from), min_size=1,
                                                 max_size=2))


_box = st.builds(Box, _selector(_NAMES), _selector(_NAMES), _selector(_NAMES),
                 _selector(sorted(OPERATIONS)))
_region = st.builds(Region, _box, st.lists(_box, max_size=2).map(tuple))


def _members(selector: Any, universe: list[str]) -> list[str]:
    return universe if selector is ALL else sorted(selector)


def _contains(region: Region, point: tuple[str, ...]) -> bool:
    def inside(box: Box) -> bool:
        return all(s is ALL or v in s for s, v in zip(box.selectors, point, strict=True))

    return inside(region.box) and not any(inside(e) for e in region.exclusions)


@settings(max_examples=300, deadline=None)
@given(_region, _region)
def test_overlap_agrees_with_brute_force_over_a_larger_universe(a: Region, b: Region) -> None:
    """The symbolic answer equals enumeration over named plus never-named members."""
    open_universe = _NAMES + _FRESH
    brute = any(
        _contains(a, point) and _contains(b, point)
        for point in itertools.product(open_universe, open_universe, open_universe,
                                       sorted(OPERATIONS))
    )
    witness = intersection_witness(a, b)
    assert (witness is not None) == brute
    if witness is not None:
        assert a.contains(witness) and b.contains(witness)
