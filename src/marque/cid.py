"""Canonical identities: content identifiers for JSON-shaped values.

Marque names the things it signs, stores and compares by their content: a
marque's change, an Effect Set, and anything else that must be referred to
unambiguously across processes and languages. The name is

    cid(obj) = "sha256:" + hex(sha256(JCS(obj)))

where JCS is the JSON Canonicalization Scheme of RFC 8785. Two parties that
hold the same JSON value compute the same bytes, and so the same CID, whatever
their JSON library, key order or number spelling. That only holds if the
canonical form is produced *exactly*, so this module implements RFC 8785
itself rather than approximating it with ``json.dumps``:

* object keys are sorted by their UTF-16 code units, not by code points;
* strings use ECMAScript ``JSON.stringify`` escaping and are otherwise literal
  UTF-8;
* numbers are written as ECMAScript ``Number.prototype.toString`` writes an
  IEEE-754 double (RFC 8785 §3.2.2.3).

Anything that has no single canonical form (NaN, infinities, integers that would
change value as a double, non-string keys, lone surrogates, non-JSON types) is
refused with :class:`marque.errors.InvalidInput` instead of being guessed at.
"""

from __future__ import annotations

import hashlib
import json.encoder
import math
import re

from marque.errors import InvalidInput

__all__ = ["canonicalize", "cid", "is_cid", "CID_PREFIX", "MAX_SAFE_INT"]

CID_PREFIX = "sha256:"

#: Every integer up to this magnitude is exactly an IEEE-754 double (and always accepted).
MAX_SAFE_INT = 2**53

_CID_RE = re.compile(r"sha256:[0-9a-f]{64}")

# Surrogate code points cannot be encoded as UTF-8. In a Python ``str`` a valid
# astral character is one code point, so any of these is a lone (or hand-split) surrogate.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")

# ECMAScript JSON.stringify / RFC 8785 §3.2.2.2 string escaping.
_ESCAPES: dict[int, str] = {i: f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update(
    {
        ord("\b"): "\\b",
        ord("\t"): "\\t",
        ord("\n"): "\\n",
        ord("\f"): "\\f",
        ord("\r"): "\\r",
        ord('"'): '\\"',
        ord("\\"): "\\\\",
    }
)


class _Rejected(Exception):
    """Internal: a value was refused; carries the path back up to the caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def canonicalize(obj: object) -> bytes:
    """Return the RFC 8785 (JCS) canonical UTF-8 JSON encoding of ``obj``.

    Accepts ``dict`` (with ``str`` keys), ``list``/``tuple``, ``str``, ``int``
    (any up to 2**53 in magnitude, and larger ones only if they are exactly the
    double they denote, see ``_integer``), finite ``float``, ``bool`` and
    ``None``. Raises :class:`~marque.errors.InvalidInput` naming the problem and
    its JSON path for anything else. The input is never modified.
    """
    out: list[str] = []
    try:
        _emit(obj, out)
    except _Rejected as exc:
        path = "$" + "".join(reversed(exc.path))
        raise InvalidInput(
            f"cannot canonicalize value at {path}: {exc.message}", detail={"path": path}
        ) from None
    except RecursionError:
        raise InvalidInput(
            "cannot canonicalize value: nested too deeply (or contains a cycle)"
        ) from None
    return "".join(out).encode("utf-8")


def cid(obj: object, *, exclude: str | None = None) -> str:
    """Return the content identifier ``"sha256:" + hex(sha256(JCS(obj)))``.

    If ``exclude`` is given, ``obj`` must be a ``dict`` and its top-level key
    ``exclude`` (if present) is left out of the preimage, so that an object can
    carry its own CID field. ``obj`` itself is not modified.
    """
    if exclude is not None:
        if not isinstance(obj, dict):
            raise InvalidInput(
                f"cid(exclude={exclude!r}) needs a JSON object, got {type(obj).__name__}"
            )
        obj = {k: v for k, v in obj.items() if k != exclude}
    return CID_PREFIX + hashlib.sha256(canonicalize(obj)).hexdigest()


def is_cid(value: str) -> bool:
    """Whether ``value`` is a well-formed CID: ``sha256:`` and 64 lowercase hex digits."""
    return isinstance(value, str) and _CID_RE.fullmatch(value) is not None


# -- encoding -------------------------------------------------------------------


def _emit(obj: object, out: list[str]) -> None:
    # Exact types first (the common case, and cheap); bool before int: bool is an int
    # subclass. Subclasses of str, int, dict and list fall through to the isinstance chain.
    kind = type(obj)
    if kind is str:
        out.append(_string(obj))  # type: ignore[arg-type]
    elif kind is dict:
        _emit_object(obj, out)  # type: ignore[arg-type]
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(_string(obj))
    elif isinstance(obj, int):
        out.append(_integer(obj))
    elif isinstance(obj, float):
        out.append(_number(obj))
    elif isinstance(obj, dict):
        _emit_object(obj, out)
    elif isinstance(obj, list | tuple):
        _emit_array(obj, out)
    else:
        raise _Rejected(f"{type(obj).__name__} is not a JSON type")


def _emit_object(obj: dict[object, object], out: list[str]) -> None:
    for key in obj:
        if not isinstance(key, str):
            raise _Rejected(f"object key {key!r} is {type(key).__name__}, not str")
    keys: list[str] = list(obj)  # type: ignore[arg-type]
    if all(key.isascii() for key in keys):
        # ASCII code points are UTF-16 code units: plain string order is the same order.
        keys.sort()
    else:
        # Big-endian UTF-16 bytes compare exactly as the sequence of code units does.
        keys.sort(key=lambda key: key.encode("utf-16-be", "surrogatepass"))
    out.append("{")
    first = True
    for key in keys:
        if not first:
            out.append(",")
        first = False
        if _SURROGATE_RE.search(key) is not None:
            raise _Rejected(f"object key {key!r} contains a lone surrogate")
        out.append(_quote(key))
        out.append(":")
        try:
            _emit(obj[key], out)
        except _Rejected as exc:
            exc.path.append(_key_segment(key))
            raise
    out.append("}")


def _emit_array(obj: list[object] | tuple[object, ...], out: list[str]) -> None:
    out.append("[")
    for index, value in enumerate(obj):
        if index:
            out.append(",")
        try:
            _emit(value, out)
        except _Rejected as exc:
            exc.path.append(f"[{index}]")
            raise
    out.append("]")


def _key_segment(key: str) -> str:
    if key.isidentifier():
        return "." + key
    return "[" + _string(key).encode("ascii", "backslashreplace").decode("ascii") + "]"


def _string(value: str) -> str:
    if _SURROGATE_RE.search(value) is not None:
        raise _Rejected("string contains a lone surrogate (not encodable as UTF-8)")
    return _quote(value)


def _quote_translate(value: str) -> str:
    return '"' + value.translate(_ESCAPES) + '"'


# The json module's C string encoder (non-ASCII kept literal) escapes exactly what
# RFC 8785 §3.2.2.2 escapes: '"', '\\', \b \t \n \f \r by their short forms and every
# other control character below U+0020 as \u00xx in lowercase hex. It is checked
# against the translation table at import, and not used if it ever differs.
_quote = getattr(json.encoder, "c_encode_basestring", None) or _quote_translate
_PROBE = "".join(map(chr, range(0x80))) + "\u00e9\u2028\U0001f600"
if _quote(_PROBE) != _quote_translate(_PROBE):
    _quote = _quote_translate


def _integer(value: int) -> str:
    """Format an int, refusing any whose meaning would change as an IEEE-754 double.

    Every JSON number is a double to an RFC 8785 consumer, so an int is accepted
    only if its decimal digits are exactly the canonical text of the double it
    denotes. That admits every int with magnitude up to 2**53, and beyond that
    exactly those ints (like 9007199254740994 or 1152921504606847000) that a
    canonical float text in [2**53, 1e21) parses back to, so that canonical output
    re-parsed by ``json.loads`` canonicalizes to the same bytes again. Others, such
    as 2**53 + 1, would silently become a different number and are refused.
    """
    text = str(int(value))
    if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
        return text
    try:
        as_double = _number(float(value))
    except OverflowError:
        as_double = None
    if as_double == text:
        return text
    shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"
    raise _Rejected(
        f"integer {shown} does not keep its value as an IEEE-754 double"
        + (f" (it would read back as {as_double})" if as_double is not None else " (overflow)")
    )


def _number(value: float) -> str:
    """Format a finite double as ECMAScript ``Number.prototype.toString`` does."""
    if math.isnan(value) or math.isinf(value):
        raise _Rejected(f"{value!r} is not a finite number")
    if value == 0:
        return "0"  # covers -0.0
    sign = "-" if value < 0 else ""
    # repr() gives the shortest digit string that round-trips (and the closest
    # such string when there is a choice), which is what ECMAScript requires.
    mantissa, _, exp_text = repr(abs(float(value))).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    # value == 0.<digits> * 10**point
    point = len(int_part) + (int(exp_text) if exp_text else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    n = point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        exponent = n - 1
        exp_sign = "+" if exponent >= 0 else "-"
        head = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{head}e{exp_sign}{abs(exponent)}"
    return sign + text
