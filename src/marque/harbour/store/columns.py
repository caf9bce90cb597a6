"""How the store's JSON columns are written and read (canonical JSON, RFC 8785)."""

from __future__ import annotations

import json
from typing import Any

from marque.cid import canonicalize


def canonical_json(value: Any) -> str | None:
    """Canonical JSON text (RFC 8785) of ``value``; None stays NULL.

    Canonical, so that a body read back re-hashes to exactly what was logged. Slower
    than the ledger's :func:`marque.ledger.statements.sorted_json`, and stricter (no
    NaN, no integer a double cannot hold): the store's bodies are hashed, the ledger's
    are not.
    """
    return None if value is None else canonicalize(value).decode("utf-8")


def loads(text: str | None) -> Any:
    """The value a JSON column holds."""
    return None if text is None else json.loads(text)
