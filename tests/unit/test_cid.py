"""Tests for marque.cid: RFC 8785 canonical JSON and content identifiers."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.cid import canonicalize, cid, is_cid
from marque.errors import InvalidInput


def _double(bits: int) -> float:
    return float(struct.unpack(">d", bits.to_bytes(8, "big"))[0])


# -- numbers: RFC 8785 Appendix B -------------------------------------------------

APPENDIX_B = [
    (0x0000000000000000, "0"),
    (0x8000000000000000, "0"),
    (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"),
    (0x7FEFFFFFFFFFFFFF, "1.7976931348623157e+308"),
    (0xFFEFFFFFFFFFFFFF, "-1.7976931348623157e+308"),
    (0x4340000000000000, "9007199254740992"),
    (0xC340000000000000, "-9007199254740992"),
    (0x4430000000000000, "295147905179352830000"),
    (0x44B52D02C7E14AF5, "9.999999999999997e+22"),
    (0x44B52D02C7E14AF6, "1e+23"),
    (0x44B52D02C7E14AF7, "1.0000000000000001e+23"),
    (0x444B1AE4D6E2EF4E, "999999999999999700000"),
    (0x444B1AE4D6E2EF4F, "999999999999999900000"),
    (0x444B1AE4D6E2EF50, "1e+21"),
    (0x3EB0C6F7A0B5ED8C, "9.999999999999997e-7"),
    (0x3EB0C6F7A0B5ED8D, "0.000001"),
    (0x41B3DE4355555553, "333333333.3333332"),
    (0x41B3DE4355555554, "333333333.33333325"),
    (0x41B3DE4355555555, "333333333.3333333"),
    (0x41B3DE4355555556, "333333333.3333334"),
    (0x41B3DE4355555557, "333333333.33333343"),
    (0xBECBF647612F3696, "-0.0000033333333333333333"),
    (0x43143FF3C1CB0959, "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "expected"), APPENDIX_B, ids=[f"{b:016x}" for b, _ in APPENDIX_B])
def test_appendix_b_numbers(bits: int, expected: str) -> None:
    """Every RFC 8785 Appendix B double serializes to the published string."""
    assert canonicalize(_double(bits)) == expected.encode("ascii")


@pytest.mark.parametrize(
    "bits", [0x7FF8000000000000, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000]
)
def test_appendix_b_nan_and_infinity_rejected(bits: int) -> None:
    """The NaN and Infinity bit patterns of Appendix B are refused."""
    with pytest.raises(InvalidInput):
        canonicalize(_double(bits))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (0.000001, "0.000001"),
        (123456789012345680000.0, "123456789012345680000"),
        (-0.0, "0"),
        (1.0, "1"),
        (-1.5, "-1.5"),
        (0.1, "0.1"),
        (100.0, "100"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (1.25e25, "1.25e+25"),
    ],
)
def test_number_formatting_edges(value: float, expected: str) -> None:
    """Floats use ECMAScript Number.prototype.toString plain/exponent thresholds."""
    assert canonicalize(value) == expected.encode("ascii")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, "0"), (-7, "-7"), (2**53, "9007199254740992"), (-(2**53), "-9007199254740992")],
)
def test_integers_within_double_range(value: int, expected: str) -> None:
    """Python ints up to 2**53 in magnitude serialize as plain integers."""
    assert canonicalize(value) == expected.encode("ascii")


@pytest.mark.parametrize(
    "value", [9007199254740994, 1152921504606847000, -295147905179352830000, 10**20]
)
def test_large_integers_that_are_canonical_doubles(value: int) -> None:
    """An int above 2**53 is accepted when its digits are exactly the canonical double text."""
    assert canonicalize(value) == str(value).encode("ascii")
    assert canonicalize(value) == canonicalize(float(value))


@pytest.mark.parametrize("value", [2**53 + 1, 2**60, -(2**53) - 1, 10**21, 10**400])
def test_integers_that_change_as_doubles_rejected(value: int) -> None:
    """An int whose value would change as an IEEE-754 double is refused, never rounded."""
    with pytest.raises(InvalidInput):
        canonicalize(value)


def test_booleans_are_literals_not_integers() -> None:
    """bool serializes as true/false even though it is an int subclass."""
    assert canonicalize([True, False, None, 1, 0]) == b"[true,false,null,1,0]"


# -- key sorting: RFC 8785 §3.2.3 -------------------------------------------------


def test_rfc_sorting_example_uses_utf16_code_units() -> None:
    """Object keys follow the RFC 8785 §3.2.3 order, which is UTF-16 not code-point order."""
    obj = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    expected_order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    out = canonicalize(obj)
    assert list(json.loads(out)) == expected_order
    # Code-point order would put U+FB33 before U+1F600; UTF-16 puts the surrogate pair first.
    assert sorted(obj) != expected_order
    assert out.index("\U0001f600".encode()) < out.index("\ufb33".encode())


def test_nested_objects_sorted_and_compact() -> None:
    """Nested objects are sorted at every level with no insignificant whitespace."""
    assert canonicalize({"b": {"z": 1, "a": [1, {"y": 2, "x": 3}]}, "a": ()}) == (
        b'{"a":[],"b":{"a":[1,{"x":3,"y":2}],"z":1}}'
    )


# -- RFC 8785 §3.2.4 example ---------------------------------------------------------

RFC_INPUT = r"""{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"""


def test_rfc_example_canonical_output() -> None:
    """The RFC 8785 §3.2.4 input canonicalizes to exactly the published bytes."""
    expected = (
        b'{"literals":[null,true,false],'
        b'"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        b'"string":"'
        + "\u20ac".encode()  # literal UTF-8 euro sign
        + b"$"
        + b"\\u000f"  # control char, lowercase hex escape
        + b"\\n"  # short escape
        + b"A'B"
        + b'\\"'  # escaped quote
        + b"\\\\" * 2  # two escaped backslashes
        + b'\\"'  # escaped quote
        + b"/"  # solidus is not escaped
        + b'"}'
    )
    # The same bytes, spelled as the RFC prints them.
    published = (
        r"""{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"""
        r""""string":"€$\u000f\nA'B\"\\\\\"/"}"""
    ).encode()
    assert expected == published
    assert canonicalize(json.loads(RFC_INPUT)) == expected


# -- strings ----------------------------------------------------------------------

_SHORT = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}


@pytest.mark.parametrize("code", range(0x20))
def test_control_characters_escaped(code: int) -> None:
    """Each control char 0x00-0x1f gets its short escape or a lowercase \\u00xx escape."""
    expected = _SHORT.get(code, f"\\u{code:04x}")
    assert canonicalize(chr(code)) == f'"{expected}"'.encode("ascii")


def test_quote_and_backslash_escaped() -> None:
    """Only the quote and backslash among printable ASCII are escaped."""
    assert canonicalize('a"b\\c') == b'"a\\"b\\\\c"'


def test_del_and_solidus_literal() -> None:
    """DEL (0x7f) and '/' are emitted literally."""
    assert canonicalize("\x7f/") == b'"\x7f/"'


def test_non_ascii_literal_utf8() -> None:
    """Non-ASCII characters, including astral ones, are literal UTF-8, never \\u-escaped."""
    text = "\u00e9\u20ac\u2028\U0001f600\ufeff"
    assert canonicalize(text) == b'"' + text.encode("utf-8") + b'"'
    assert canonicalize({text: text}) == b'{"' + text.encode() + b'":"' + text.encode() + b'"}'


# -- rejections -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        2**53 + 1,
        -(2**53) - 1,
        10**21,
        {1: "x"},
        {None: "x"},
        {("a",): "x"},
        b"bytes",
        bytearray(b"x"),
        {1, 2},
        frozenset(),
        Decimal("1.5"),
        object(),
        "\ud800",
        "a\udfffb",
        {"\ud83d": 1},
        complex(1, 2),
    ],
    # A bare object's repr holds its address: its id must not differ from run to run
    # (pytest-xdist's workers must collect the same ids).
    ids=lambda value: "object()" if type(value) is object else repr(value),
)
def test_rejected_values(value: Any) -> None:
    """Values with no canonical JSON form raise InvalidInput."""
    with pytest.raises(InvalidInput):
        canonicalize(value)


@pytest.mark.parametrize(
    "value", [[float("nan")], {"a": {"b": b"x"}}, {"k": [1, 2**60]}, {"s": ["\udc00"]}]
)
def test_rejected_when_nested(value: Any) -> None:
    """Invalid values are refused wherever they are nested."""
    with pytest.raises(InvalidInput):
        canonicalize(value)


def test_rejection_names_json_path() -> None:
    """The InvalidInput message and detail name the JSON path of the offending value."""
    with pytest.raises(InvalidInput) as info:
        canonicalize({"a": [1, {"b c": float("nan")}]})
    assert '$.a[1]["b c"]' in info.value.message
    assert info.value.detail["path"] == '$.a[1]["b c"]'
    assert info.value.code == "input_invalid"


def test_cycle_rejected() -> None:
    """A self-referencing structure raises InvalidInput rather than recursing forever."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidInput):
        canonicalize(loop)


# -- cid ------------------------------------------------------------------------------

PINNED_HEX = "eca8cfb31ab74533e1eb2f4c74d2d55dfe3c79ac704787e54be8647ea7777eb1"


def test_pinned_cid_vector() -> None:
    """cid of a fixed object is sha256 of its canonical bytes, pinned to a known hex digest."""
    preimage = b'{"a":1,"b":[true,null,"x"]}'
    assert hashlib.sha256(preimage).hexdigest() == PINNED_HEX
    assert cid({"a": 1, "b": [True, None, "x"]}) == "sha256:" + PINNED_HEX
    assert cid({"b": [True, None, "x"], "a": 1}) == "sha256:" + PINNED_HEX


def test_cid_format() -> None:
    """cid returns 'sha256:' followed by 64 lowercase hex digits."""
    value = cid({"x": [1.5, "y"]})
    assert value.startswith("sha256:")
    assert len(value) == len("sha256:") + 64
    assert is_cid(value)


def test_cid_independent_of_insertion_order() -> None:
    """Dicts with the same content but different insertion order share a CID."""
    a = {"z": 1, "a": {"q": [1, 2], "p": None}, "m": "t"}
    b = {"m": "t", "a": {"p": None, "q": [1, 2]}, "z": 1}
    assert cid(a) == cid(b)
    assert cid(a) != cid({**a, "z": 2})


def test_cid_exclude_drops_only_that_key() -> None:
    """exclude removes just that top-level key from the preimage and leaves the input intact."""
    obj = {"cid": "sha256:" + "0" * 64, "body": {"cid": "inner"}, "n": 1}
    before = copy.deepcopy(obj)
    got = cid(obj, exclude="cid")
    assert obj == before
    assert got == cid({"body": {"cid": "inner"}, "n": 1})
    assert got != cid(obj)
    assert cid(obj, exclude="absent") == cid(obj)


def test_cid_exclude_requires_object() -> None:
    """exclude on a non-object is refused rather than silently ignored."""
    with pytest.raises(InvalidInput):
        cid([1, 2], exclude="cid")


def test_canonicalize_does_not_mutate_input() -> None:
    """canonicalize leaves its input (including key order) unchanged."""
    obj = {"b": [3, {"d": 1, "c": 2}], "a": 1}
    before = copy.deepcopy(obj)
    canonicalize(obj)
    cid(obj)
    assert obj == before
    assert list(obj) == ["b", "a"]
    assert list(obj["b"][1]) == ["d", "c"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sha256:" + PINNED_HEX, True),
        ("sha256:" + "0" * 64, True),
        ("sha256:" + PINNED_HEX.upper(), False),
        ("sha256:" + PINNED_HEX[:-1], False),
        ("sha256:" + PINNED_HEX + "0", False),
        ("sha256:" + PINNED_HEX + "\n", False),
        ("sha512:" + PINNED_HEX, False),
        (PINNED_HEX, False),
        ("", False),
    ],
)
def test_is_cid(value: str, expected: bool) -> None:
    """is_cid accepts exactly 'sha256:' plus 64 lowercase hex digits."""
    assert is_cid(value) is expected


# -- properties --------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def _same(original: Any, parsed: Any) -> bool:
    """Exact structural equality; a float may come back as an equal int (e.g. 1.0 -> 1)."""
    if isinstance(original, bool) or original is None:
        return parsed is original
    if isinstance(original, float):
        if isinstance(parsed, bool) or not isinstance(parsed, int | float):
            return False
        return math.isfinite(parsed) and float(parsed) == original
    if isinstance(original, int):
        return type(parsed) is int and parsed == original
    if isinstance(original, str):
        return isinstance(parsed, str) and parsed == original
    if isinstance(original, list):
        return (
            isinstance(parsed, list)
            and len(parsed) == len(original)
            and all(_same(a, b) for a, b in zip(original, parsed, strict=True))
        )
    if isinstance(original, dict):
        return (
            isinstance(parsed, dict)
            and parsed.keys() == original.keys()
            and all(_same(original[k], parsed[k]) for k in original)
        )
    return False


@settings(max_examples=300)
@given(_json_values)
def test_round_trip_is_exact(value: Any) -> None:
    """json.loads(canonicalize(v)) reproduces v exactly, floats bit-for-bit (up to -0)."""
    assert _same(value, json.loads(canonicalize(value)))


@settings(max_examples=300)
@given(_json_values)
def test_canonicalize_idempotent_through_json(value: Any) -> None:
    """Canonicalizing the parsed canonical form yields the same bytes again."""
    once = canonicalize(value)
    assert canonicalize(json.loads(once)) == once


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_round_trips_bit_exact(value: float) -> None:
    """Every finite double parses back from its canonical text to the same value."""
    parsed = float(json.loads(canonicalize(value)))
    assert parsed == value
    if value != 0:
        assert struct.pack(">d", parsed) == struct.pack(">d", value)
