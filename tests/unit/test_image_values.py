"""The typed JSON of row-image values: what each value becomes, how the undo binds it
back, and how a table shows it (marque.target.image_values)."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

import pytest

from marque.cid import canonicalize
from marque.target.image_values import bind_text, display, encode, unencoded_reason


@pytest.mark.parametrize(("value", "type_name", "encoded"), [
    (1, "integer", 1), (2**53 + 1, "bigint", "9007199254740993"), ("x", "text", "x"),
    (None, "jsonb", None), (1.5, "double precision", 1.5),
    (Decimal("0.00000000000000000001"), "numeric", "0.00000000000000000001"),
    (Decimal("12345678901234567890.5"), "numeric", "12345678901234567890.5"),
    (datetime.datetime(2026, 12, 4, 18, 0, 0, 123456, tzinfo=datetime.UTC),
     "timestamp with time zone", "2026-12-04 18:00:00.123456+00:00"),
    (uuid.UUID(int=1), "uuid", "00000000-0000-0000-0000-000000000001"),
    (b"\x00\xff", "bytea", {"$bytes": "AP8="}), (b"", None, {"$bytes": ""}),
    ('{"a": 1, "b": [1.5, null]}', "jsonb", {"a": 1, "b": [1.5, None]}),
    ('{"p": 10.50}', "jsonb", {"$json": '{"p": 10.50}'}),
    ("12345678901234567890", "jsonb", {"$json": "12345678901234567890"}),
    ("null", "jsonb", {"$json": "null"}),
    ('{"$json": "x"}', "jsonb", {"$json": '{"$json": "x"}'}),
    ('{ "a":1, "a":2 }', "json", '{ "a":1, "a":2 }'),
    ([[1, None], [3, 4]], "integer[]", [[1, None], [3, 4]]),
    ([Decimal("1.10"), None], "numeric[]", ["1.10", None]),
    ([b"\x00"], "bytea[]", {"$unencoded": "bytea[]", "text": "[b'\\x00']"}),
    (datetime.timedelta(days=30), "interval", {"$unencoded": "interval",
                                               "text": "30 days, 0:00:00"}),
])
def test_each_value_has_one_exact_form(value: Any, type_name: str, encoded: Any) -> None:
    assert encode(value, type_name) == encoded
    canonicalize(encode(value, type_name))  # every form is hashable as RFC 8785 JSON


@pytest.mark.parametrize(("encoded", "type_name", "bound"), [
    ({"$bytes": "AP8="}, "bytea", "00ff"), ({"$bytes": "AP8="}, "blob", "00ff"),
    ({"a": 1}, "jsonb", '{"a": 1}'), ({"$json": '{"p": 10.50}'}, "jsonb", '{"p": 10.50}'),
    ('{ "a":1 }', "json", '{ "a":1 }'),
    (["a b", 'q"\\', None, ""], "text[]", '{"a b","q\\"\\\\",NULL,""}'),
    ([[1, None], [3, 4]], "integer[]", '{{"1",NULL},{"3","4"}}'), ([], "integer[]", "{}"),
    ("1 mon", "interval", "1 mon"), (None, "jsonb", None),
])
def test_the_undo_binds_each_form_as_a_json_scalar(encoded: Any, type_name: str,
                                                   bound: Any) -> None:
    assert bind_text(encoded, type_name) == bound


def test_an_unencoded_value_is_never_bound_and_says_its_type() -> None:
    assert unencoded_reason("r", {"$unencoded": "int4range", "text": "[1,5)"}) == (
        "column r holds a value of type int4range the row image cannot carry exactly, so it "
        "cannot be restored")
    assert unencoded_reason("r", {"a": 1}) is None


def test_a_table_shows_json_compact_and_bytes_tagged() -> None:
    assert display({"a": [1, None]}) == '{"a":[1,null]}'
    assert display({"$bytes": "AP8="}) == "bytes:AP8="
    assert display({"$json": '{"p": 10.50}'}) == '{"p": 10.50}'
    assert display("bytes:AP8=") == '"bytes:AP8="'
    assert display(None) == "null"
