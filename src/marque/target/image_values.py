"""The values a row image holds: typed JSON, faithful enough to restore (DESIGN §10, §11.2).

A row image is JSON, hashed by its canonical form (RFC 8785), shown to
approvers and bound back by ``marque undo``. Each value is encoded by what the
engine gave and, on PostgreSQL, by its column's declared type:

* NULL, booleans, text and integers up to 2**53 as themselves; larger integers
  and every ``numeric``/decimal as their exact decimal text (never a float that
  rounds); finite floats as JSON numbers (the shortest text that reads back the
  same double);
* ``jsonb`` as the JSON value itself — unless that would not read back as the
  same jsonb (a number a double does not carry exactly, such as ``1.50`` or a
  19-digit integer; a top-level JSON ``null``, which would read as SQL NULL; an
  object whose only key is ``$json``): then ``{"$json": "<its text>"}``;
* ``json`` as its text, verbatim: ``json`` keeps its input's whitespace, key
  order and repeated keys, which no JSON value can carry;
* arrays as JSON lists (nested for several dimensions) of encoded elements;
* ``bytea`` and SQLite BLOBs as ``{"$bytes": "<base64>"}``;
* timestamps, dates, times, uuids and anything else psycopg reads as a
  Python value with a canonical text as that text (intervals as PostgreSQL's own
  text, which keeps months apart from days);
* a value none of this carries faithfully as
  ``{"$unencoded": "<type name>", "text": "<its text, to read>"}`` — shown,
  never restored: an undo of that statement is ``undo_unavailable``.

Which columns hold a typed form is the image's ``types`` (column → the engine's
type name): every ``json``, ``jsonb``, ``bytea`` and array column on
PostgreSQL, every column where a BLOB or an unencoded value was seen on SQLite.
A table of plain columns has no ``types`` and its images keep the bytes they
had before typed values (``marque-row-diff/0.1``).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import uuid
from decimal import Decimal
from typing import Any

from marque.cid import MAX_SAFE_INT, canonicalize

__all__ = ["BYTES_TAG", "JSON_TAG", "UNENCODED_TAG", "typed_kind", "encode", "is_bytes",
           "bind_text", "unencoded_reason", "display"]

#: The tags of the typed forms (an object with exactly that key, or with it first).
BYTES_TAG = "$bytes"
JSON_TAG = "$json"
UNENCODED_TAG = "$unencoded"

#: The Python values whose ``str`` is a text their type reads back exactly (a timedelta
#: is not one: it merges months into days, so intervals are read as text instead).
_PLAIN = (str, bool, int, float, Decimal, datetime.date, datetime.time, uuid.UUID,
          ipaddress.IPv4Address, ipaddress.IPv6Address, ipaddress.IPv4Interface,
          ipaddress.IPv6Interface, ipaddress.IPv4Network, ipaddress.IPv6Network)


def typed_kind(type_name: str | None) -> str | None:
    """How a column of ``type_name`` (PostgreSQL ``format_type``) is encoded: ``json``,
    ``jsonb``, ``bytea``, ``array`` — or None for a value that is its own text."""
    if not type_name:
        return None
    if type_name.endswith("]"):
        return "array"
    if type_name in ("json", "jsonb", "bytea"):
        return type_name
    return None


class _Inexact(Exception):
    """A jsonb number a double does not carry exactly."""


def _jsonb_int(text: str) -> int:
    number = int(text)
    if abs(number) > MAX_SAFE_INT:
        raise _Inexact(text)
    return number


def _jsonb_float(text: str) -> float:
    number = float(text)
    try:
        # The number as RFC 8785 writes it, read back as PostgreSQL's numeric would.
        again = format(Decimal(canonicalize(number).decode()), "f")
    except Exception as exc:  # canonicalize refuses non-finite numbers
        raise _Inexact(text) from exc
    if again != text:
        raise _Inexact(text)
    return number


def _jsonb(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        parsed = json.loads(text, parse_int=_jsonb_int, parse_float=_jsonb_float)
    except (_Inexact, ValueError):
        return {JSON_TAG: text}
    if parsed is None or (isinstance(parsed, dict) and list(parsed) == [JSON_TAG]):
        return {JSON_TAG: text}
    return parsed


def _unencoded(type_name: str | None, value: Any) -> dict[str, Any]:
    return {UNENCODED_TAG: type_name or type(value).__name__, "text": str(value)}


def _scalar(value: Any, type_name: str | None) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if abs(value) <= MAX_SAFE_INT else str(value)
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) \
            else str(value)
    if isinstance(value, Decimal):
        text = str(value)
        return format(value, "f") if "E" in text and value.is_finite() else text
    if isinstance(value, _PLAIN):
        return str(value)
    return _unencoded(type_name, value)


def _array(value: Any, type_name: str) -> Any:
    if isinstance(value, list):
        element = type_name[:type_name.index("[")] if "[" in type_name else None
        if typed_kind(element) is not None:
            return _unencoded(type_name, value)
        items = [_array(v, type_name) if isinstance(v, list) else _scalar(v, element)
                 for v in value]
        if any(isinstance(i, dict) for i in items):
            return _unencoded(type_name, value)
        return items
    return _unencoded(type_name, value)


def encode(value: Any, type_name: str | None = None) -> Any:
    """``value`` as the image holds it (see the module text); ``type_name`` is its
    column's declared type on PostgreSQL (None: by the value alone, as on SQLite)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    kind = typed_kind(type_name)
    if kind == "jsonb":
        return _jsonb(value)
    if kind == "json":
        return value if isinstance(value, str) else _unencoded(type_name, value)
    if kind == "array":
        return _array(value, type_name or "")
    if isinstance(value, list | dict | tuple):
        return _unencoded(type_name, value)
    return _scalar(value, type_name)


def unencoded_reason(column: str, value: Any) -> str | None:
    """Why ``value`` (an image value of ``column``) cannot be bound back (None: it can)."""
    if isinstance(value, dict) and UNENCODED_TAG in value:
        return (f"column {column} holds a value of type {value.get(UNENCODED_TAG)} the row image "
                "cannot carry exactly, so it cannot be restored")
    return None


def _array_literal(items: Any) -> str:
    """A PostgreSQL array literal of encoded elements: each non-NULL one quoted, so its
    text is taken as it is (``{"a b",NULL,"1"}``), nested lists as dimensions."""
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
        elif isinstance(item, list):
            parts.append(_array_literal(item))
        else:
            text = item if isinstance(item, str) else json.dumps(item)
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def is_bytes(value: Any) -> bool:
    """Whether ``value`` is an image's ``{"$bytes": …}``."""
    return isinstance(value, dict) and list(value) == [BYTES_TAG]


def bind_text(value: Any, type_name: str | None) -> Any:
    """An image value as the undo binds it — a JSON scalar, as every statement parameter
    is: bytes as hex (the statement decodes it), a jsonb as its JSON text, an array as
    PostgreSQL's array literal (the statement casts each typed parameter)."""
    if is_bytes(value):
        return base64.b64decode(value[BYTES_TAG], validate=True).hex()
    kind = typed_kind(type_name)
    if value is None or kind is None or kind in ("json", "bytea"):
        return value
    if kind == "jsonb":
        if isinstance(value, dict) and list(value) == [JSON_TAG]:
            return value[JSON_TAG]
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, list):
        raise ValueError(f"an array image value is not a list: {str(value)[:80]}")
    return _array_literal(value)


def display(value: Any) -> str:
    """One value as a table shows it: JSON, compact (text, numbers and null stay apart);
    bytes as ``bytes:<base64>``, a jsonb kept as text as that text."""
    if is_bytes(value):
        return f"bytes:{value[BYTES_TAG]}"
    if isinstance(value, dict) and list(value) == [JSON_TAG]:
        return str(value[JSON_TAG])
    if isinstance(value, dict) and UNENCODED_TAG in value:
        return f"<{value.get(UNENCODED_TAG)}> {value.get('text')}"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
