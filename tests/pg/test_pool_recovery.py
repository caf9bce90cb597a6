"""The PostgreSQL pools after a server crash: no slot held for a connection nobody makes.

psycopg_pool counts a connection it is replacing in the background in the
pool's size while it backs off between attempts (1 s, 2 s, 4 s, … by default
for five minutes). After a crash the pool looked full of such slots, so a
caller after the restart waited on the pool (up to the whole checkout
timeout) instead of growing it. ``pgpool`` has the pool give up those
attempts soon, so the slots come free and the next caller connects.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from support.pgcluster import PgCluster

from marque.storage import pgpool


def _select_one(pool: pgpool.Pool, dsn: str) -> int:
    with pgpool.connection(pool, dsn) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def test_a_crash_leaves_no_slot_held_for_a_connection_being_retried(
        pg_cluster: PgCluster) -> None:
    dsn = pg_cluster.dsn()
    pool = pgpool.make_pool(dsn, name="test-recovery", min_size=1, max_size=4)
    try:
        held = [pgpool.checkout(pool, dsn) for _ in range(3)]
        for conn in held:
            pool.putconn(conn)
        assert pool.get_stats()["pool_size"] >= 3  # it may grow one past what was asked

        pg_cluster.crash()
        # Each broken connection handed out is dropped and a replacement started;
        # with the server down the replacements fail and are retried.
        for _ in range(4):
            with pytest.raises(psycopg.OperationalError):
                _select_one(pool, dsn)
        # Soon after the give-up time every replacement has stopped and given its slot
        # back. (Before, psycopg_pool's default kept retrying, and counting, for five
        # minutes: far past this deadline, which only bounds a slow machine's wait.)
        deadline = time.monotonic() + 30
        while pool.get_stats()["pool_size"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.get_stats()["pool_size"] == 0

        pg_cluster.start()
        assert _select_one(pool, dsn) == 1
        assert pool.get_stats()["pool_size"] >= 1
    finally:
        pool.close()
