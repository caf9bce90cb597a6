"""One open transaction: the interface the ledger's and the store's SQL run on."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any


class Tx(abc.ABC):
    """One open transaction; statements use ``?`` placeholders (engines translate)."""

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows (empty for none)."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row, or None."""
        rows = self.execute(sql, params)
        return rows[0] if rows else None
