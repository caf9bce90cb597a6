"""One open store transaction, and how JSON columns are written and read."""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from typing import Any

from marque.cid import canonicalize


class Tx(abc.ABC):
    """One open transaction; statements use ``?`` placeholders."""

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows (empty for none)."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row, or None."""
        rows = self.execute(sql, params)
        return rows[0] if rows else None


def dumps(value: Any) -> str | None:
    """Canonical JSON text (RFC 8785) of ``value``; None stays NULL.

    Canonical, so that a body read back re-hashes to exactly what was logged.
    """
    return None if value is None else canonicalize(value).decode("utf-8")


def loads(text: str | None) -> Any:
    """The value a JSON column holds."""
    return None if text is None else json.loads(text)
