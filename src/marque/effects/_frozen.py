"""Deeply immutable JSON values for the Effect Set's content-addressed objects.

A preview, a receipt or a captured input is named by the CID of its content,
so nothing may change it after the CID is taken. Objects here hold their JSON
parts *frozen* — mappings as :class:`types.MappingProxyType`, arrays as
tuples — and :func:`thaw` gives a fresh, ordinary ``dict``/``list`` copy to
hash or to serialise. Mutating a thawed copy never reaches the original.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["freeze", "thaw", "FrozenJSON"]

#: A JSON value frozen by :func:`freeze`.
FrozenJSON = Any


def freeze(value: Any) -> FrozenJSON:
    """A deeply immutable copy of a JSON-shaped ``value``."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: FrozenJSON) -> Any:
    """A fresh mutable (``dict``/``list``) copy of a frozen or plain JSON ``value``."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(item) for item in value]
    return value
