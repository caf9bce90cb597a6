"""The ledger's Effect Set tables: previews by CID, the per-row dispatch ledger, receipts.

DESIGN §7 and seed 002. Three things a Pilot must remember across a crash:

* **previews**, content addressed by ``effect_preview_cid`` (``INSERT … ON
  CONFLICT DO NOTHING``: the first stored object of a CID stays, so the keys
  derived from its authoring context are the ones every later apply uses —
  "ledger lookup precedes refreshing any Preview");
* the **dispatch ledger**: one row per ``(marque_id, nonce, effect_apply_key,
  row_idempotency_key)`` — the primary key, so a row is reserved once per
  execution — holding its :class:`~marque.effects.dispatch.DispatchRecord`.
  Every move is a compare-and-set on the record's ``revision`` (and the state
  and fence it was read with), so an owner fenced out by a takeover can never
  settle a row again: its ``UPDATE … WHERE revision = ?`` matches nothing;
* the **Run** of each execution (seed 002's Run state machine, migration 5):
  its current :class:`~marque.effects.run.RunRecord` and the CIDs its resume
  revalidation compares. A move is a compare-and-set on the stored state and
  revision, never an in-process lock: two processes that both think they own a
  Run cannot both move it;
* **receipts** (row outcome, member, set, reconciliation), immutable, keyed by
  ``(marque_id, nonce, kind, subject)``: one member receipt per member, one
  set receipt, one reconciliation receipt per attempt of a row's chain. A
  different body for a taken key is refused (:class:`~marque.errors.Conflict`);
  the same body again is an idempotent redelivery.

SQL here, like in :mod:`.sql`, uses only what SQLite and PostgreSQL share.
"""

from __future__ import annotations

import abc
import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marque.errors import Conflict
from marque.ledger.statements import loads, sorted_json

if TYPE_CHECKING:
    from marque.effects.dispatch import DispatchRecord
    from marque.storage.tx import Tx

#: Migration 4 of the ledger (see :data:`marque.ledger.schema.MIGRATIONS`).
EFFECT_MIGRATION: list[str] = [
    """CREATE TABLE effect_previews (
        effect_preview_cid TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE effect_runs (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        effect_preview_cid TEXT NOT NULL,
        auth_evidence TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce))""",
    """CREATE TABLE effect_dispatch (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        effect_apply_key TEXT NOT NULL,
        row_idempotency_key TEXT NOT NULL,
        row_preview_cid TEXT NOT NULL,
        member_index INTEGER NOT NULL,
        row_index INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('prepared', 'dispatching', 'applied', 'accepted',
                                             'failed', 'unknown')),
        attempt INTEGER NOT NULL,
        fence TEXT,
        revision INTEGER NOT NULL,
        was_unknown INTEGER NOT NULL,
        outcome TEXT,
        outcome_receipt TEXT,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce, effect_apply_key, row_idempotency_key))""",
    """CREATE TABLE effect_receipts (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('member', 'set', 'reconciliation')),
        subject TEXT NOT NULL,
        receipt_cid TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce, kind, subject))""",
]

#: Migration 5 of the ledger: the Run of each Effect Set execution. A new table only.
EFFECT_RUN_MIGRATION: list[str] = [
    """CREATE TABLE effect_run_states (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        run_identity_cid TEXT NOT NULL,
        state TEXT NOT NULL,
        revision INTEGER NOT NULL,
        record TEXT NOT NULL,
        bound TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce))""",
]

#: Every Effect Set table that holds rows of one execution (reaped with its marque).
EXECUTION_TABLES = ("effect_receipts", "effect_dispatch", "effect_run_states", "effect_runs")

_ROW_COLUMNS = ("member_index, row_index, row_preview_cid, effect_apply_key, row_idempotency_key, "
                "state, attempt, fence, revision, was_unknown, outcome, outcome_receipt")


@dataclass(frozen=True)
class DispatchRow:
    """One row of an execution's dispatch ledger, as stored: its place in the preview,
    its record, and (once terminal) its typed outcome and outcome receipt."""

    member_index: int
    row_index: int
    record: DispatchRecord
    outcome: dict[str, Any] | None = None
    outcome_receipt: dict[str, Any] | None = None


def _row(r: tuple[Any, ...]) -> DispatchRow:
    # Imported here: every ledger imports this module, and a plain execution (a fresh
    # `marque exec` process among them) never reads a dispatch row.
    from marque.effects.dispatch import DispatchRecord, DispatchState

    record = DispatchRecord(row_preview_cid=r[2], effect_apply_key=r[3], row_idempotency_key=r[4],
                            state=DispatchState(r[5]), attempt=r[6], fence=r[7], revision=r[8],
                            was_unknown=bool(r[9]))
    return DispatchRow(r[0], r[1], record, loads(r[10]), loads(r[11]))


class EffectLedger(abc.ABC):
    """Effect Set storage for :class:`~marque.ledger.sql.SqlLedger` (a mixin)."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction."""

    @abc.abstractmethod
    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that only reads."""

    # -- previews -------------------------------------------------------------------

    def store_effect_preview(self, effect_preview_cid: str, target: str,
                             body: dict[str, Any], now: float) -> dict[str, Any]:
        """Keep a preview under its CID; returns the stored one (the first of that CID)."""
        with self.transaction() as tx:
            tx.execute("INSERT INTO effect_previews (effect_preview_cid, target, body, "
                       "created_at) VALUES (?, ?, ?, ?) ON CONFLICT (effect_preview_cid) "
                       "DO NOTHING", (effect_preview_cid, target, sorted_json(body), now))
            row = tx.one("SELECT body FROM effect_previews WHERE effect_preview_cid = ?",
                         (effect_preview_cid,))
        assert row is not None
        return dict(json.loads(row[0]))

    def effect_preview(self, effect_preview_cid: str) -> dict[str, Any] | None:
        """The stored preview of that CID, or None."""
        with self.reading() as tx:
            row = tx.one("SELECT body FROM effect_previews WHERE effect_preview_cid = ?",
                         (effect_preview_cid,))
        return None if row is None else dict(json.loads(row[0]))

    # -- the dispatch ledger ------------------------------------------------------------

    def effect_begin(self, marque_id: str, nonce: str, effect_preview_cid: str,
                     authorization: dict[str, Any],
                     rows: list[tuple[int, int, DispatchRecord]], now: float) -> bool:
        """Reserve every row of an execution as ``prepared``, with the run's binding, in one
        transaction; False (and nothing changed) if this execution was reserved before."""
        with self.transaction() as tx:
            fresh = tx.one(
                "INSERT INTO effect_runs (marque_id, nonce, effect_preview_cid, auth_evidence, "
                "created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (marque_id, nonce) DO NOTHING "
                "RETURNING nonce",
                (marque_id, nonce, effect_preview_cid, sorted_json(authorization), now))
            if fresh is None:
                return False
            for member_index, row_index, record in rows:
                tx.execute(
                    "INSERT INTO effect_dispatch (marque_id, nonce, effect_apply_key, "
                    "row_idempotency_key, row_preview_cid, member_index, row_index, state, "
                    "attempt, fence, revision, was_unknown, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (marque_id, nonce, record.effect_apply_key, record.row_idempotency_key,
                     record.row_preview_cid, member_index, row_index, record.state.value,
                     record.attempt, record.fence, record.revision, int(record.was_unknown),
                     now))
            return True

    def effect_run(self, marque_id: str, nonce: str) -> dict[str, Any] | None:
        """``{effect_preview_cid, authorization}`` of an Effect Set execution, or None for a
        nonce that never reserved rows (a statement execution, or one refused at admission)."""
        with self.reading() as tx:
            row = tx.one("SELECT effect_preview_cid, auth_evidence FROM effect_runs "
                         "WHERE marque_id = ? AND nonce = ?", (marque_id, nonce))
        if row is None:
            return None
        return {"effect_preview_cid": row[0], "authorization": json.loads(row[1])}

    def effect_rows(self, marque_id: str, nonce: str) -> list[DispatchRow]:
        """Every dispatch row of an execution, in dispatch order (members, then rows)."""
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {_ROW_COLUMNS} FROM effect_dispatch WHERE marque_id = ? AND nonce = ? "
                "ORDER BY member_index, row_index", (marque_id, nonce))
        return [_row(r) for r in rows]

    def effect_move(self, marque_id: str, nonce: str, before: DispatchRecord,
                    after: DispatchRecord, *, now: float,
                    outcome: dict[str, Any] | None = None,
                    outcome_receipt: dict[str, Any] | None = None) -> bool:
        """Compare-and-set one row from ``before`` to ``after`` (made by
        :func:`marque.effects.dispatch.advance`); False if the row is no longer ``before``
        (another owner moved it: this one is fenced out and must not act on the row)."""
        with self.transaction() as tx:
            moved = tx.one(
                "UPDATE effect_dispatch SET state = ?, attempt = ?, fence = ?, revision = ?, "
                "was_unknown = ?, outcome = COALESCE(?, outcome), "
                "outcome_receipt = COALESCE(?, outcome_receipt), updated_at = ? "
                "WHERE marque_id = ? AND nonce = ? AND effect_apply_key = ? "
                "AND row_idempotency_key = ? AND state = ? AND revision = ? "
                "AND COALESCE(fence, '') = ? RETURNING revision",
                (after.state.value, after.attempt, after.fence, after.revision,
                 int(after.was_unknown), sorted_json(outcome), sorted_json(outcome_receipt), now,
                 marque_id, nonce, before.effect_apply_key, before.row_idempotency_key,
                 before.state.value, before.revision, before.fence or ""))
        return moved is not None

    # -- the Run ------------------------------------------------------------------------

    def effect_run_start(self, marque_id: str, nonce: str, record: dict[str, Any],
                         bound: dict[str, str], now: float) -> dict[str, Any]:
        """Keep an execution's first Run record and the CIDs it binds, unless it has one;
        returns the stored ``{record, bound}`` (the first stays: a second process starting
        the same Run gets the one already there)."""
        with self.transaction() as tx:
            tx.execute(
                "INSERT INTO effect_run_states (marque_id, nonce, run_identity_cid, state, "
                "revision, record, bound, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (marque_id, nonce) DO NOTHING",
                (marque_id, nonce, record["run_identity_cid"], record["state"],
                 record["revision"], sorted_json(record), sorted_json(bound), now))
            row = tx.one("SELECT record, bound FROM effect_run_states WHERE marque_id = ? "
                         "AND nonce = ?", (marque_id, nonce))
        assert row is not None
        return {"record": json.loads(row[0]), "bound": json.loads(row[1])}

    def effect_run_state(self, marque_id: str, nonce: str) -> dict[str, Any] | None:
        """``{record, bound}`` of an execution's Run, or None if it has none."""
        with self.reading() as tx:
            row = tx.one("SELECT record, bound FROM effect_run_states WHERE marque_id = ? "
                         "AND nonce = ?", (marque_id, nonce))
        return None if row is None else {"record": json.loads(row[0]),
                                         "bound": json.loads(row[1])}

    def effect_run_advance(self, marque_id: str, nonce: str, before: dict[str, Any],
                           after: dict[str, Any], now: float) -> bool:
        """Compare-and-set the Run from ``before`` (its state and revision as read) to
        ``after``; False if another process moved it meanwhile (this one must re-read)."""
        with self.transaction() as tx:
            moved = tx.one(
                "UPDATE effect_run_states SET state = ?, revision = ?, record = ?, "
                "updated_at = ? WHERE marque_id = ? AND nonce = ? AND state = ? "
                "AND revision = ? RETURNING revision",
                (after["state"], after["revision"], sorted_json(after), now, marque_id, nonce,
                 before["state"], before["revision"]))
        return moved is not None

    def effect_attach_summary(self, marque_id: str, nonce: str, attempt: int,
                              result: dict[str, Any], now: float) -> bool:
        """Keep the sealed summary of an attempt that stays ``indeterminate`` (recovered, its
        rows still unknown) as its result, once, and send its report again with it (the
        outbox payload gains ``effect_set``, as an execution's own indeterminate report has).
        False if the attempt is not indeterminate or already holds a result."""
        with self.transaction() as tx:
            kept = tx.one(
                "UPDATE attempts SET result = ? WHERE marque_id = ? AND nonce = ? "
                "AND attempt = ? AND status = 'indeterminate' AND result IS NULL "
                "RETURNING attempt", (sorted_json(result), marque_id, nonce, attempt))
            if kept is None:
                return False
            queued = tx.one("SELECT payload FROM outbox WHERE marque_id = ? AND nonce = ? "
                            "AND attempt = ? AND status = 'indeterminate'",
                            (marque_id, nonce, attempt))
            if queued is not None:
                payload = json.loads(queued[0])
                payload["effect_set"] = result["effect_set"]
                tx.execute("UPDATE outbox SET payload = ?, queued_at = ?, acked_at = NULL "
                           "WHERE marque_id = ? AND nonce = ? AND attempt = ?",
                           (sorted_json(payload), now, marque_id, nonce, attempt))
        return True

    # -- receipts -----------------------------------------------------------------------

    def effect_put_receipt(self, marque_id: str, nonce: str, kind: str, subject: str,
                           body: dict[str, Any], now: float) -> bool:
        """Keep a receipt; True if it is new, False for an exact redelivery. A different
        receipt under a taken ``(kind, subject)`` is :class:`Conflict` (receipts are immutable)."""
        text = sorted_json(body)
        with self.transaction() as tx:
            added = tx.one(
                "INSERT INTO effect_receipts (marque_id, nonce, kind, subject, receipt_cid, "
                "body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (marque_id, nonce, kind, subject) DO NOTHING RETURNING kind",
                (marque_id, nonce, kind, subject, body.get("receipt_cid")
                 or body.get("reconciliation_receipt_cid"), text, now))
            if added is not None:
                return True
            held = tx.one("SELECT body FROM effect_receipts WHERE marque_id = ? AND nonce = ? "
                          "AND kind = ? AND subject = ?", (marque_id, nonce, kind, subject))
        if held is not None and held[0] == text:
            return False
        raise Conflict(f"a different {kind} receipt is already recorded for {subject} of "
                       f"marque {marque_id} nonce {nonce}; receipts never change",
                       detail={"kind": kind, "subject": subject})

    def effect_receipts(self, marque_id: str, nonce: str) -> list[dict[str, Any]]:
        """Every receipt of an execution: ``{kind, subject, body}``, oldest first."""
        with self.reading() as tx:
            rows = tx.execute(
                "SELECT kind, subject, body FROM effect_receipts WHERE marque_id = ? "
                "AND nonce = ? ORDER BY created_at, kind, subject", (marque_id, nonce))
        return [{"kind": r[0], "subject": r[1], "body": json.loads(r[2])} for r in rows]
