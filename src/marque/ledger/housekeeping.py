"""Housekeeping of the execution ledger: reaping, what reaping keeps, and stats.

DESIGN §5: settled entries are reaped once their marque has expired and their
report is acknowledged; ledger size is a metric. "Expired" means past the
marque's ``exp`` *plus the Pilot's clock-skew allowance* — until then the
Pilot could still accept it — and reap and stats use that one rule, so what
stats calls reapable is exactly what reap deletes.

Reaping keeps a little: one row per reaped marque (target, expiry, when it was
reaped) and one per reaped nonce (its final attempt, status and rows), so a
later ``outcome`` says "reaped" instead of "never claimed", and a reaped
marque's budget is never born again. SQL here, like in :mod:`.sql`, uses only
what SQLite and PostgreSQL share.

An Effect Set execution's rows (its Run, dispatch ledger and receipts, see
:mod:`.effects`) go with their marque. Its preview, kept by CID rather than by
marque, goes with the last execution that named it: a preview that an
execution of a marque still held here names is kept (docs/effects.md, choice
44), and so is one no execution has named yet — the ledger cannot know which
unclaimed marques name it.
"""

from __future__ import annotations

import abc
import contextlib
from typing import TYPE_CHECKING, Any

from marque.errors import MarqueExpired
from marque.ledger.base import ReapedRecord
from marque.ledger.effects import EXECUTION_TABLES
from marque.outcome import SETTLED_RANK, Status
from marque.timefmt import iso_time

if TYPE_CHECKING:
    from collections.abc import Sequence

    from marque.storage.tx import Tx


#: Marques (or proof jtis) reaped per transaction.
REAP_BATCH = 500


class Housekeeping(abc.ABC):
    """Reap, reaped and stats for :class:`~marque.ledger.sql.SqlLedger` (a mixin)."""

    pilot_id: str
    incarnation: str
    schema_version: int

    # -- hooks the ledger provides ----------------------------------------------

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction."""

    @abc.abstractmethod
    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that only reads."""

    @abc.abstractmethod
    def _size_bytes(self) -> int:
        """The store's size on disk."""

    @abc.abstractmethod
    def _json_array_length(self, column: str) -> str:
        """SQL for the length of a JSON array held in a TEXT column."""

    def _compact(self) -> None:  # noqa: B027 - a hook with a do-nothing default
        """Give the space of reaped entries back (engines that need telling)."""

    # -- reaping ------------------------------------------------------------------

    # Reapable: past its window (expiry plus the skew allowance, as a cutoff), every
    # attempt settled, every report acknowledged.
    _REAPABLE = (
        "SELECT b.marque_id FROM budgets b WHERE b.expires_at < ? "
        "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.marque_id = b.marque_id "
        f"AND a.status_rank < {SETTLED_RANK}) "
        "AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.marque_id = b.marque_id "
        "AND o.acked_at IS NULL)"
    )

    def reap(self, now: float, *, skew_seconds: float = 0.0) -> dict[str, int]:
        # Many small transactions, not one big one: executions keep flowing while
        # a large ledger is reaped, and no transaction grows without bound.
        tables = (*EXECUTION_TABLES, "events", "observations", "outbox", "attempts", "claims",
                  "pinned_attempts", "budgets")
        counts = dict.fromkeys((*tables, "effect_previews", "pop_jtis", "marques"), 0)
        cutoff = now - skew_seconds
        while True:
            with self.transaction() as tx:
                ids = [r[0] for r in tx.execute(self._REAPABLE + " LIMIT ?",
                                                (cutoff, REAP_BATCH))]
                if ids:
                    self._keep_reaped_txn(tx, ids, now)
                marks = ", ".join("?" * len(ids))
                previews = [r[0] for r in tx.execute(
                    "SELECT DISTINCT effect_preview_cid FROM effect_runs "
                    f"WHERE marque_id IN ({marks})", ids)] if ids else []
                for table in tables if ids else ():
                    counts[table] += len(tx.execute(
                        f"DELETE FROM {table} WHERE marque_id IN ({marks}) RETURNING 1", ids
                    ))
                if previews:
                    counts["effect_previews"] += self._reap_previews_txn(tx, previews)
            counts["marques"] += len(ids)
            if len(ids) < REAP_BATCH:
                break
        while True:
            with self.transaction() as tx:
                gone = len(tx.execute(
                    "DELETE FROM pop_jtis WHERE jti IN (SELECT jti FROM pop_jtis "
                    "WHERE forget_after < ? LIMIT ?) RETURNING 1",
                    (now, REAP_BATCH),
                ))
            counts["pop_jtis"] += gone
            if gone < REAP_BATCH:
                break
        if counts["marques"] or counts["pop_jtis"]:
            self._compact()
        return counts

    @staticmethod
    def _reap_previews_txn(tx: Tx, previews: list[str]) -> int:
        """Delete the previews the reaped executions named that no execution left in the
        ledger names (same transaction, after those executions' rows went)."""
        marks = ", ".join("?" * len(previews))
        return len(tx.execute(
            f"DELETE FROM effect_previews WHERE effect_preview_cid IN ({marks}) "
            "AND NOT EXISTS (SELECT 1 FROM effect_runs r "
            "WHERE r.effect_preview_cid = effect_previews.effect_preview_cid) RETURNING 1",
            previews))

    def _keep_reaped_txn(self, tx: Tx, ids: list[str], now: float) -> None:
        """Keep the small record of marques about to be reaped (same transaction)."""
        marks = ", ".join("?" * len(ids))
        # The WHERE clauses also keep SQLite's parser from reading ON CONFLICT as a join.
        tx.execute(
            "INSERT INTO reaped_marques (marque_id, target, expires_at, reaped_at) "
            f"SELECT marque_id, target, expires_at, ? FROM budgets WHERE marque_id IN ({marks}) "
            "ON CONFLICT (marque_id) DO NOTHING",
            (now, *ids),
        )
        tx.execute(
            "INSERT INTO reaped_nonces (marque_id, nonce, attempt, status, rows_affected) "
            "SELECT a.marque_id, a.nonce, a.attempt, a.status, a.rows_affected "
            "FROM claims c JOIN attempts a ON a.marque_id = c.marque_id "
            "AND a.nonce = c.nonce AND a.attempt = c.attempt "
            f"WHERE c.marque_id IN ({marks}) ON CONFLICT (marque_id, nonce) DO NOTHING",
            ids,
        )

    def reaped(self, marque_id: str, nonce: str) -> ReapedRecord | None:
        with self.reading() as tx:
            row = tx.one(
                "SELECT n.attempt, n.status, n.rows_affected, m.target, m.expires_at, "
                "m.reaped_at FROM reaped_nonces n JOIN reaped_marques m "
                "ON m.marque_id = n.marque_id WHERE n.marque_id = ? AND n.nonce = ?",
                (marque_id, nonce),
            )
        if row is None:
            return None
        return ReapedRecord(
            marque_id=marque_id, nonce=nonce, attempt=row[0], status=Status(row[1]),
            rows_affected=row[2], target=row[3], expires_at=row[4], reaped_at=row[5],
        )

    def stats(self, now: float, *, skew_seconds: float = 0.0) -> dict[str, Any]:
        cutoff = now - skew_seconds  # the same window reap() uses
        with self.reading() as tx:

            def count(sql: str, params: Sequence[Any] = ()) -> int:
                row = tx.one(sql, params)
                return int(row[0]) if row else 0

            by_status = dict(
                tx.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status")
            )
            next_end = tx.one("SELECT MIN(expires_at) FROM budgets WHERE expires_at >= ?",
                              (cutoff,))
            stats: dict[str, Any] = {
                "pilot_id": self.pilot_id,
                "incarnation": self.incarnation,
                "schema_version": self.schema_version,
                "skew_seconds": skew_seconds,
                "marques": count("SELECT COUNT(*) FROM budgets"),
                "live_marques": count("SELECT COUNT(*) FROM budgets WHERE expires_at >= ?",
                                      (cutoff,)),
                "claims": count("SELECT COUNT(*) FROM claims"),
                "attempts": count("SELECT COUNT(*) FROM attempts"),
                "attempts_by_status": {s.value: int(by_status.get(s.value, 0)) for s in Status},
                "events": count(
                    f"SELECT COALESCE(SUM({self._json_array_length('body')}), 0) FROM events"
                ),
                "unreported_outcomes": count("SELECT COUNT(*) FROM outbox WHERE acked_at IS NULL"),
                "pop_jtis": count("SELECT COUNT(*) FROM pop_jtis"),
                "reapable_marques": len(tx.execute(self._REAPABLE, (cutoff,))),
                # When the next live marque's window closes: from then on it is
                # reapable, once its outcomes are settled and reported.
                "next_reapable_at": (None if next_end is None or next_end[0] is None
                                     else float(next_end[0]) + skew_seconds),
                "reaped_marques": count("SELECT COUNT(*) FROM reaped_marques"),
                "reaped_nonces": count("SELECT COUNT(*) FROM reaped_nonces"),
            }
        # Past their window, yet held back by an unsettled or unreported outcome. (On
        # PostgreSQL each count is its own snapshot, so never below zero.)
        stats["expired_waiting_marques"] = max(
            0, stats["marques"] - stats["live_marques"] - stats["reapable_marques"])
        stats["size_bytes"] = self._size_bytes()
        return stats

    @staticmethod
    def _refuse_reaped_txn(tx: Tx, marque_id: str) -> None:
        """Refuse a marque this ledger already reaped: its budget is gone, not renewed.

        Reaping waits for expiry plus the skew allowance, so this is reached only
        if the allowance was raised or the clock went back since.
        """
        row = tx.one("SELECT expires_at, reaped_at FROM reaped_marques WHERE marque_id = ?",
                     (marque_id,))
        if row is not None:
            raise MarqueExpired(
                f"marque {marque_id} expired at {iso_time(row[0])} and its entries were "
                f"reaped from this ledger at {iso_time(row[1])}; a reaped marque never runs "
                "again: ask for a new marque",
                detail={"expires_at": row[0], "reaped_at": row[1]},
            )
