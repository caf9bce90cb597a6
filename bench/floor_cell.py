"""The ``floor`` cell: what Marque's guarantees cost with no Marque code around them.

One timed operation is, in this one Python process, with the same libraries and
settings as a Pilot:

1. one Ed25519 JWS verification through joserfc's public API
   (``jws.deserialize_compact``) of a real marque, under the registry Marque's
   tokens use (``EdDSA`` only) — the signature a proof of possession costs;
2. one durable SQLite insert + commit (``BEGIN IMMEDIATE``, ``INSERT``,
   ``COMMIT``), the journal mode and ``synchronous`` level read back from a
   Pilot's own SQLite ledger (WAL, FULL) — the claim's durable write;
3. one PostgreSQL transaction on the target: ``BEGIN``, a stamp ``INSERT`` into a
   table made ``LIKE marque.stamps`` (its columns, keys and indexes) and the
   scenario's ``UPDATE bench``, in one message; then ``COMMIT`` — the fenced
   transaction's two round trips, without Marque's assertion or ``rows_affected``.

Each client has its own SQLite file, its own PostgreSQL connection and its own
target row, so the floor never waits on SQLite's write lock (whose busy handler
sleeps 1, 2, 5, 10… ms): it is the cheapest form of "one durable local write and
one fenced remote transaction per operation", the bar every Marque cell is read
against (``p50_ratio_to_floor``, ``throughput_ratio_to_floor``). The three parts
are timed one by one as well (``floor_parts_ms``).
"""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from harness import Cell, Op
from joserfc import jws
from joserfc.jwk import OKPKey
from scenarios import UPDATE, MarqueBed, client_row

from marque.token import public_jwk
from marque.token.marques import MARQUE_REGISTRY

#: The stamp table of the floor: made like the Pilot's own, beside it in the target.
FLOOR_STAMPS = "floor_stamps"
_FIRST = (f"BEGIN; INSERT INTO {FLOOR_STAMPS} (marque_id, nonce, attempt, kind, pilot_id, "
          "incarnation, rows_affected, created_at, expires_at) "
          "VALUES (%s, %s, 1, 'applied', %s, %s, NULL, %s, %s); " + UPDATE)
PARTS = ("jws_verify", "sqlite_commit", "pg_txn")


class FloorPeer:
    """Per client: a marque and its issuer's key, a SQLite file, a target connection."""

    def __init__(self, bed: MarqueBed, root: Path, target_dsn: str, clients: int) -> None:
        durability = bed.pilot.ledger.durability().settings
        self.journal_mode = durability["journal_mode"]
        self.synchronous = durability["synchronous"]
        self.pilot_id = bed.pilot.pilot_id
        self.incarnation = bed.pilot.incarnation
        self.key = OKPKey.import_key(public_jwk(bed.issuer))
        self.registry = MARQUE_REGISTRY
        self.tokens = [bed.issue(client_row(c)) for c in range(clients)]
        # The stamp table must exist to be copied: one real execution makes it.
        bed.execute_once(bed.issue(client_row(0)), "floor-setup-" + uuid.uuid4().hex)
        self.conns: list[psycopg.Connection[Any]] = []
        self.lites: list[sqlite3.Connection] = []
        root.mkdir(parents=True, exist_ok=True)
        try:
            with psycopg.connect(target_dsn, autocommit=True) as conn:
                conn.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_STAMPS} "
                             "(LIKE marque.stamps INCLUDING ALL)")
            for c in range(clients):
                self.conns.append(psycopg.connect(target_dsn, autocommit=True))
                self.lites.append(self._sqlite(root / f"floor-{c}.sqlite3"))
        except BaseException:
            self.close()
            raise

    def _sqlite(self, path: Path) -> sqlite3.Connection:
        lite = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        mode = lite.execute(f"PRAGMA journal_mode = {self.journal_mode}").fetchone()[0]
        lite.execute(f"PRAGMA synchronous = {self.synchronous}")
        if str(mode).lower() != self.journal_mode:
            raise RuntimeError(f"floor SQLite kept journal_mode {mode}, not {self.journal_mode}")
        lite.execute("CREATE TABLE IF NOT EXISTS claims (marque_id TEXT NOT NULL, "
                     "nonce TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (marque_id, nonce)) "
                     "WITHOUT ROWID")
        return lite

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for lite in self.lites:
            lite.close()


class FloorCell(Cell):
    """The floor at ``clients`` clients: each client its own row, file and connection."""

    def __init__(self, peer: FloorPeer, clients: int) -> None:
        super().__init__("floor", clients)
        self.peer = peer
        self._lock = threading.Lock()
        self._rounds: list[dict[str, list[float]]] = []

    def prepare(self, per_client: int) -> list[Op]:
        parts: dict[str, list[float]] = {name: [] for name in PARTS}
        with self._lock:
            self._rounds.append(parts)
        # Nonces are made before the round, as the Marque cells make theirs.
        return [self._op(c, parts, [uuid.uuid4().hex for _ in range(per_client)])
                for c in range(self.clients)]

    def _op(self, client: int, parts: dict[str, list[float]], nonces: list[str]) -> Op:
        peer = self.peer
        token, key, registry = peer.tokens[client], peer.key, peer.registry
        lite, conn = peer.lites[client], peer.conns[client]
        marque_id = f"mq_floor_{client}_{uuid.uuid4().hex[:8]}"
        row = client_row(client)
        cursor = psycopg.ClientCursor(conn)
        expires = time.time() + 6 * 3600
        jws_ms, lite_ms, pg_ms = parts["jws_verify"], parts["sqlite_commit"], parts["pg_txn"]

        def op(i: int) -> None:
            nonce = nonces[i]
            began = time.perf_counter()
            jws.deserialize_compact(token, key, registry=registry)
            verified = time.perf_counter()
            lite.execute("BEGIN IMMEDIATE")
            lite.execute("INSERT INTO claims VALUES (?, ?, ?)", (marque_id, nonce, time.time()))
            lite.execute("COMMIT")
            claimed = time.perf_counter()
            cursor.execute(_FIRST, (marque_id, nonce, peer.pilot_id, peer.incarnation,
                                    time.time(), expires, row))
            cursor.nextset()  # the stamp's INSERT
            cursor.nextset()  # the UPDATE
            if cursor.rowcount != 1:
                conn.execute("ROLLBACK")
                raise RuntimeError(f"floor UPDATE touched {cursor.rowcount} rows")
            cursor.execute("COMMIT")
            ended = time.perf_counter()
            jws_ms.append((verified - began) * 1000)
            lite_ms.append((claimed - verified) * 1000)
            pg_ms.append((ended - claimed) * 1000)

        return op

    def extra(self) -> dict[str, Any]:
        # The first round is the warm-up: left out, as the harness leaves it out.
        with self._lock:
            timed = [r for r in self._rounds[1:] if all(r.values())]
        if not timed:
            return {}
        medians = {name: round(statistics.median(statistics.median(r[name]) for r in timed), 4)
                   for name in PARTS}
        return {"floor_parts_ms": medians,
                "floor_settings": {"sqlite_journal_mode": self.peer.journal_mode,
                                   "sqlite_synchronous": self.peer.synchronous,
                                   "jws": "joserfc jws.deserialize_compact, EdDSA (Ed25519)",
                                   "token_chars": len(self.peer.tokens[0])}}
