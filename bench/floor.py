"""The floor under Marque's execution path on this machine, measured side by side.

    .venv/bin/python bench/floor.py

Each ingredient of an execution alone — raw psycopg UPDATE + COMMIT, one
durable SQLite commit (WAL, synchronous=FULL), the fenced target transaction
(``PostgresTarget.execute``), one bare Ed25519 verification, one proof of
possession through joserfc (``verify_proof``) — and then whole executions
through an in-process Pilot (fresh nonce; replay of an applied one). For each:
the median wall time of 400 operations per round, three interleaved rounds, and
the mean CPU time of the process (all its threads: the Pilot's background
reporter and writers included) per operation. CPU is what bounds
throughput in one Python process: with one GIL, N client threads cannot do more
than ~1000 / (CPU ms per op) operations per second between them. Runs on a
fresh fsync-on cluster. See bench/README.md, "The floor on this machine".
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from cluster import BenchCluster  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from scenarios import MarqueBed  # noqa: E402

from marque.target.base import TargetAttempt  # noqa: E402
from marque.target.postgres import PostgresTarget  # noqa: E402
from marque.token import Change, Statement, make_proof, read_marque, verify_proof  # noqa: E402

OPS = 400
ROUNDS = 3


#: System (kernel) CPU ms per operation of the last :func:`measure`, by its name.
SYSTEM_MS: dict[str, list[float]] = {}


def measure(op: Callable[[int], None], name: str = "") -> tuple[float, float]:
    """Median wall ms, and mean CPU ms of the whole process (every thread) per operation.

    The kernel's share of that CPU (fsync, socket sends and receives, polls) is kept
    in :data:`SYSTEM_MS`: what no change to Marque's Python can take away.
    """
    samples = []
    began = os.times()
    for i in range(OPS):
        start = time.perf_counter()
        op(i)
        samples.append(time.perf_counter() - start)
    ended = os.times()
    cpu = (ended.user + ended.system - began.user - began.system) / OPS
    SYSTEM_MS.setdefault(name, []).append((ended.system - began.system) / OPS * 1e3)
    return statistics.median(samples) * 1e3, cpu * 1e3


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
        counter = iter(range(10**9))

        def target_op(_: int) -> None:
            run = TargetAttempt("mq_floor", f"n{next(counter)}", 1, "floor", "inc_floor", change, 1,
                      30_000, expires_at=time.time() + 600)
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

        def ed25519_op(_: int) -> None:
            public.verify(signature, message)

        bed = MarqueBed(Path(workdir), "floor", cluster.dsn("bench"))
        token = bed.issue(3)
        marque = read_marque(token, bed.pilot.trusted)
        bed.execute_once(token, "applied-once")
        proofs: dict[str, list[str]] = {}

        def prepare() -> None:
            # Client-side work (one signature per proof) is done before timing.
            proofs["pop"] = [make_proof(bed.holder, token, nonce="n", pilot_id=bed.pilot.pilot_id)
                             for _ in range(OPS)]
            proofs["fresh_nonces"] = [f"f-{uuid.uuid4().hex}" for _ in range(OPS)]
            proofs["fresh"] = [bed.proof(token, n) for n in proofs["fresh_nonces"]]
            proofs["replay"] = [bed.proof(token, "applied-once") for _ in range(OPS)]

        def pop_op(i: int) -> None:
            verify_proof(proofs["pop"][i], marque, nonce="n", pilot_id=bed.pilot.pilot_id,
                         remember_jti=None)

        def fresh_op(i: int) -> None:
            outcome = bed.pilot.execute(token, proofs["fresh"][i], proofs["fresh_nonces"][i])
            assert outcome.status == "applied", outcome

        def replay_op(i: int) -> None:
            outcome = bed.pilot.execute(token, proofs["replay"][i], "applied-once")
            assert outcome.replayed, outcome

        ops = [("SQLite FULL commit", sqlite_op), ("fenced target txn", target_op),
               ("Ed25519 verify", ed25519_op), ("proof verify (joserfc)", pop_op),
               ("Pilot: fresh execution", fresh_op), ("Pilot: replay", replay_op)]
        print("Wall: median ms (× raw of the same round). CPU: mean process-CPU ms per op.\n")
        print("| round | raw | " + " | ".join(name for name, _ in ops) + " |")
        print("| ---: | ---: |" + " ---: |" * len(ops))
        cpu: dict[str, list[float]] = {name: [] for name in ["raw", *(n for n, _ in ops)]}
        for round_no in range(1, ROUNDS + 1):
            prepare()
            bed.pilot.report()  # start each round with an empty outbox
            raw_ms, raw_cpu = measure(raw_op, "raw")
            cpu["raw"].append(raw_cpu)
            cells = []
            for name, op in ops:
                ms, op_cpu = measure(op, name)
                cpu[name].append(op_cpu)
                cells.append(f"{ms:.3f} ({ms / raw_ms:.2f}×)")
            print(f"| {round_no} | {raw_ms:.3f} | " + " | ".join(cells) + " |")
        print("\n| CPU per op, median of rounds | ms | of it in the kernel | one-GIL ceiling, "
              "ops/s |")
        print("| --- | ---: | ---: | ---: |")
        for name, values in cpu.items():
            ms = statistics.median(values)
            kernel = statistics.median(SYSTEM_MS.get(name, [0.0]))
            print(f"| {name} | {ms:.3f} | {kernel:.3f} | {1000 / ms:,.0f} |")
        bed.close()
        target.close()
        raw.close()
        lite.close()
    finally:
        cluster.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
