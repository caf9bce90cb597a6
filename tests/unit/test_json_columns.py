"""The two JSON column codecs differ on purpose: the ledger's ``sorted_json`` is Python's
fast sorted encoder, the Harbourmaster store's ``canonical_json`` is RFC 8785, so that a
body read back re-hashes to what was logged."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.cid import cid
from marque.harbour.store import columns
from marque.ledger import statements


def _json(floats: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | floats | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                   max_size=4),
        max_leaves=12)


# RFC 8785 writes an integral double of 2**53 or more as digits (4.5e16 as
# "45000000000000000"): it reads back as an int, equal as JSON but not to Python.
_WITHIN_2_53 = _json(st.floats(-(2.0**53), 2.0**53))
_ANY_FINITE = _json(st.floats(allow_nan=False, allow_infinity=False))


@pytest.mark.parametrize(("value", "canonical", "sorted_text"), [
    (1.0, "1", "1.0"),
    (1e-7, "1e-7", "1e-07"),
    ("é", '"é"', '"\\u00e9"'),
    # RFC 8785 sorts keys by UTF-16 code units: U+1F600 (D83D DE00) before U+FFFF.
    ({"\uffff": 1, "\U0001f600": 2}, '{"\U0001f600":2,"\uffff":1}',
     '{"\\uffff":1,"\\ud83d\\ude00":2}'),
])
def test_canonical_json_is_rfc_8785_where_sorted_json_is_not(
    value: Any, canonical: str, sorted_text: str
) -> None:
    """canonical_json writes RFC 8785 numbers, escapes and key order; sorted_json does not."""
    assert columns.canonical_json(value) == canonical
    assert statements.sorted_json(value) == sorted_text


@settings(max_examples=200, deadline=None)
@given(_WITHIN_2_53)
def test_both_read_back_the_value_they_wrote(value: Any) -> None:
    """sorted_json and canonical_json both round-trip a JSON value through loads."""
    assert columns.loads(columns.canonical_json(value)) == value
    assert statements.loads(statements.sorted_json(value)) == value


@settings(max_examples=200, deadline=None)
@given(_ANY_FINITE)
def test_canonical_text_read_back_writes_the_same_text_and_cid(value: Any) -> None:
    """A body canonical_json wrote, read back, is written and hashed exactly as before."""
    text = columns.canonical_json(value)
    assert columns.canonical_json(columns.loads(text)) == text
    assert cid(columns.loads(text)) == cid(value)


def test_none_stays_none() -> None:
    """None is written as SQL NULL and NULL reads back as None, in both codecs."""
    assert columns.canonical_json(None) is None and columns.loads(None) is None
    assert statements.sorted_json(None) is None and statements.loads(None) is None
