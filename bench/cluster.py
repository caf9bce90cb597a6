"""The bench's own PostgreSQL cluster, durable like a real one (fsync on), on 127.0.0.1.

Reuses the test suite's throwaway cluster (``tests/support/pgcluster.py``) and only
turns durability back on: that cluster sets ``fsync = off`` for crash tests,
and a later line in ``postgresql.conf`` wins.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.pgcluster import PgCluster  # noqa: E402  (tests/ is put on the path just above)

#: Rows in the target table: one per client, plus spares.
TARGET_ROWS = 128
#: The row every client of a ``_hot`` cell updates.
HOT_ROW = TARGET_ROWS

DURABLE = (
    "\n# marque bench: durability on, as in production\n"
    "fsync = on\nfull_page_writes = on\nsynchronous_commit = on\n"
)


class BenchCluster:
    """A started cluster with the bench's databases: target, ledger, DBOS system."""

    def __init__(self) -> None:
        self.cluster = PgCluster(max_connections=300).init()
        with open(self.cluster.data / "postgresql.conf", "a", encoding="utf-8") as handle:
            handle.write(DURABLE)
        self.cluster.start()
        try:
            with psycopg.connect(self.cluster.dsn(), autocommit=True) as conn:
                for name in ("bench", "ledger", "dbos_sys"):
                    conn.execute(f'CREATE DATABASE "{name}"')
            with psycopg.connect(self.dsn("bench")) as conn:
                conn.execute("CREATE TABLE bench (id int PRIMARY KEY, v bigint NOT NULL)")
                conn.execute(
                    "INSERT INTO bench SELECT g, 0 FROM generate_series(1, %s) g", (TARGET_ROWS,)
                )
        except BaseException:
            self.cluster.destroy()
            raise

    def dsn(self, dbname: str) -> str:
        return self.cluster.dsn(dbname)

    def settings(self) -> dict[str, Any]:
        names = ("server_version", "fsync", "synchronous_commit", "full_page_writes",
                 "wal_sync_method", "shared_buffers")
        with psycopg.connect(self.dsn("bench"), autocommit=True) as conn:
            return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]

    def destroy(self) -> None:
        self.cluster.destroy()
