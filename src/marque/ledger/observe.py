"""One observation of an attempt, inside an open transaction: the rows it writes.

An observation is four statements: the attempt's compare-and-set on rank
(:func:`marque.outcome.advance`'s rule), the observation row, the events it
carries and, when it changed a settled attempt, the outcome report queued in the
outbox. :meth:`SqlLedger.observe <marque.ledger.sql.SqlLedger.observe>` runs one;
:mod:`.settles` writes many with one statement per table and falls back on these
for what it cannot batch. Both stand on this module, neither on the other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from marque.errors import LedgerMissing
from marque.ledger.base import AttemptRecord, Observed
from marque.ledger.statements import (
    ATTEMPT_COLUMNS,
    ATTEMPT_COLUMNS_BARE,
    COMPACT,
    QUEUE_ONE,
    row_record,
    sorted_json,
)
from marque.outcome import SETTLED_RANK, Status
from marque.storage.tx import Tx


@dataclass(frozen=True)
class Reporter:
    """Who reports an outcome: the ledger's Pilot and incarnation, as each report names them."""

    pilot_id: str
    incarnation: str


def observe_txn(tx: Tx, item: Observed, reporter: Reporter) -> AttemptRecord:
    """Record ``item`` inside ``tx``; the attempt as it stands after it."""
    key = (item.marque_id, item.nonce, item.attempt)
    status = item.status
    # Compare-and-set on rank (outcome.advance): a weaker or equal observation
    # changes nothing, and a settled attempt never changes again.
    changed = tx.one(
        "UPDATE attempts SET status = ?, status_rank = ?, "
        "rows_affected = COALESCE(?, rows_affected), error = ?, "
        "result = COALESCE(?, result), settled_at = ? "
        "WHERE marque_id = ? AND nonce = ? AND attempt = ? AND status_rank < ? "
        f"AND status_rank < {SETTLED_RANK} "
        f"RETURNING {ATTEMPT_COLUMNS_BARE}",
        (status.value, status.rank, item.rows_affected, sorted_json(item.error),
         sorted_json(item.result), item.now if status.settled else None, *key, status.rank),
    )
    tx.execute(
        "INSERT INTO observations (id, marque_id, nonce, attempt, status, cause, "
        "detail, observed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (uuid.uuid4().hex, *key, status.value, item.cause,
         sorted_json({"error": item.error, "rows_affected": item.rows_affected}), item.now),
    )
    if item.events:
        append_events_txn(tx, item.marque_id, item.nonce, item.events)
    row = changed or tx.one(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts a "
        "WHERE a.marque_id = ? AND a.nonce = ? AND a.attempt = ?",
        key,
    )
    if row is None:
        raise LedgerMissing(f"no attempt {item.attempt} of nonce {item.nonce} in this ledger")
    record = row_record(row)
    if changed is not None and record.status is not Status.IN_PROGRESS:
        tx.execute(QUEUE_ONE, report_row(item, record, reporter))
    return record


def append_events_txn(tx: Tx, marque_id: str, nonce: str, events: list[dict[str, Any]]) -> None:
    """Append a batch of a nonce's events inside ``tx``."""
    # One row per batch of events (a JSON array): one statement, however many events.
    tx.execute(
        "INSERT INTO events (marque_id, nonce, seq, body) SELECT ?, ?, "
        "COALESCE(MAX(seq), 0) + 1, ? FROM events WHERE marque_id = ? AND nonce = ?",
        (marque_id, nonce, COMPACT.encode(events), marque_id, nonce),
    )


def report_row(item: Observed, record: AttemptRecord, reporter: Reporter) -> tuple[Any, ...]:
    """The outbox row that reports ``record`` (just changed by ``item``)."""
    payload = {
        "marque_id": item.marque_id,
        "nonce": item.nonce,
        "attempt": item.attempt,
        "status": record.status.value,
        "rows_affected": record.rows_affected,
        "error": record.error,
        "pilot": {"id": reporter.pilot_id, "incarnation": reporter.incarnation},
        "cause": item.cause,
    }
    effect_set = (record.result or {}).get("effect_set")
    if isinstance(effect_set, dict):
        # An Effect Set attempt's summary and set receipt travel with its
        # report, so the Harbourmaster keeps the receipt with the request.
        payload["effect_set"] = effect_set
    return (item.marque_id, item.nonce, item.attempt, record.status.value,
            sorted_json(payload), item.now)
