"""A second, minimal RFC 8785 encoder, written for the tests only.

Test vectors for Marque's CIDs are computed with this, never with
:mod:`marque.cid`, so a bug in the product's canonicaliser cannot agree with
itself. It covers what Marque's preimages hold: null, booleans, integers,
strings, lists and objects (keys sorted by their UTF-16 code units).
"""

from __future__ import annotations

import hashlib
from typing import Any

_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
          "\t": "\\t"}


def jcs_string(text: str) -> str:
    """A JSON string as RFC 8785 writes it."""
    out = []
    for char in text:
        if char in _SHORT:
            out.append(_SHORT[char])
        elif ord(char) < 0x20:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def jcs(value: Any) -> str:
    """``value`` in RFC 8785 canonical form."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return jcs_string(value)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(jcs_string(k) + ":" + jcs(value[k]) for k in keys) + "}"
    raise TypeError(type(value))


def reference_cid(value: Any) -> str:
    """``sha256:`` + hex SHA-256 of the canonical form."""
    return "sha256:" + hashlib.sha256(jcs(value).encode("utf-8")).hexdigest()
