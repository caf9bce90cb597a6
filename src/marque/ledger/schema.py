"""The ledger's schema: its forward-only migrations, and how the ledger moves by them.

``MIGRATIONS[i]`` holds the statements that take a ledger from schema version ``i`` to
``i + 1``; the version a ledger holds is the ``schema_version`` row of its ``meta``
table. Version 1 is created whole when a ledger is made (``SqlLedger._initialise``);
the later ones run through :func:`marque.storage.migrations.migrate`. A released
migration is never edited: a change is a new one appended.
"""

from __future__ import annotations

from collections.abc import Callable

from marque.ledger.bindings import BINDING_MIGRATION
from marque.ledger.effects import EFFECT_MIGRATION, EFFECT_RUN_MIGRATION
from marque.storage.migrations import MetaTableSchema
from marque.storage.tx import Tx

# Forward-only migrations: index i holds the statements that take the schema
# from version i to i + 1. Types are spelled so both engines accept them.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL)""",
        """CREATE TABLE budgets (
            marque_id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            executions_left INTEGER NOT NULL CHECK (executions_left >= 0),
            max_rows BIGINT NOT NULL,
            attempts_per_nonce INTEGER NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX budgets_expiry ON budgets (expires_at)",
        """CREATE TABLE claims (
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            claimed_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (marque_id, nonce))""",
        """CREATE TABLE attempts (
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            status_rank INTEGER NOT NULL,
            rows_affected BIGINT,
            error TEXT,
            result TEXT,
            owner_incarnation TEXT NOT NULL,
            owner_run TEXT NOT NULL,
            lease_expires_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            settled_at DOUBLE PRECISION,
            PRIMARY KEY (marque_id, nonce, attempt))""",
        "CREATE INDEX attempts_unsettled ON attempts (status_rank) WHERE status_rank < 3",
        # Observations come from the executing run and from reconcilers at
        # once, so their key is a random id, not a per-nonce counter.
        """CREATE TABLE observations (
            id TEXT PRIMARY KEY,
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            source TEXT NOT NULL,
            detail TEXT,
            observed_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX observations_nonce ON observations (marque_id, nonce, observed_at)",
        """CREATE TABLE events (
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            seq INTEGER NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (marque_id, nonce, seq))""",
        """CREATE TABLE outbox (
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            payload TEXT NOT NULL,
            tries INTEGER NOT NULL DEFAULT 0,
            queued_at DOUBLE PRECISION NOT NULL,
            acked_at DOUBLE PRECISION,
            PRIMARY KEY (marque_id, nonce, attempt))""",
        "CREATE INDEX outbox_unacked ON outbox (queued_at) WHERE acked_at IS NULL",
        """CREATE TABLE pop_jtis (
            jti TEXT PRIMARY KEY,
            forget_after DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX pop_jtis_forget ON pop_jtis (forget_after)",
    ],
    # 2: what reaping keeps. One row per reaped marque and one per reaped nonce
    # (its final attempt and status): a few dozen bytes where the entries held
    # kilobytes, so `outcome` can say "reaped", not "never claimed".
    [
        """CREATE TABLE reaped_marques (
            marque_id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            reaped_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE reaped_nonces (
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            rows_affected BIGINT,
            PRIMARY KEY (marque_id, nonce))""",
    ],
    # 3: one name per concept (issue 8). The process that owns a claim is a
    # "process", not a "run" (DESIGN §7's Run is a different thing), and what made an
    # observation is its "cause". Renames only: no row's content changes.
    [
        "ALTER TABLE attempts RENAME COLUMN owner_run TO owner_process",
        "ALTER TABLE observations RENAME COLUMN source TO cause",
    ],
    # 4: Effect Sets (DESIGN §7): previews by CID, the per-row dispatch ledger and its
    # receipts (ledger/effects.py). New tables only.
    EFFECT_MIGRATION,
    # 5: the Run of each Effect Set execution (ledger/effects.py). A new table only.
    EFFECT_RUN_MIGRATION,
    # 6: which database each target name stands for, and the attempts a rebinding left
    # bound to the one before (ledger/bindings.py). New tables only.
    BINDING_MIGRATION,
    # 7: an engine's own storage of the same rows (SqlLedger._migration). On SQLite four
    # text-keyed tables become WITHOUT ROWID (ledger/sqlite_schema.py); on PostgreSQL
    # nothing changes.
    [],
]


class LedgerSchema(MetaTableSchema):
    """The ledger's versions in its ``meta`` table; ``statements(index)`` gives migration
    ``index`` on the ledger's engine (an engine may store the same rows its own way)."""

    latest = len(MIGRATIONS)

    def __init__(self, statements: Callable[[int], list[str]]) -> None:
        self._statements = statements

    def step(self, conn: Tx, index: int) -> None:
        if index == 0:
            return  # version 1 is created whole by SqlLedger._initialise
        for statement in self._statements(index):
            conn.execute(statement)

