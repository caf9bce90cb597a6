"""A database value as JSON: what results, samples and row images carry."""

from __future__ import annotations

from typing import Any

__all__ = ["jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` as a JSON value: bytes as hex, JSON scalars as they are, anything else
    (a decimal, a date) as its text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
