"""Effect Set declarations and input relations: every refusal rule once, and what is kept."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from marque.effects.declare import (
    MAX_ITEMS_CEILING,
    MAX_MEMBERS,
    Kind,
    bind,
    capture_input,
    parse_declaration,
    parse_declaration_bytes,
)
from marque.errors import (
    EffectDeclarationInvalid,
    EffectDuplicateIdentity,
    EffectInputInvalid,
    EffectMaxItemsExceeded,
)

V = "marque-effect-set/0.1"


def _member(**fields: Any) -> dict[str, Any]:
    base = {"effect_id": "fix", "kind": "update", "table": "customers", "key": ["id"],
            "max_items": 10}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def _decl(*members: dict[str, Any]) -> dict[str, Any]:
    return {"version": V, "members": list(members or [_member()])}


DECLARATION_REFUSALS = [
    ("type", ["not", "an", "object"]),
    ("version", {"version": "marque-effect-set/9", "members": [_member()]}),
    ("unknown_field", {"version": V, "members": [_member()], "extra": 1}),
    ("unknown_field", _decl(_member(colour="red"))),
    ("missing_field", _decl(_member(max_items=...))),
    ("missing_field", {"version": V}),
    ("type", {"version": V, "members": {"fix": _member()}}),
    ("members_empty", {"version": V, "members": []}),
    ("too_many_members", {"version": V, "members": [
        _member(effect_id=f"m{i}") for i in range(MAX_MEMBERS + 1)]}),
    ("effect_id", _decl(_member(effect_id="9lives"))),
    ("duplicate_effect_id", _decl(_member(), _member(table="other"))),
    ("kind", _decl(_member(kind="merge"))),
    ("identifier", _decl(_member(table="customers; DROP TABLE x"))),
    ("identifier", _decl(_member(table="a.b.c"))),
    ("identifier", _decl(_member(key=["id", "bad col"]))),
    ("type", _decl(_member(key="id"))),
    ("key_duplicate_column", _decl(_member(key=["id", "id"]))),
    ("key_required", _decl(_member(kind="delete", key=[]))),
    ("key_forbidden", _decl(_member(kind="command", command="enqueue"))),
    ("command_required", _decl(_member(kind="command", key=...))),
    ("identifier", _decl(_member(kind="command", key=..., command="not a name"))),
    ("command_forbidden", _decl(_member(command="enqueue"))),
    ("failure_policy", _decl(_member(failure_policy="retry"))),
    ("max_items", _decl(_member(max_items=0))),
    ("max_items", _decl(_member(max_items=MAX_ITEMS_CEILING + 1))),
    ("max_items", _decl(_member(max_items=True))),
    ("type", _decl(_member(input=""))),
]


@pytest.mark.parametrize(("rule", "raw"), DECLARATION_REFUSALS,
                         ids=[f"{rule}-{i}" for i, (rule, _) in enumerate(DECLARATION_REFUSALS)])
def test_each_declaration_refusal_names_its_rule(rule: str, raw: Any) -> None:
    """A declaration breaking one rule is refused with that rule; nothing is parsed."""
    with pytest.raises(EffectDeclarationInvalid) as caught:
        parse_declaration(raw)
    assert caught.value.detail["rule"] == rule
    assert caught.value.code == "effect_declaration_invalid"


@pytest.mark.parametrize("data", [b'{"version": "a", "version": "b"}', b'{"n": 1.5}',
                                  b'{"n": NaN}', b"{", b"\xff\xfe"])
def test_declaration_files_are_strict_json(data: bytes) -> None:
    """Duplicate keys, non-integer numbers, NaN, bad syntax and non-UTF-8 are refused."""
    with pytest.raises(EffectDeclarationInvalid) as caught:
        parse_declaration_bytes(data)
    assert caught.value.detail["rule"] in ("json", "encoding")


def test_a_valid_declaration_keeps_every_field_and_defaults_halt() -> None:
    """Parsed members keep their fields; failure_policy defaults to halt; the CID is stable."""
    declaration = parse_declaration_bytes(
        b'{"version": "marque-effect-set/0.1", "members": [{"effect_id": "fix", "kind": '
        b'"upsert", "table": "app.customers", "key": ["id"], "max_items": 3, '
        b'"input": "fix.csv"}]}')
    member = declaration.members[0]
    assert (member.kind, member.table, member.key, member.failure_policy.value,
            member.max_items, member.input) == (Kind.UPSERT, "app.customers", ("id",), "halt",
                                                3, "fix.csv")
    assert "input" not in declaration.to_json()["members"][0]
    assert declaration.declaration_cid == parse_declaration(declaration.to_json()).declaration_cid


# -- input relations ------------------------------------------------------------------

INPUT_REFUSALS = [
    ("format", b"[]", "xml"),
    ("encoding", b"id\n\xff\n", "csv"),
    ("encoding", b"\xff", "json"),
    ("json", b'[{"id": 1, "id": 2}]', "json"),
    ("json", b'[{"amount": 1.25}]', "json"),
    ("shape", b'{"id": 1}', "json"),
    ("shape", b"[[1, 2]]", "json"),
    ("value_type", b'[{"id": {"nested": 1}}]', "json"),
    ("value_type", b'[{"id": "\\ud800"}]', "json"),
    ("value_type", b'[{"id": 9007199254740993}]', "json"),
    ("columns_differ", b'[{"id": 1}, {"id": 2, "x": 3}]', "json"),
    ("column_name", b'[{"bad col": 1}]', "json"),
    ("csv_header", b"", "csv"),
    ("csv_header", b"id,id\n1,2\n", "csv"),
    ("column_name", b"id,e-mail\n1,2\n", "csv"),
    ("csv_field_count", b"id,email\n1\n", "csv"),
    ("csv", b'id\n"unterminated\n', "csv"),
]


@pytest.mark.parametrize(("rule", "data", "fmt"), INPUT_REFUSALS,
                         ids=[f"{rule}-{i}" for i, (rule, _, _) in enumerate(INPUT_REFUSALS)])
def test_each_input_refusal_names_its_rule(rule: str, data: bytes, fmt: str) -> None:
    """An input file breaking one rule is refused with that rule."""
    with pytest.raises(EffectInputInvalid) as caught:
        capture_input(data, fmt)
    assert caught.value.detail["rule"] == rule


def test_a_captured_input_is_the_relation_not_the_bytes() -> None:
    """Row order, key order, line endings and a BOM do not change input_cid; a value does."""
    a = capture_input(b"id,email\n1,a\n2,b\n", "csv")
    b = capture_input(b"\xef\xbb\xbfemail,id\r\n\"b\",2\r\na,1\r\n", "csv")
    assert a.input_cid == b.input_cid and a.source_sha256 != b.source_sha256
    assert capture_input(b"id,email\n1,a\n2,c\n", "csv").input_cid != a.input_cid
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.input_cid = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.rows[0]["id"] = "9"  # type: ignore[index]


def test_csv_values_are_strings_and_json_values_keep_their_types() -> None:
    """CSV has no null: an empty field is the empty string; JSON keeps ints, bools, null."""
    assert capture_input(b"id,note\n1,\n", "csv").to_json()["rows"] == [{"id": "1", "note": ""}]
    assert capture_input(b'[{"id": 1, "ok": true, "note": null}]', "json").to_json()["rows"] == [
        {"id": 1, "note": None, "ok": True}]


# -- binding members to their inputs -----------------------------------------------------


def _bind(members: list[dict[str, Any]], files: dict[str, tuple[bytes, str]]) -> Any:
    return bind(parse_declaration(_decl(*members)),
                {k: capture_input(data, fmt) for k, (data, fmt) in files.items()})


BIND_REFUSALS: list[tuple[type[Exception], str, list[dict[str, Any]],
                          dict[str, tuple[bytes, str]]]] = [
    (EffectInputInvalid, "missing_input", [_member()], {}),
    (EffectInputInvalid, "unknown_input", [_member()],
     {"fix": (b"id,email\n1,a\n", "csv"), "other": (b"[]", "json")}),
    (EffectInputInvalid, "missing_key_column", [_member()], {"fix": (b"email\na\n", "csv")}),
    (EffectInputInvalid, "no_change_columns", [_member()], {"fix": (b"id\n1\n", "csv")}),
    (EffectInputInvalid, "extra_columns", [_member(kind="delete")],
     {"fix": (b"id,email\n1,a\n", "csv")}),
    (EffectInputInvalid, "key_value_type", [_member()],
     {"fix": (b'[{"id": null, "email": "a"}]', "json")}),
    (EffectInputInvalid, "key_value_type", [_member()],
     {"fix": (b'[{"id": true, "email": "a"}]', "json")}),
    (EffectInputInvalid, "mixed_key_types", [_member()],
     {"fix": (b'[{"id": 1, "email": "a"}, {"id": "2", "email": "b"}]', "json")}),
    (EffectDuplicateIdentity, "duplicate_identity", [_member()],
     {"fix": (b"id,email\n1,a\n1,b\n", "csv")}),
    (EffectDuplicateIdentity, "duplicate_identity", [_member(kind="upsert")],
     {"fix": (b"id,email\n1,a\n1,a\n", "csv")}),
    (EffectDuplicateIdentity, "duplicate_identity",
     [_member(kind="command", key=..., command="enqueue")],
     {"fix": (b"job\nx\nx\n", "csv")}),
    (EffectDuplicateIdentity, "duplicate_identity", [_member(kind="create")],
     {"fix": (b"id,email\n1,a\n1,b\n", "csv")}),
    (EffectDuplicateIdentity, "overlapping_members",
     [_member(), _member(effect_id="gone", kind="delete")],
     {"fix": (b"id,email\n1,a\n", "csv"), "gone": (b"id\n1\n", "csv")}),
]


@pytest.mark.parametrize(("error", "rule", "members", "files"), BIND_REFUSALS,
                         ids=[f"{rule}-{i}" for i, (_, rule, _, _) in enumerate(BIND_REFUSALS)])
def test_each_binding_refusal_names_its_rule(error: type[Exception], rule: str,
                                             members: list[dict[str, Any]],
                                             files: dict[str, tuple[bytes, str]]) -> None:
    """Binding a member to an input that breaks one rule is refused with that rule."""
    with pytest.raises(error) as caught:
        _bind(members, files)
    assert caught.value.detail["rule"] == rule  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "extra", "data", "counted"), [
    ("create", {}, b"msg\na\na\nb\n", "created rows"),
    ("update", {}, b"id,email\n1,a\n2,b\n3,c\n", "unique target identities"),
    ("delete", {}, b"id\n1\n2\n3\n", "unique target identities"),
    ("upsert", {}, b"id,email\n1,a\n2,b\n3,c\n", "unique upsert keys"),
    ("command", {"key": ..., "command": "enqueue"}, b"job\na\nb\nc\n",
     "target-plus-payload items"),
])
def test_item_limits_count_as_the_seed_says(kind: str, extra: dict[str, Any], data: bytes,
                                            counted: str) -> None:
    """Three items under max_items 2 are refused, counted per kind; max_items 3 binds."""
    fields = {"kind": kind, **extra}
    if kind == "create":
        fields["key"] = ...
    with pytest.raises(EffectMaxItemsExceeded) as caught:
        _bind([_member(max_items=2, **fields)], {"fix": (data, "csv")})
    assert caught.value.detail == {"count": 3, "max_items": 2, "counted_as": counted,
                                   "effect_id": "fix"}
    bound = _bind([_member(max_items=3, **fields)], {"fix": (data, "csv")})
    assert bound.members[0].item_count == 3


def test_identical_create_rows_are_distinct_occurrences_not_duplicates() -> None:
    """Two identical create rows stay two items: same content_cid, occurrences 0 and 1."""
    bound = _bind([_member(kind="create", key=...)], {"fix": (b"msg\nx\nx\n", "csv")})
    keys = [dict(item.row_or_item_key) for item in bound.members[0].items]
    assert keys[0]["content_cid"] == keys[1]["content_cid"]
    assert [k["occurrence"] for k in keys] == [0, 1]


def test_keyed_rows_are_in_canonical_target_identity_order() -> None:
    """Integer keys order numerically, string keys by UTF-16 code units, whatever the input."""
    ints = _bind([_member()], {"fix": (b'[{"id": 10, "e": "a"}, {"id": 2, "e": "b"}]', "json")})
    assert [dict(i.row_or_item_key) for i in ints.members[0].items] == [{"id": 2}, {"id": 10}]
    strs = _bind([_member()], {"fix": ("id,e\n\ue000,a\n😀,b\nb,c\n".encode(), "csv")})
    assert [i.row_or_item_key["id"] for i in strs.members[0].items] == ["b", "😀", "\ue000"]


def test_an_empty_input_binds_to_zero_items() -> None:
    """An explicitly empty relation is a member with no items, not an error."""
    bound = _bind([_member()], {"fix": (b"[]", "json")})
    assert bound.members[0].item_count == 0
