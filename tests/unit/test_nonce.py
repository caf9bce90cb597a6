"""Nonce validation (DESIGN §3): 1..256 UTF-8 bytes of printable text, refused as input_invalid."""

from __future__ import annotations

import pytest

from marque.errors import InvalidInput
from marque.pilot.execution import MAX_NONCE_BYTES, check_nonce


@pytest.mark.parametrize("nonce", ["n-1", "élan", "a b", "\xa0", "x" * MAX_NONCE_BYTES,
                                   "é" * (MAX_NONCE_BYTES // 2), "日本"])
def test_printable_nonces_are_accepted(nonce: str) -> None:
    assert check_nonce(nonce) == nonce


@pytest.mark.parametrize("nonce", ["", "a\x00", "tab\there", "new\nline", "\x1f", "del\x7f",
                                   "c1\x80", "c1\x9f", "x" * (MAX_NONCE_BYTES + 1),
                                   "é" * (MAX_NONCE_BYTES // 2 + 1)])
def test_empty_long_or_control_nonces_are_input_invalid(nonce: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_nonce(nonce)
    assert caught.value.code == "input_invalid"


def test_a_non_string_nonce_is_input_invalid() -> None:
    with pytest.raises(InvalidInput):
        check_nonce(42)  # type: ignore[arg-type]
