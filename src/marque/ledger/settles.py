"""Many observations in one statement per table: :meth:`Ledger.observe_all`'s batches.

The settler records applied writes behind their answer many at a time
(``pilot/settle_behind.py``), and one observation is four statements (the attempt's
compare-and-set, its observation, its events, its report): on PostgreSQL four round
trips each. For a batch of distinct nonces this writes the same rows with one
statement per table instead. Each attempt still changes only if the observation's
rank is above the recorded one and the attempt is not settled (the same
compare-and-set, row by row, in one ``UPDATE … FROM``); the rows, keys and
constraints are those of :func:`.observe.observe_txn`, which handles whatever
this does not (a nonce twice in one batch, a lone item, an item without events).
"""

from __future__ import annotations

import functools
import uuid

from marque.errors import LedgerMissing
from marque.ledger.base import AttemptRecord, Observed
from marque.ledger.observe import Reporter, append_events_txn, observe_txn, report_row
from marque.ledger.statements import (
    ATTEMPT_COLUMNS,
    ATTEMPT_COLUMNS_BARE,
    COMPACT,
    QUEUE_CONFLICT,
    QUEUE_ONE,
    QUEUE_REPORT,
    QUEUE_ROW,
    row_record,
    sorted_json,
)
from marque.outcome import SETTLED_RANK, Status
from marque.storage.tx import Tx

#: Batch sizes that get statements of their own, largest first; what is left goes one by
#: one. Fixed sizes keep the statement texts few (four each), each cached and prepared
#: once; every size up to eight, as a settler's batch is mostly a handful.
SIZES = (32, 16, 8, 7, 6, 5, 4, 3, 2)

_CAST_ROW = ("(CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS TEXT), "
             "CAST(? AS INTEGER), CAST(? AS BIGINT), CAST(? AS TEXT), CAST(? AS TEXT), "
             "CAST(? AS DOUBLE PRECISION))")


@functools.cache
def _statements(size: int) -> tuple[str, str, str, str]:
    """The compare-and-set, observations, events and report statements for ``size`` items."""
    rows = ", ".join([_CAST_ROW] * size)
    advance = (
        "WITH seen (k_marque, k_nonce, k_attempt, new_status, new_rank, new_rows, new_error, "
        f"new_result, new_settled) AS (VALUES {rows}) "
        "UPDATE attempts SET status = seen.new_status, status_rank = seen.new_rank, "
        "rows_affected = COALESCE(seen.new_rows, attempts.rows_affected), "
        "error = seen.new_error, result = COALESCE(seen.new_result, attempts.result), "
        "settled_at = seen.new_settled FROM seen "
        "WHERE attempts.marque_id = seen.k_marque AND attempts.nonce = seen.k_nonce "
        "AND attempts.attempt = seen.k_attempt AND attempts.status_rank < seen.new_rank "
        f"AND attempts.status_rank < {SETTLED_RANK} RETURNING {ATTEMPT_COLUMNS_BARE}"
    )
    observations = (
        "INSERT INTO observations (id, marque_id, nonce, attempt, status, cause, detail, "
        "observed_at) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * size))
    events = (
        "WITH batch (k_marque, k_nonce, body) AS (VALUES "
        + ", ".join(["(CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT))"] * size) + ") "
        "INSERT INTO events (marque_id, nonce, seq, body) SELECT k_marque, k_nonce, "
        "(SELECT COALESCE(MAX(e.seq), 0) + 1 FROM events e "
        "WHERE e.marque_id = batch.k_marque AND e.nonce = batch.k_nonce), body FROM batch")
    reports = QUEUE_REPORT + ", ".join([QUEUE_ROW] * size) + QUEUE_CONFLICT
    return advance, observations, events, reports


def observe_many_txn(tx: Tx, items: list[Observed], reporter: Reporter) -> list[AttemptRecord]:
    """:func:`.observe.observe_txn` for each item, in batches where it can; the records in
    the items' order."""
    if len({(item.marque_id, item.nonce) for item in items}) < len(items):
        # One nonce twice: its observations must merge in order, one after the other.
        return [observe_txn(tx, item, reporter) for item in items]
    records: list[AttemptRecord] = []
    start = 0
    while start < len(items):
        size = next((size for size in SIZES if size <= len(items) - start), 1)
        chunk = items[start:start + size]
        if size == 1:
            records.append(observe_txn(tx, chunk[0], reporter))
        else:
            records.extend(_observe_chunk(tx, chunk, reporter))
        start += size
    return records


def _observe_chunk(tx: Tx, chunk: list[Observed], reporter: Reporter) -> list[AttemptRecord]:
    advance, observations, events, reports = _statements(len(chunk))
    changed = {
        (row[0], row[1], row[2]): row
        for row in tx.execute(advance, [
            value for item in chunk for value in (
                item.marque_id, item.nonce, item.attempt, item.status.value,
                item.status.rank, item.rows_affected, sorted_json(item.error),
                sorted_json(item.result), item.now if item.status.settled else None)])
    }
    tx.execute(observations, [
        value for item in chunk for value in (
            uuid.uuid4().hex, item.marque_id, item.nonce, item.attempt, item.status.value,
            item.cause, sorted_json({"error": item.error, "rows_affected": item.rows_affected}),
            item.now)])
    if all(item.events for item in chunk):
        tx.execute(events, [
            value for item in chunk
            for value in (item.marque_id, item.nonce, COMPACT.encode(item.events))])
    else:
        for item in chunk:
            if item.events:
                append_events_txn(tx, item.marque_id, item.nonce, item.events)
    records: list[AttemptRecord] = []
    queued: list[tuple[object, ...]] = []
    for item in chunk:
        key = (item.marque_id, item.nonce, item.attempt)
        row = changed.get(key) or tx.one(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts a "
            "WHERE a.marque_id = ? AND a.nonce = ? AND a.attempt = ?", key)
        if row is None:
            raise LedgerMissing(
                f"no attempt {item.attempt} of nonce {item.nonce} in this ledger")
        record = row_record(row)
        records.append(record)
        if key in changed and record.status is not Status.IN_PROGRESS:
            queued.append(report_row(item, record, reporter))
    if len(queued) == len(chunk):
        tx.execute(reports, [value for row in queued for value in row])
    else:
        for row in queued:
            tx.execute(QUEUE_ONE, row)
    return records
