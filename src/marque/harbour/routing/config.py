"""Routing configs (DESIGN §11.3): TOML in, immutable entries out, or a refusal.

A config is a list of ``[[entry]]`` tables::

    version = "marque-routing/0.1"        # optional; no other value is accepted

    [[entry]]
    principal = ["alice", "bob"]          # a non-empty list of names, or "*"
    target    = "*"
    resource  = ["public.orders"]         # schema-qualified: "schema.table"
    operation = ["write", "ddl"]          # read | write | ddl | other, or "*"
    outcome   = "delegate"                # allow | deny | delegate
    approvals = 2                         # delegate only: distinct approvers (default 1)
    self_approval = false                 # delegate only (default false)
    max_ttl   = "2h"                      # delegate only: Ns, Nm, Nh or Nd (default: no cap)
    caveats   = "two_approvers"           # delegate only: "show" (default) or "two_approvers"
    max_rows  = 100                       # allow or delegate: the largest budget max_rows
    max_executions = 1                    # allow or delegate: the largest budget executions
    except = [                            # optional: tuples this entry does not select
      { principal = ["bob"], target = "*", resource = "*", operation = ["ddl"] },
    ]

Parsing is strict, because an invalid config must never be read as
permission: malformed TOML, a missing or unknown key at any level, a wrong
type, an empty list, ``"*"`` inside a list, a delegate-only key on an
``allow``/``deny`` entry, a bad duration, or no entries at all are each
refused with :class:`~marque.errors.AccountConfigInvalid` naming the entry
index and key (``entry[2].approvals``). So is any pair of entries with
different outcomes whose tuple sets intersect (``overlap.py``), decided over
the open universe — never resolved by order, specificity or deny-wins.

**Resources** are written ``schema.table`` and compared exactly as written;
write them lower-case, as the classifier reports unquoted names (DESIGN §11.3:
PostgreSQL folds them, SQLite ignores case). A config does not know a target's
dialect, so it cannot qualify a bare ``orders``: it is refused. Statements are
qualified by the classifier instead (``public.`` on PostgreSQL, ``main.`` on
SQLite; see ``classify.py``).

**Identity.** A config's CID is the CID of its canonical JSON form
(:meth:`RoutingConfig.to_canonical`): ``{version: "marque-routing/0.1",
entries: [...]}`` with entries in file order, each selector ``"*"`` or its
names sorted and de-duplicated (an ``operation`` list naming all four is
``"*"``), exclusions in file order, and for a delegate entry its effective
``approvals``, ``self_approval`` and ``max_ttl_seconds`` (``null`` for no cap)
— so spelling a default out, or ``"120m"`` for ``"2h"``, does not change the
identity, while any change of meaning does. ``caveats`` appears in the
canonical form only when it is not the default ``"show"``, so every config
written before it existed keeps its CID.

**Budget caps.** ``max_rows`` and ``max_executions`` (positive integers, on
an ``allow`` or ``delegate`` entry) cap the budget a request it selects may
ask for: a request asking more is denied (``account_denied``, with the cap
named), however it would otherwise be routed. They appear in the canonical
form only when set, so every config written before them keeps its CID.

**Caveats.** ``caveats = "two_approvers"`` asks for at least two distinct
approvers whenever the request's stored preview names a caveat
(``marque.preview_caveats``): routing decides before the preview exists, so the
Harbourmaster applies it when it seals the Checkpoint from the preview
(:func:`~marque.harbour.routing.decide.approvals_with_caveats`). ``"show"``
only shows them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from marque.cid import MAX_SAFE_INT, cid
from marque.errors import AccountConfigInvalid
from marque.harbour.routing.overlap import (
    ALL,
    DIMENSIONS,
    OPERATIONS,
    AllMembers,
    Box,
    Point,
    Region,
    Selector,
    describe_point,
    intersection_witness,
)

__all__ = [
    "CONFIG_VERSION",
    "ALLOW",
    "DENY",
    "DELEGATE",
    "CAVEATS_SHOW",
    "CAVEATS_TWO_APPROVERS",
    "CAVEAT_POLICIES",
    "OUTCOMES",
    "Entry",
    "RoutingConfig",
    "parse_config",
    "parse_duration",
]

#: The version of the config document and of its canonical (CID) form.
CONFIG_VERSION: Final = "marque-routing/0.1"

ALLOW: Final = "allow"
DENY: Final = "deny"
DELEGATE: Final = "delegate"
#: The outcomes an entry may route to.
OUTCOMES: Final = (ALLOW, DENY, DELEGATE)

_TOP_KEYS = frozenset({"version", "entry"})
_SELECTOR_KEYS = frozenset(DIMENSIONS)
_DELEGATE_KEYS = frozenset({"approvals", "self_approval", "max_ttl", "caveats"})
#: What a delegate entry does when the preview names caveats: only show them (the
#: default), or require at least two distinct approvers.
CAVEATS_SHOW: Final = "show"
CAVEATS_TWO_APPROVERS: Final = "two_approvers"
CAVEAT_POLICIES: Final = (CAVEATS_SHOW, CAVEATS_TWO_APPROVERS)
#: Budget caps an allow or delegate entry may set (see "Budget caps" above).
_BUDGET_KEYS = frozenset({"max_rows", "max_executions"})
_ENTRY_KEYS = _SELECTOR_KEYS | _DELEGATE_KEYS | _BUDGET_KEYS | {"except", "outcome"}
_DURATION = re.compile(r"([1-9][0-9]{0,15})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RESOURCE = re.compile(r"[^.\s*\"]+\.[^.\s*\"]+")


def _invalid(where: str, message: str, **detail: Any) -> AccountConfigInvalid:
    return AccountConfigInvalid(f"{where}: {message}", detail={"where": where, **detail})


def parse_duration(value: object, where: str = "max_ttl") -> int:
    """Seconds in a duration such as ``"90s"``, ``"15m"``, ``"2h"`` or ``"1d"`` (one unit, > 0)."""
    if not isinstance(value, str):
        raise _invalid(where, f"must be a duration string like \"2h\", got {_kind(value)}")
    match = _DURATION.fullmatch(value)
    if match is None:
        raise _invalid(
            where, f"{value!r} is not a duration: a positive integer then s, m, h or d"
        )
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > MAX_SAFE_INT:
        raise _invalid(where, f"{value!r} is too long")
    return seconds


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


def _check_name(name: object, dimension: str, where: str) -> str:
    if not isinstance(name, str):
        raise _invalid(where, f"{dimension} names must be strings, got {_kind(name)}")
    if name == "*":
        raise _invalid(where, 'write "*" alone (not inside a list) to select every member')
    if not name or name != name.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise _invalid(where, f"{name!r} is not a valid {dimension} name")
    if dimension == "operation" and name not in OPERATIONS:
        raise _invalid(
            where, f"unknown operation {name!r} (one of {', '.join(sorted(OPERATIONS))})"
        )
    if dimension == "resource" and _RESOURCE.fullmatch(name) is None:
        raise _invalid(
            where, f"resource {name!r} must be a schema-qualified table name like "
            "\"public.orders\" (a config cannot know which schema a bare name means)"
        )
    return name


def _selector(value: object, dimension: str, where: str) -> Selector:
    if value == "*":
        return ALL
    if not isinstance(value, list):
        raise _invalid(where, f'must be "*" or a list of names, got {_kind(value)}')
    if not value:
        raise _invalid(where, 'must not be empty (an entry must select something; use "*" '
                       "for every member)")
    names = frozenset(
        _check_name(item, dimension, f"{where}[{i}]") for i, item in enumerate(value)
    )
    if dimension == "operation" and names == OPERATIONS:
        return ALL
    return names


def _table(value: object, where: str, allowed: frozenset[str], required: frozenset[str]
           ) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(where, f"must be a table, got {_kind(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _invalid(f"{where}.{unknown[0]}", "unknown key", key=unknown[0])
    missing = sorted(required - set(value))
    if missing:
        raise _invalid(f"{where}.{missing[0]}", "missing", key=missing[0])
    return value


def _box(table: Mapping[str, Any], where: str) -> Box:
    selectors = [_selector(table[d], d, f"{where}.{d}") for d in DIMENSIONS]
    return Box(*selectors)


def _canonical_selector(selector: Selector) -> str | list[str]:
    return "*" if isinstance(selector, AllMembers) else sorted(selector)


def _canonical_box(box: Box) -> dict[str, Any]:
    return {d: _canonical_selector(s) for d, s in zip(DIMENSIONS, box.selectors, strict=True)}


@dataclass(frozen=True)
class Entry:
    """One routing entry: a tuple set (its :class:`Region`) and where it routes.

    ``approvals``, ``self_approval`` and ``max_ttl_seconds`` mean something only
    for a ``delegate`` entry; an ``allow`` or ``deny`` entry has 0, False, None.
    """

    index: int
    region: Region
    outcome: str
    approvals: int = 0
    self_approval: bool = False
    max_ttl_seconds: int | None = None
    caveats: str = CAVEATS_SHOW
    #: The largest ``max_rows`` / ``executions`` a selected request may ask (None: no cap).
    max_rows: int | None = None
    max_executions: int | None = None

    def contains(self, point: Point) -> bool:
        """Whether this entry selects ``point`` (and does not except it)."""
        return self.region.contains(point)

    def to_canonical(self) -> dict[str, Any]:
        """The entry in the config's canonical JSON form."""
        out = _canonical_box(self.region.box)
        out["except"] = [_canonical_box(box) for box in self.region.exclusions]
        out["outcome"] = self.outcome
        if self.outcome == DELEGATE:
            out["approvals"] = self.approvals
            out["self_approval"] = self.self_approval
            out["max_ttl_seconds"] = self.max_ttl_seconds
            if self.caveats != CAVEATS_SHOW:
                out["caveats"] = self.caveats
        for key in sorted(_BUDGET_KEYS):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class RoutingConfig:
    """A validated routing config: its entries (non-overlapping across outcomes) and its CID.

    Build one with :func:`parse_config`; a ``RoutingConfig`` never exists for
    an invalid config. ``text`` is the source it was parsed from.
    """

    entries: tuple[Entry, ...]
    config_cid: str
    text: str

    def to_canonical(self) -> dict[str, Any]:
        """The canonical JSON form whose CID is :attr:`config_cid`."""
        return _canonical(self.entries)


def _canonical(entries: tuple[Entry, ...]) -> dict[str, Any]:
    return {"version": CONFIG_VERSION, "entries": [e.to_canonical() for e in entries]}


def _entry(index: int, raw: object) -> Entry:
    where = f"entry[{index}]"
    table = _table(raw, where, _ENTRY_KEYS, _SELECTOR_KEYS | {"outcome"})
    box = _box(table, where)
    raw_except = table.get("except", [])
    if not isinstance(raw_except, list):
        raise _invalid(f"{where}.except", f"must be a list of tables, got {_kind(raw_except)}")
    exclusions = tuple(
        _box(_table(item, f"{where}.except[{i}]", _SELECTOR_KEYS, _SELECTOR_KEYS),
             f"{where}.except[{i}]")
        for i, item in enumerate(raw_except)
    )
    outcome = table["outcome"]
    if not isinstance(outcome, str) or outcome not in OUTCOMES:
        shown = repr(outcome) if isinstance(outcome, str) else _kind(outcome)
        raise _invalid(f"{where}.outcome", f"must be one of {', '.join(OUTCOMES)}, got {shown}")
    region = Region(box, exclusions)
    caps = _caps(table, where, outcome)
    if outcome != DELEGATE:
        extra = sorted(_DELEGATE_KEYS & set(table))
        if extra:
            raise _invalid(f"{where}.{extra[0]}", f"only a delegate entry may set {extra[0]}",
                           key=extra[0])
        return Entry(index, region, outcome, max_rows=caps.get("max_rows"),
                     max_executions=caps.get("max_executions"))
    approvals = table.get("approvals", 1)
    if not isinstance(approvals, int) or isinstance(approvals, bool):
        raise _invalid(f"{where}.approvals", f"must be an integer, got {_kind(approvals)}")
    if not 1 <= approvals <= MAX_SAFE_INT:
        raise _invalid(f"{where}.approvals", f"must be a positive integer, got {approvals}")
    self_approval = table.get("self_approval", False)
    if not isinstance(self_approval, bool):
        raise _invalid(f"{where}.self_approval", f"must be true or false, got "
                       f"{_kind(self_approval)}")
    max_ttl = table.get("max_ttl")
    max_ttl_seconds = None if max_ttl is None else parse_duration(max_ttl, f"{where}.max_ttl")
    caveats = table.get("caveats", CAVEATS_SHOW)
    if not isinstance(caveats, str) or caveats not in CAVEAT_POLICIES:
        shown = repr(caveats) if isinstance(caveats, str) else _kind(caveats)
        raise _invalid(f"{where}.caveats",
                       f"must be one of {', '.join(CAVEAT_POLICIES)}, got {shown}")
    return Entry(index, region, outcome, approvals, self_approval, max_ttl_seconds, caveats,
                 max_rows=caps.get("max_rows"), max_executions=caps.get("max_executions"))


def _caps(table: Mapping[str, Any], where: str, outcome: str) -> dict[str, int]:
    """An entry's budget caps (``max_rows``, ``max_executions``): positive integers, on an
    allow or delegate entry only (a deny entry admits no budget at all)."""
    caps: dict[str, int] = {}
    for key in sorted(_BUDGET_KEYS & set(table)):
        value = table[key]
        if outcome == DENY:
            raise _invalid(f"{where}.{key}", f"a deny entry cannot set {key}", key=key)
        if not isinstance(value, int) or isinstance(value, bool) \
                or not 1 <= value <= MAX_SAFE_INT:
            raise _invalid(f"{where}.{key}", f"must be a positive integer, got "
                           f"{value if isinstance(value, int) else _kind(value)}")
        caps[key] = value
    return caps


def _check_overlaps(entries: tuple[Entry, ...]) -> None:
    for i, first in enumerate(entries):
        for second in entries[i + 1 :]:
            if first.outcome == second.outcome:
                continue
            witness = intersection_witness(first.region, second.region)
            if witness is not None:
                raise AccountConfigInvalid(
                    f"entry[{first.index}] ({first.outcome}) and entry[{second.index}] "
                    f"({second.outcome}) overlap, e.g. on {describe_point(witness)}; entries "
                    "with different outcomes must select disjoint tuples (narrow one of them "
                    "or add an except)",
                    detail={"entries": [first.index, second.index],
                            "witness": describe_point(witness)},
                )


def parse_config(text: str | bytes) -> RoutingConfig:
    """Parse and validate a routing config; raise :class:`AccountConfigInvalid` if it is not one.

    See the module docstring for the format and every rule. The result's
    ``config_cid`` is its identity.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AccountConfigInvalid(f"config is not UTF-8: {exc}") from exc
    if not isinstance(text, str):
        raise AccountConfigInvalid(f"config must be TOML text, got {type(text).__name__}")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AccountConfigInvalid(f"config is not valid TOML: {exc}") from exc
    unknown = sorted(set(document) - _TOP_KEYS)
    if unknown:
        raise _invalid(unknown[0], "unknown key at the top level (entries are [[entry]] "
                       "tables)", key=unknown[0])
    if "version" in document and document["version"] != CONFIG_VERSION:
        raise _invalid("version", f"must be {CONFIG_VERSION!r}, got {document['version']!r}")
    raw_entries = document.get("entry")
    if raw_entries is None:
        raise _invalid("entry", "a config needs at least one [[entry]] (to refuse everything, "
                       "say so with a deny entry)")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise _invalid("entry", "must be a non-empty array of [[entry]] tables")
    entries = tuple(_entry(index, raw) for index, raw in enumerate(raw_entries))
    _check_overlaps(entries)
    return RoutingConfig(entries=entries, config_cid=cid(_canonical(entries)), text=text)
