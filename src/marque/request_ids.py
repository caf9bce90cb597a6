"""Caller request ids (DESIGN §11.1): their syntax, and how one travels in the body's
``request_id`` or the ``Idempotency-Key`` header (an RFC 8941 String).

Below both wings: the Harbourmaster checks the ids it is sent, and its client (and
the CLI, and the agents) check and format the ids they send, by the same rules.
"""

from __future__ import annotations

import unicodedata
import uuid

from marque.errors import RequestIdInvalid

__all__ = [
    "REQUEST_ID_MAX_BYTES",
    "check_request_id",
    "format_idempotency_key",
    "new_request_id",
    "parse_idempotency_key",
    "resolve_request_id",
]

#: The longest caller request id, in UTF-8 bytes.
REQUEST_ID_MAX_BYTES = 256


def check_request_id(value: object) -> str:
    """Return ``value`` if it is a valid caller request id, else raise :class:`RequestIdInvalid`.

    The rules (DESIGN §11.1): a non-empty string, already in Unicode NFC (it is
    refused, never normalised), with no C0 control (U+0000–U+001F, so no LF or
    TAB either), no DEL (U+007F), no C1 control (U+0080–U+009F), and at most
    256 bytes as UTF-8. The message names the rule that was broken.
    """
    if not isinstance(value, str):
        raise RequestIdInvalid(
            f"request id must be a string, got {type(value).__name__}", detail={"rule": "type"}
        )
    if value == "":
        raise RequestIdInvalid("request id must not be empty", detail={"rule": "empty"})
    for index, char in enumerate(value):
        point = ord(char)
        if point <= 0x1F:
            rule, name = "c0", "a C0 control character"
        elif point == 0x7F:
            rule, name = "del", "DEL"
        elif 0x80 <= point <= 0x9F:
            rule, name = "c1", "a C1 control character"
        elif 0xD800 <= point <= 0xDFFF:
            rule, name = "surrogate", "a lone surrogate (not encodable as UTF-8)"
        else:
            continue
        raise RequestIdInvalid(
            f"request id must not contain {name}: U+{point:04X} at index {index}",
            detail={"rule": rule, "index": index},
        )
    if not unicodedata.is_normalized("NFC", value):
        raise RequestIdInvalid(
            "request id must be in Unicode normalization form C (NFC); it is not normalised "
            "for you", detail={"rule": "nfc"},
        )
    size = len(value.encode("utf-8"))
    if size > REQUEST_ID_MAX_BYTES:
        raise RequestIdInvalid(
            f"request id must be at most {REQUEST_ID_MAX_BYTES} UTF-8 bytes, got {size}",
            detail={"rule": "length", "bytes": size},
        )
    return value


def parse_idempotency_key(header: str) -> str:
    """The caller request id carried by an ``Idempotency-Key`` header (an RFC 8941 String).

    The field value must be one sf-string — ``"…"`` of printable ASCII with
    ``\\"`` and ``\\\\`` as the only escapes — optionally surrounded by spaces.
    Parameters (``;name=…``) are refused rather than ignored: none is defined,
    and silently dropping part of a key would make two different keys equal.
    The unescaped string must then pass :func:`check_request_id`.
    """
    if not isinstance(header, str):
        raise RequestIdInvalid("Idempotency-Key must be a string", detail={"rule": "header"})
    text = header.strip(" \t")
    if not text.startswith('"'):
        raise RequestIdInvalid(
            "Idempotency-Key must be an RFC 8941 String (a double-quoted ASCII string)",
            detail={"rule": "header"},
        )
    out: list[str] = []
    index = 1
    while True:
        if index >= len(text):
            raise RequestIdInvalid(
                "Idempotency-Key: unterminated string", detail={"rule": "header"}
            )
        char = text[index]
        if char == "\\":
            following = text[index + 1 : index + 2]
            if following not in ('"', "\\"):
                raise RequestIdInvalid(
                    "Idempotency-Key: only \\\" and \\\\ may be escaped in an RFC 8941 String",
                    detail={"rule": "header"},
                )
            out.append(following)
            index += 2
            continue
        if char == '"':
            index += 1
            break
        if not 0x20 <= ord(char) <= 0x7E:
            raise RequestIdInvalid(
                f"Idempotency-Key: U+{ord(char):04X} is not allowed in an RFC 8941 String "
                "(printable ASCII only; send a non-ASCII id as request_id in the body)",
                detail={"rule": "header"},
            )
        out.append(char)
        index += 1
    if index != len(text):
        raise RequestIdInvalid(
            "Idempotency-Key must hold exactly one String, without parameters",
            detail={"rule": "header"},
        )
    return check_request_id("".join(out))


def format_idempotency_key(request_id: str) -> str:
    """The ``Idempotency-Key`` field value (an RFC 8941 String) carrying ``request_id``.

    Only ids of printable ASCII can travel in the header; others raise
    :class:`RequestIdInvalid` and must be sent as ``request_id`` in the body.
    """
    check_request_id(request_id)
    if any(not 0x20 <= ord(char) <= 0x7E for char in request_id):
        raise RequestIdInvalid(
            "only a printable-ASCII request id can travel in Idempotency-Key; "
            "send it as request_id in the body", detail={"rule": "header"},
        )
    return '"' + request_id.replace("\\", "\\\\").replace('"', '\\"') + '"'


def resolve_request_id(body_id: object | None, header: str | None) -> str | None:
    """The caller request id of a request, from its body and/or its ``Idempotency-Key``.

    Each given source is checked; when both are given they must be equal
    (exactly, code point for code point), else :class:`RequestIdInvalid`.
    ``None`` when neither is given — the caller sent no id.
    """
    from_body = None if body_id is None else check_request_id(body_id)
    from_header = None if header is None else parse_idempotency_key(header)
    if from_body is not None and from_header is not None and from_body != from_header:
        raise RequestIdInvalid(
            "request_id in the body and the Idempotency-Key header differ; "
            "when both are given they must be equal", detail={"rule": "body_header_mismatch"},
        )
    return from_body if from_body is not None else from_header


def new_request_id() -> str:
    """A fresh caller request id, for a caller (the CLI) that was given none."""
    return str(uuid.uuid4())
