"""Migration 7 on SQLite: the insert-only text-keyed tables stored WITHOUT ROWID.

A SQLite table with a text primary key is two b-trees: the rows, keyed by a hidden
rowid, and the primary key's own index (``sqlite_autoindex_…``) pointing into them.
Each new row dirties a page of each, and in WAL mode every page a transaction dirties
is appended whole (4 KiB) to the log and fsynced with its commit: a fresh execution
wrote 22 pages (≈90 KiB) of WAL, nine of them primary-key indexes. A ``WITHOUT ROWID``
table is one b-tree ordered by its primary key: the key's uniqueness is still the
database's constraint, and the row is written once
(https://sqlite.org/withoutrowid.html).

Rebuilt: ``budgets``, ``claims``, ``observations`` and ``pop_jtis`` — same columns,
types, ``NOT NULL``s, ``CHECK`` and primary keys, same secondary indexes, except that
``observations`` is keyed by ``(marque_id, nonce, id)`` instead of ``id`` alone: every
read of it is by nonce (and reaping by marque), so its one b-tree serves them and the
``observations_nonce`` index goes; ``id`` is still a random 128-bit value per
observation, and the key still makes each row unique. Measured per fresh execution
(bench/ledger_wal.py): 22.3 → 18.3 WAL pages.

Kept as rowid tables, because measured worse or impossible WITHOUT ROWID:

* ``attempts`` and ``outbox``: each row is written again later (the settle, the
  acknowledgement). Appended in rowid order, a row's second write lands on a page the
  same transaction dirties anyway; ordered by a random nonce, on a page of its own
  (measured: 2.6 → 2.9 pages per execution for attempts, 2.7 → 3.3 for the outbox);
* ``events``: its rows (a batch of events as JSON, ~1 KiB) are larger than a WITHOUT
  ROWID page keeps in place, so each would spill into an overflow page of its own.

Each table is rebuilt the way SQLite documents for a change ``ALTER TABLE`` cannot make
(https://sqlite.org/lang_altertable.html, "other kinds of table schema changes"): a new
table, the rows copied, the old one dropped, the new one renamed, its indexes made
again. The whole migration runs in the one transaction that also moves
``schema_version`` (``SqlLedger._migrate``), so it happens once and entirely or not at
all, and it does not depend on the tables' current form. On a big ledger it copies
every row of those tables while it holds the write lock (docs/operations.md, "Ledger
schema migrations", gives what it costs).
"""

from __future__ import annotations

#: (table, its columns in order, its body — columns and constraints — and its indexes).
_TABLES: list[tuple[str, str, str, list[str]]] = [
    (
        "budgets",
        "marque_id, target, executions_left, max_rows, attempts_per_nonce, expires_at",
        """marque_id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            executions_left INTEGER NOT NULL CHECK (executions_left >= 0),
            max_rows BIGINT NOT NULL,
            attempts_per_nonce INTEGER NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL""",
        ["CREATE INDEX budgets_expiry ON budgets (expires_at)"],
    ),
    (
        "claims",
        "marque_id, nonce, attempt, claimed_at",
        """marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            claimed_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (marque_id, nonce)""",
        [],
    ),
    (
        "observations",
        "id, marque_id, nonce, attempt, status, cause, detail, observed_at",
        """id TEXT NOT NULL,
            marque_id TEXT NOT NULL,
            nonce TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            status TEXT NOT NULL,
            cause TEXT NOT NULL,
            detail TEXT,
            observed_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (marque_id, nonce, id)""",
        [],
    ),
    (
        "pop_jtis",
        "jti, forget_after",
        """jti TEXT PRIMARY KEY,
            forget_after DOUBLE PRECISION NOT NULL""",
        ["CREATE INDEX pop_jtis_forget ON pop_jtis (forget_after)"],
    ),
]


def _rebuild(table: str, columns: str, body: str, indexes: list[str]) -> list[str]:
    staged = f"{table}_rebuilt"
    return [
        f"CREATE TABLE {staged} (\n            {body}) WITHOUT ROWID",
        f"INSERT INTO {staged} ({columns}) SELECT {columns} FROM {table}",
        f"DROP TABLE {table}",  # its indexes go with it
        f"ALTER TABLE {staged} RENAME TO {table}",
        *indexes,
    ]


#: Migration 7 of the ledger on SQLite (see :data:`marque.ledger.schema.MIGRATIONS`).
WITHOUT_ROWID_MIGRATION: list[str] = [
    statement for spec in _TABLES for statement in _rebuild(*spec)
]

#: The tables :data:`WITHOUT_ROWID_MIGRATION` stores WITHOUT ROWID.
WITHOUT_ROWID_TABLES = tuple(spec[0] for spec in _TABLES)
