"""Statement pieces and row codecs the ledger's SQL modules share.

:mod:`.sql` (one observation at a time, claims, reads), :mod:`.settles` (many
observations in one statement per table) and :mod:`.postgres` (the one-statement
claim) write and read the same rows; their column lists, the outbox's queueing
statement and the JSON and record codecs live here, below all three, so that none
imports another's private names.
"""

from __future__ import annotations

import json
from typing import Any

from marque.ledger.base import AttemptRecord
from marque.outcome import Status

#: Queueing an outcome report (one row, or many rows joined by ", ").
QUEUE_REPORT = ("INSERT INTO outbox (marque_id, nonce, attempt, status, payload, queued_at) "
                "VALUES ")
QUEUE_ROW = "(?, ?, ?, ?, ?, ?)"
QUEUE_CONFLICT = (" ON CONFLICT (marque_id, nonce, attempt) DO UPDATE "
                  "SET status = excluded.status, payload = excluded.payload, "
                  "queued_at = excluded.queued_at, acked_at = NULL")
QUEUE_ONE = QUEUE_REPORT + QUEUE_ROW + QUEUE_CONFLICT

#: An attempt's columns as :func:`row_record` reads them, on the alias ``a``.
ATTEMPT_COLUMNS = (
    "a.marque_id, a.nonce, a.attempt, a.status, a.rows_affected, a.error, a.result, "
    "a.owner_incarnation, a.owner_process, a.lease_expires_at, a.started_at, a.settled_at"
)
#: The same columns without the alias (``RETURNING``).
ATTEMPT_COLUMNS_BARE = ATTEMPT_COLUMNS.replace("a.", "")
#: The columns a new attempt is inserted with (the rest start NULL).
STARTED_COLUMNS = ("marque_id, nonce, attempt, status, status_rank, owner_incarnation, "
                   "owner_process, lease_expires_at, started_at")

# Built once: json.dumps with non-default options builds an encoder per call.
SORTED = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
COMPACT = json.JSONEncoder(separators=(",", ":"))


def sorted_json(value: Any) -> str | None:
    """``value`` as sorted, compact JSON text; None stays None (SQL NULL).

    Not RFC 8785 (:func:`marque.harbour.store.columns.canonical_json` is): Python's own
    C encoder, built once, because every claim and outcome writes these columns and the
    ledger only reads the values back, never re-hashing their text. Sorted keys still
    make equal values equal text (a redelivered receipt is compared as text).
    """
    return None if value is None else SORTED.encode(value)


def loads(text: str | None) -> Any:
    """JSON text read back; NULL is None."""
    return None if text is None else json.loads(text)


def row_record(row: tuple[Any, ...]) -> AttemptRecord:
    """The attempt in a row of :data:`ATTEMPT_COLUMNS`."""
    return AttemptRecord(
        marque_id=row[0],
        nonce=row[1],
        attempt=row[2],
        status=Status(row[3]),
        rows_affected=row[4],
        error=loads(row[5]),
        result=loads(row[6]),
        owner_incarnation=row[7],
        owner_process=row[8],
        lease_expires_at=row[9],
        started_at=row[10],
        settled_at=row[11],
    )
