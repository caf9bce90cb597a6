"""Effect Set declarations and their input relations (seed 002, "Preview strength, scope…").

An Effect Set is a list of *members*; each member changes one target table
(or runs one command) for every row of its own input relation::

    {"version": "marque-effect-set/0.1",
     "members": [{"effect_id": "fix_emails", "kind": "update", "table": "public.customers",
                  "key": ["id"], "failure_policy": "halt", "max_items": 100,
                  "input": "emails.csv"}]}

Three steps, each strict and each refusing with a typed error whose
``detail["rule"]`` names the broken rule:

* :func:`parse_declaration` — the declaration's closed shape
  (:class:`~marque.errors.EffectDeclarationInvalid`);
* :func:`capture_input` — a JSON or CSV file's bytes become an immutable,
  content-addressed :class:`InputRelation` (:class:`~marque.errors.EffectInputInvalid`);
* :func:`bind` — every member meets its relation: key columns, value types,
  duplicate mutation identities (invalid, never collapsed:
  :class:`~marque.errors.EffectDuplicateIdentity`), and the item limit counted
  as the seed says (:class:`~marque.errors.EffectMaxItemsExceeded`). The
  bound set carries the request's ``caller_input_intent_cid``.

Items are counted per kind: created rows for ``create``, unique target
identities for ``update``/``delete``, unique upsert keys for ``upsert``, and
target-plus-payload items for ``command``. Since a duplicate identity is
refused, each count equals the number of input rows.
"""

from __future__ import annotations

import csv
import enum
import hashlib
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marque.cid import canonicalize, cid
from marque.effects import cids
from marque.effects._frozen import FrozenJSON, freeze, thaw
from marque.effects.fence import parse_fence
from marque.errors import (
    EffectDeclarationInvalid,
    EffectDuplicateIdentity,
    EffectInputInvalid,
    EffectMaxItemsExceeded,
    InvalidInput,
)

__all__ = [
    "DECLARATION_VERSION", "MAX_MEMBERS", "MAX_ITEMS_CEILING", "Kind", "FailurePolicy",
    "MemberDeclaration", "EffectSetDeclaration", "InputRelation", "BoundItem", "BoundMember",
    "BoundEffectSet", "parse_declaration", "parse_declaration_bytes", "capture_input", "bind",
    "bind_member", "bind_files", "read_key", "KEYED",
]

DECLARATION_VERSION = "marque-effect-set/0.1"
#: The most members one Effect Set may have.
MAX_MEMBERS = 64
#: The largest ``max_items`` a member may declare.
MAX_ITEMS_CEILING = 100_000

_EFFECT_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_MEMBER_FIELDS = {"effect_id", "kind", "table", "key", "command", "failure_policy",
                  "max_items", "input", "fence"}
_REQUIRED_FIELDS = {"effect_id", "kind", "table", "max_items"}


class Kind(enum.StrEnum):
    """What a member does to each of its rows."""

    CREATE = "create"
    UPDATE = "update"
    UPSERT = "upsert"
    DELETE = "delete"
    COMMAND = "command"


#: Kinds whose rows are identified by the target primary-key value.
KEYED = frozenset({Kind.UPDATE, Kind.UPSERT, Kind.DELETE})


class FailurePolicy(enum.StrEnum):
    """What a failed or unknown row means for the member's later rows (seed 002's table)."""

    HALT = "halt"
    CONTINUE = "continue"


def _bad(message: str, rule: str, path: str) -> EffectDeclarationInvalid:
    return EffectDeclarationInvalid(message, detail={"rule": rule, "path": path})


def _bad_input(message: str, rule: str, **detail: Any) -> EffectInputInvalid:
    return EffectInputInvalid(message, detail={"rule": rule, **detail})


# -- declarations -------------------------------------------------------------------


@dataclass(frozen=True)
class MemberDeclaration:
    """One member: ``{effect_id, kind, table, key, command, failure_policy, max_items}``.

    ``table`` is ``name`` or ``schema.name``; ``key`` its primary-key columns
    (required for update, upsert and delete, optional for create, absent for
    command); ``command`` the command's name (command members only). ``input``
    is where the CLI reads the relation from; it is not part of any identity —
    the captured relation is.
    """

    effect_id: str
    kind: Kind
    table: str
    key: tuple[str, ...]
    failure_policy: FailurePolicy
    max_items: int
    command: str | None = None
    input: str | None = None
    #: The row state its one row must hold to apply (:mod:`marque.effects.fence`).
    fence: FrozenJSON | None = None

    def to_json(self) -> dict[str, Any]:
        """The member's semantic declaration (without ``input``; ``fence`` only if set)."""
        body = {"effect_id": self.effect_id, "kind": self.kind.value, "table": self.table,
                "key": list(self.key), "command": self.command,
                "failure_policy": self.failure_policy.value, "max_items": self.max_items}
        return body if self.fence is None else {**body, "fence": thaw(self.fence)}


@dataclass(frozen=True)
class EffectSetDeclaration:
    """A parsed, valid Effect Set declaration: its members in declared order."""

    members: tuple[MemberDeclaration, ...]

    def to_json(self) -> dict[str, Any]:
        """``{version, members}`` with each member's semantic declaration."""
        return {"version": DECLARATION_VERSION,
                "members": [member.to_json() for member in self.members]}

    @property
    def declaration_cid(self) -> str:
        """The CID of :meth:`to_json` (for the request's program definition)."""
        return cid(self.to_json())

    def member(self, effect_id: str) -> MemberDeclaration:
        """The member called ``effect_id``; ``KeyError`` if there is none."""
        for member in self.members:
            if member.effect_id == effect_id:
                return member
        raise KeyError(effect_id)


def _identifier(value: object, path: str, *, dotted: bool = False) -> str:
    if not isinstance(value, str):
        raise _bad(f"{path} must be a string", "type", path)
    parts = value.split(".") if dotted else [value]
    if len(parts) > 2 or not all(_IDENT.fullmatch(part) for part in parts):
        shape = "name or schema.name" if dotted else "name"
        raise _bad(f"{path} must be a plain SQL identifier ({shape}: letters, digits and _, "
                   f"not starting with a digit, at most 63 characters each); got {value!r}",
                   "identifier", path)
    return value


def _member(raw: object, path: str) -> MemberDeclaration:
    if not isinstance(raw, dict):
        raise _bad(f"{path} must be an object", "type", path)
    unknown = sorted(set(raw) - _MEMBER_FIELDS)
    if unknown:
        raise _bad(f"{path} has unknown field(s): {', '.join(unknown)}", "unknown_field",
                   f"{path}.{unknown[0]}")
    missing = sorted(_REQUIRED_FIELDS - set(raw))
    if missing:
        raise _bad(f"{path} is missing {', '.join(missing)}", "missing_field",
                   f"{path}.{missing[0]}")
    effect_id = raw["effect_id"]
    if not isinstance(effect_id, str) or not _EFFECT_ID.fullmatch(effect_id):
        raise _bad(f"{path}.effect_id must be 1-128 characters of letters, digits, _ . -, "
                   f"starting with a letter or _; got {effect_id!r}", "effect_id",
                   f"{path}.effect_id")
    try:
        kind = Kind(raw["kind"])
    except (ValueError, TypeError):
        raise _bad(f"{path}.kind must be one of {', '.join(k.value for k in Kind)}; got "
                   f"{raw['kind']!r}", "kind", f"{path}.kind") from None
    table = _identifier(raw["table"], f"{path}.table", dotted=True)
    key_raw = raw.get("key", [])
    if not isinstance(key_raw, list):
        raise _bad(f"{path}.key must be a list of column names", "type", f"{path}.key")
    key = tuple(_identifier(col, f"{path}.key[{i}]") for i, col in enumerate(key_raw))
    if len(set(key)) != len(key):
        raise _bad(f"{path}.key names a column twice", "key_duplicate_column", f"{path}.key")
    if kind in KEYED and not key:
        raise _bad(f"{path}: a {kind} member needs its table's key columns in key",
                   "key_required", f"{path}.key")
    if kind is Kind.COMMAND and key:
        raise _bad(f"{path}: a command member has no key (its items are identified by "
                   "command, target and payload)", "key_forbidden", f"{path}.key")
    command = raw.get("command")
    if kind is Kind.COMMAND:
        if command is None:
            raise _bad(f"{path}: a command member needs command", "command_required",
                       f"{path}.command")
        command = _identifier(command, f"{path}.command", dotted=True)
    elif command is not None:
        raise _bad(f"{path}: only a command member has command", "command_forbidden",
                   f"{path}.command")
    try:
        policy = FailurePolicy(raw.get("failure_policy", "halt"))
    except (ValueError, TypeError):
        raise _bad(f"{path}.failure_policy must be halt or continue; got "
                   f"{raw.get('failure_policy')!r}", "failure_policy",
                   f"{path}.failure_policy") from None
    max_items = raw["max_items"]
    if (not isinstance(max_items, int) or isinstance(max_items, bool)
            or not 1 <= max_items <= MAX_ITEMS_CEILING):
        raise _bad(f"{path}.max_items must be an integer from 1 to {MAX_ITEMS_CEILING}; got "
                   f"{max_items!r}", "max_items", f"{path}.max_items")
    source = raw.get("input")
    if source is not None and (not isinstance(source, str) or not source):
        raise _bad(f"{path}.input must be a non-empty file path", "type", f"{path}.input")
    fence = parse_fence(raw.get("fence"), kind.value, key, max_items, path, _bad)
    return MemberDeclaration(effect_id, kind, table, key, policy, max_items, command, source,
                             fence)


def parse_declaration(raw: object) -> EffectSetDeclaration:
    """Parse a declaration object (already-decoded JSON) strictly; see the module docstring.

    Rules (``detail["rule"]``): ``type``, ``version``, ``unknown_field``,
    ``missing_field``, ``members_empty``, ``too_many_members``, ``effect_id``,
    ``duplicate_effect_id``, ``kind``, ``identifier``, ``key_duplicate_column``,
    ``key_required``, ``key_forbidden``, ``command_required``,
    ``command_forbidden``, ``failure_policy``, ``max_items``.
    """
    if not isinstance(raw, dict):
        raise _bad("an Effect Set declaration must be a JSON object", "type", "$")
    unknown = sorted(set(raw) - {"version", "members"})
    if unknown:
        raise _bad(f"unknown field(s): {', '.join(unknown)}", "unknown_field", f"$.{unknown[0]}")
    if raw.get("version") != DECLARATION_VERSION:
        raise _bad(f"version must be {DECLARATION_VERSION!r}; got {raw.get('version')!r}",
                   "version", "$.version")
    members_raw = raw.get("members")
    if not isinstance(members_raw, list):
        raise _bad("members must be a list", "type" if "members" in raw else "missing_field",
                   "$.members")
    if not members_raw:
        raise _bad("an Effect Set needs at least one member", "members_empty", "$.members")
    if len(members_raw) > MAX_MEMBERS:
        raise _bad(f"an Effect Set has at most {MAX_MEMBERS} members; got {len(members_raw)}",
                   "too_many_members", "$.members")
    members = tuple(_member(m, f"$.members[{i}]") for i, m in enumerate(members_raw))
    seen: set[str] = set()
    for index, member in enumerate(members):
        if member.effect_id in seen:
            raise _bad(f"effect_id {member.effect_id!r} is declared twice", "duplicate_effect_id",
                       f"$.members[{index}].effect_id")
        seen.add(member.effect_id)
    return EffectSetDeclaration(members)


def _strict_json(data: bytes, error: type[Exception], what: str) -> Any:
    """Decode strict JSON: UTF-8, no duplicate keys, no non-integer numbers, no NaN."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    def no_float(text: str) -> Any:
        raise ValueError(f"non-integer number {text} (write decimals as strings)")

    def no_constant(text: str) -> Any:
        raise ValueError(f"{text} is not JSON")

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _rule(error, f"{what} is not UTF-8: {exc}", "encoding") from None
    try:
        return json.loads(text, object_pairs_hook=pairs, parse_float=no_float,
                          parse_constant=no_constant)
    except ValueError as exc:
        raise _rule(error, f"{what} is not strict JSON: {exc}", "json") from None


def _rule(error: type[Exception], message: str, rule: str) -> Exception:
    if issubclass(error, EffectDeclarationInvalid):
        return _bad(message, rule, "$")
    return _bad_input(message, rule)


def parse_declaration_bytes(data: bytes) -> EffectSetDeclaration:
    """:func:`parse_declaration` of a declaration file's bytes (strict JSON, as for inputs)."""
    return parse_declaration(_strict_json(data, EffectDeclarationInvalid, "the declaration"))


# -- input relations ----------------------------------------------------------------


@dataclass(frozen=True)
class InputRelation:
    """A captured input relation: immutable, named by :attr:`input_cid`.

    ``rows`` are frozen row objects in canonical order (by their canonical JSON
    bytes), ``columns`` the columns every row has, sorted. ``source_sha256``,
    ``byte_length`` and ``format`` record the file it came from (provenance,
    outside the identity).
    """

    columns: tuple[str, ...]
    rows: tuple[FrozenJSON, ...]
    input_cid: str
    format: str
    source_sha256: str
    byte_length: int

    def to_json(self) -> dict[str, Any]:
        """``{version, columns, rows}``: the artifact's content (its CID preimage)."""
        return {"version": cids.INPUT_VERSION, "columns": list(self.columns),
                "rows": [thaw(row) for row in self.rows]}


def _check_value(value: object, row: int, column: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        if isinstance(value, str):
            try:
                canonicalize(value)
            except InvalidInput:
                raise _bad_input(f"row {row} column {column!r}: string is not valid Unicode "
                                 "(a lone surrogate)", "value_type", row=row,
                                 column=column) from None
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            raise _bad_input(f"row {row} column {column!r}: integer {value} is beyond 2**53 "
                             "(write it as a string)", "value_type", row=row, column=column)
        return
    raise _bad_input(f"row {row} column {column!r}: a value must be a string, an integer, "
                     f"true, false or null; got {type(value).__name__}", "value_type",
                     row=row, column=column)


def _column_name(name: str, index: int) -> str:
    if not _IDENT.fullmatch(name):
        raise _bad_input(f"column {index} {name!r} is not a plain SQL identifier",
                         "column_name", column=name)
    return name


def _json_rows(data: bytes) -> tuple[list[str], list[dict[str, Any]]]:
    """A JSON input's columns (the first row's keys) and rows, as written."""
    raw = _strict_json(data, EffectInputInvalid, "the input")
    if not isinstance(raw, list) or not all(isinstance(row, dict) for row in raw):
        raise _bad_input("a JSON input must be an array of objects, one per row", "shape")
    rows: list[dict[str, Any]] = raw
    return (sorted(rows[0]) if rows else []), rows


def _csv_rows(data: bytes) -> tuple[list[str], list[dict[str, Any]]]:
    """A CSV input's columns (its header row) and records, every value a string."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_input(f"the input is not UTF-8: {exc}", "encoding") from None
    text = text.removeprefix("\ufeff")
    try:
        records = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise _bad_input(f"the input is not valid CSV: {exc}", "csv") from None
    if not records or not records[0] or records[0] == [""]:
        raise _bad_input("a CSV input needs a header row of column names", "csv_header")
    header = records[0]
    if len(set(header)) != len(header):
        raise _bad_input("the CSV header names a column twice", "csv_header")
    rows: list[dict[str, Any]] = []
    for number, record in enumerate(records[1:], start=1):
        if len(record) != len(header):
            raise _bad_input(f"CSV record {number} has {len(record)} fields, the header "
                             f"{len(header)}", "csv_field_count", row=number)
        rows.append(dict(zip(header, record, strict=True)))
    return list(header), rows


def _check_rows(columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Every column a plain identifier, every row the same columns, every value plain."""
    for index, name in enumerate(columns):
        _column_name(name, index)
    for number, row in enumerate(rows):
        if sorted(row) != sorted(columns):
            raise _bad_input(f"row {number} has columns {sorted(row)}, row 0 has {columns}: "
                             "every row must have the same columns", "columns_differ",
                             row=number)
        for column, value in row.items():
            _check_value(value, number, column)


def capture_input(data: bytes, format: str) -> InputRelation:
    """Capture a member's input file as an immutable content-addressed relation.

    ``format`` is ``"json"`` (an array of objects, every object with the same
    keys; values strings, integers, booleans or null — no non-integer numbers,
    no nested values, no duplicate keys) or ``"csv"`` (RFC 4180, UTF-8, a header
    row of distinct column names, every record with as many fields; every value
    is the string as written — CSV has no null; one leading UTF-8 BOM is
    ignored). Rules: ``format``, ``encoding``, ``json``, ``shape``,
    ``value_type``, ``columns_differ``, ``column_name``, ``csv_header``,
    ``csv_field_count``, ``csv``.
    """
    if format == "json":
        columns, rows = _json_rows(data)
    elif format == "csv":
        columns, rows = _csv_rows(data)
    else:
        raise _bad_input(f"input format must be json or csv; got {format!r}", "format")
    _check_rows(columns, rows)
    columns = sorted(columns, key=lambda c: c.encode("utf-16-be"))
    ordered = sorted(rows, key=canonicalize)
    return InputRelation(
        columns=tuple(columns),
        rows=tuple(freeze(row) for row in ordered),
        input_cid=cids.input_cid(columns, ordered),
        format=format,
        source_sha256=hashlib.sha256(data).hexdigest(),
        byte_length=len(data),
    )


# -- binding members to their relations ---------------------------------------------


@dataclass(frozen=True)
class BoundItem:
    """One item of a member, in canonical order.

    ``row_or_item_key`` is the item's identity (see :mod:`marque.effects.cids`);
    ``values`` what it writes (the whole row for create, the non-key columns for
    update and upsert, ``{}`` for delete, the payload for command);
    ``read_key`` the canonical JSON text of the identity for a row the preview
    reads (keyed kinds, and create with a key), else ``None``.
    """

    row_or_item_key: FrozenJSON
    values: FrozenJSON
    read_key: str | None


@dataclass(frozen=True)
class BoundMember:
    """A member with its relation: items in the seed's canonical order, and their count."""

    declaration: MemberDeclaration
    input: InputRelation
    items: tuple[BoundItem, ...]

    @property
    def item_count(self) -> int:
        """Items counted as the seed says (duplicates are refused, so one per row)."""
        return len(self.items)


@dataclass(frozen=True)
class BoundEffectSet:
    """Every member bound to its relation, and the request's ``caller_input_intent_cid``."""

    declaration: EffectSetDeclaration
    members: tuple[BoundMember, ...]
    caller_input_intent_cid: str


def read_key(identity: Mapping[str, Any]) -> str:
    """The canonical JSON text of a row identity: how a preview's reads are keyed."""
    return canonicalize(thaw(identity)).decode("utf-8")


def _order_value(value: object) -> object:
    return value.encode("utf-16-be") if isinstance(value, str) else value


def bind_member(member: MemberDeclaration, relation: InputRelation) -> BoundMember:
    """Bind one member to its captured relation; see :func:`bind` for the rules."""
    key = member.key
    where = {"effect_id": member.effect_id}
    _check_member_columns(member, relation)
    items: list[tuple[Any, BoundItem]] = []
    seen: dict[str, int] = {}
    occurrences: dict[str, int] = {}
    for number, frozen_row in enumerate(relation.rows):
        row = thaw(frozen_row)
        identity, order, values = _row_identity(member, row, occurrences)
        # A create row's mutation identity is its declared key, if it has one; without a key
        # identical rows are distinct occurrences, never duplicates.
        keyed_create = member.kind is Kind.CREATE and bool(key)
        mutation = read_key({col: row[col] for col in key} if keyed_create else identity)
        if member.kind is not Kind.CREATE or keyed_create:
            if mutation in seen:
                raise EffectDuplicateIdentity(
                    f"{member.effect_id}: two input rows share one mutation identity "
                    f"{mutation}; duplicates are invalid, never collapsed",
                    detail={"rule": "duplicate_identity", "identity": mutation, **where})
            seen[mutation] = number
        reads = member.kind in KEYED or keyed_create
        items.append((order, BoundItem(freeze(identity), freeze(values),
                                       mutation if reads else None)))
    _check_max_items(member, len(items))
    items.sort(key=lambda pair: pair[0])
    return BoundMember(member, relation, tuple(item for _, item in items))


def _check_member_columns(member: MemberDeclaration, relation: InputRelation) -> None:
    """The relation holds the member's key, the columns its kind needs, and key values
    of one plain type."""
    key = member.key
    where = {"effect_id": member.effect_id}
    columns = set(relation.columns)
    if relation.rows:
        missing = [col for col in key if col not in columns]
        if missing:
            raise _bad_input(f"{member.effect_id}: the input has no key column(s) "
                             f"{', '.join(missing)}", "missing_key_column", **where)
        others = columns - set(key)
        if member.kind is Kind.UPDATE and not others:
            raise _bad_input(f"{member.effect_id}: an update's input needs at least one "
                             "column besides the key", "no_change_columns", **where)
        if member.kind is Kind.DELETE and others:
            raise _bad_input(f"{member.effect_id}: a delete's input holds only key columns; "
                             f"extra: {', '.join(sorted(others))}", "extra_columns", **where)
    for column in key:
        types = {type(row[column]) for row in relation.rows}
        if types - {str, int}:
            raise _bad_input(f"{member.effect_id}: key column {column!r} must hold strings or "
                             "integers (not null or booleans)", "key_value_type",
                             column=column, **where)
        if len(types) > 1:
            raise _bad_input(f"{member.effect_id}: key column {column!r} mixes strings and "
                             "integers", "mixed_key_types", column=column, **where)


def _row_identity(member: MemberDeclaration, row: dict[str, Any],
                  occurrences: dict[str, int]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """One input row's identity, its sort order, and the values it sets. ``occurrences``
    counts the create rows seen so far by content (identical rows are distinct items)."""
    key = member.key
    if member.kind is Kind.CREATE:
        content = cids.content_cid(row)
        occurrence = occurrences.get(content, 0)
        occurrences[content] = occurrence + 1
        return {"content_cid": content, "occurrence": occurrence}, (content, occurrence), row
    if member.kind is Kind.COMMAND:
        assert member.command is not None
        payload = cids.command_payload_cid(row)
        return ({"command": member.command, "target": member.table, "payload_cid": payload},
                payload, row)
    return ({col: row[col] for col in key}, tuple(_order_value(row[col]) for col in key),
            {col: v for col, v in row.items() if col not in key})


def _check_max_items(member: MemberDeclaration, count: int) -> None:
    """Refuse a member whose input makes more items than its ``max_items``."""
    if count > member.max_items:
        counted = {Kind.CREATE: "created rows", Kind.UPDATE: "unique target identities",
                   Kind.DELETE: "unique target identities", Kind.UPSERT: "unique upsert keys",
                   Kind.COMMAND: "target-plus-payload items"}[member.kind]
        raise EffectMaxItemsExceeded(
            f"{member.effect_id}: {count} {counted}, more than max_items "
            f"{member.max_items}", detail={"count": count, "max_items": member.max_items,
                                           "counted_as": counted, "effect_id": member.effect_id})


def bind(declaration: EffectSetDeclaration,
         inputs: Mapping[str, InputRelation]) -> BoundEffectSet:
    """Bind every member to its input (``inputs[effect_id]``) and derive the input intent.

    Rules (``detail["rule"]``): ``missing_input``, ``unknown_input``,
    ``missing_key_column``, ``no_change_columns`` (update), ``extra_columns``
    (delete), ``key_value_type``, ``mixed_key_types``, ``duplicate_identity``
    (:class:`EffectDuplicateIdentity`), ``overlapping_members`` (two members
    with the same table and key columns naming one row — the later would
    overwrite the earlier from a stale before — also
    :class:`EffectDuplicateIdentity`); and the item limit
    (:class:`EffectMaxItemsExceeded`).
    """
    declared = [member.effect_id for member in declaration.members]
    for effect_id in declared:
        if effect_id not in inputs:
            raise _bad_input(f"member {effect_id!r} has no input relation", "missing_input",
                             effect_id=effect_id)
    extra = sorted(set(inputs) - set(declared))
    if extra:
        raise _bad_input(f"input for undeclared member(s): {', '.join(extra)}",
                         "unknown_input", effect_id=extra[0])
    bound = tuple(bind_member(member, inputs[member.effect_id])
                  for member in declaration.members)
    claimed: dict[tuple[str, tuple[str, ...], str], str] = {}
    for member in bound:
        decl = member.declaration
        for item in member.items:
            if item.read_key is None:
                continue
            slot = (decl.table, tuple(sorted(decl.key)), item.read_key)
            if slot in claimed:
                raise EffectDuplicateIdentity(
                    f"members {claimed[slot]!r} and {decl.effect_id!r} both change row "
                    f"{item.read_key} of {decl.table}", detail={
                        "rule": "overlapping_members", "identity": item.read_key,
                        "effect_id": decl.effect_id, "other": claimed[slot]})
            claimed[slot] = decl.effect_id
    intent = cids.caller_input_intent_cid(
        {member.declaration.effect_id: member.input.input_cid for member in bound})
    return BoundEffectSet(declaration, bound, intent)


def bind_files(declaration: EffectSetDeclaration,
               files: Mapping[str, tuple[bytes, str]]) -> BoundEffectSet:
    """:func:`capture_input` each ``files[effect_id] = (bytes, format)``, then :func:`bind`."""
    return bind(declaration, {effect_id: capture_input(data, fmt)
                              for effect_id, (data, fmt) in files.items()})
