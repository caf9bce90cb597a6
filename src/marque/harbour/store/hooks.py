"""What every record mixin of the SQL store stands on: its transactions, its clock and
its logbook append, all provided by ``sql.SqlHarbourStore``.

The record modules (requests, sessions, webhooks, OIDC) each hold one kind of record's
operations; declaring the hooks once here keeps them from drifting apart.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any

from marque.harbour.store.base import HarbourStore, LogbookEntry
from marque.storage.tx import Tx


class StoreHooks(HarbourStore):
    """The hooks ``sql.SqlHarbourStore`` provides to the record mixins."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction."""

    @abc.abstractmethod
    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A read-only transaction."""

    @abc.abstractmethod
    def _now(self, now: float | None) -> float:
        """``now``, or the store's clock."""

    @abc.abstractmethod
    def _append_tx(self, tx: Tx, kind: str, actor: str, subject: str, body: dict[str, Any],
                   now: float) -> LogbookEntry:
        """Append a logbook entry inside ``tx``."""
