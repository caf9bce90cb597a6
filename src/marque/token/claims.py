"""The shapes a token's claims must have before any of them is believed.

Shared by every reader of a Marque token (marques, proofs, preview and query
tokens): each check names the claim and raises the reader's own error class,
so a malformed claim is refused with that token's stable code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from marque.change import is_json_int
from marque.cid import MAX_SAFE_INT
from marque.errors import MarqueError, MarqueInvalid

__all__ = ["int_claim", "nonempty_str", "object_claim"]


def nonempty_str(value: Any, name: str, error: type[MarqueError]) -> str:
    """``value`` if it is a non-empty string; ``error`` naming ``name`` otherwise."""
    if not isinstance(value, str) or not value:
        raise error(f"{name} must be a non-empty string")
    return value


def int_claim(value: Any, name: str, error: type[MarqueError]) -> int:
    """``value`` as an integer number of seconds in I-JSON's exact range; ``error`` otherwise."""
    if not is_json_int(value):
        raise error(f"{name} must be an integer number of seconds")
    if abs(value) > MAX_SAFE_INT:
        raise error(f"{name} is out of range")
    return int(value)


def object_claim(value: Any, name: str, members: Iterable[str]) -> dict[str, str]:
    """The named non-empty string ``members`` of object claim ``name``; :class:`MarqueInvalid`
    if it is not an object or one of them is missing or not a non-empty string."""
    if not isinstance(value, dict):
        raise MarqueInvalid(f"claim {name} must be a JSON object")
    return {m: nonempty_str(value.get(m), f"claim {name}.{m}", MarqueInvalid) for m in members}
