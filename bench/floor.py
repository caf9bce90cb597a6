"""The floor under Marque's execution path on this machine, measured side by side.

    .venv/bin/python bench/floor.py

Raw psycopg UPDATE + COMMIT; one durable SQLite commit (WAL, synchronous=FULL);
the fenced target transaction alone (``PostgresTarget.execute``); one Ed25519
verification. Medians of 400 operations per round, three interleaved rounds,
on a fresh fsync-on cluster. See bench/README.md, "The floor on this machine".
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from cluster import BenchCluster  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from marque.target.base import Run  # noqa: E402
from marque.target.postgres import PostgresTarget  # noqa: E402
from marque.token import Change, Statement  # noqa: E402

OPS = 400


def median_ms(op: Callable[[int], None]) -> float:
    samples = []
    for i in range(OPS):
        start = time.perf_counter()
        op(i)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    cluster = BenchCluster()
    workdir = tempfile.mkdtemp(prefix="marque-floor-")
    try:
        raw = psycopg.connect(cluster.dsn("bench"))

        def raw_op(_: int) -> None:
            raw.execute("UPDATE bench SET v = v + 1 WHERE id = %s", (1,))
            raw.commit()

        target = PostgresTarget("bench", cluster.dsn("bench"))
        change = Change((Statement("UPDATE bench SET v = v + 1 WHERE id = %s", (2,)),))
        nonce = iter(range(10**9))

        def target_op(_: int) -> None:
            run = Run("mq_floor", f"n{next(nonce)}", 1, "floor", "inc_floor", change, 1, 30_000,
                      expires_at=time.time() + 600)
            target.execute(run, lambda *a, **k: None)

        lite = sqlite3.connect(os.path.join(workdir, "floor.sqlite3"), isolation_level=None)
        lite.execute("PRAGMA journal_mode = WAL")
        lite.execute("PRAGMA synchronous = FULL")
        lite.execute("CREATE TABLE x (a INTEGER)")

        def sqlite_op(i: int) -> None:
            lite.execute("BEGIN IMMEDIATE")
            lite.execute("INSERT INTO x VALUES (?)", (i,))
            lite.execute("COMMIT")

        key = Ed25519PrivateKey.generate()
        public, message = key.public_key(), b"x" * 300
        signature = key.sign(message)

        def verify_op(_: int) -> None:
            public.verify(signature, message)

        print("| round | raw ms | SQLite FULL commit | fenced target txn | Ed25519 verify |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for round_no in range(1, 4):
            r = median_ms(raw_op)
            s, t, v = median_ms(sqlite_op), median_ms(target_op), median_ms(verify_op)
            print(f"| {round_no} | {r:.3f} | {s:.3f} ({s / r:.2f}×) | {t:.3f} ({t / r:.2f}×) "
                  f"| {v:.3f} ({v / r:.2f}×) |")
        target.close()
        raw.close()
        lite.close()
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
