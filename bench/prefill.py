"""Pre-filling a SQLite ledger with settled entries, and measuring what reaping gives back.

An *entry* is the ledger's record of one settled execution of one nonce.
Rather than hard-coding the ledger's schema, the bench runs one real
execution (the *template*) through the Pilot and then copies the rows it left
in every ledger table — claims, attempts, observations, events, outbox,
budgets, proof ``jti``s — ``entries`` times in one bulk transaction, with new
marque ids, nonces, ids and ``jti``s. So a pre-filled entry is what a real
execution leaves, whatever the schema has become.

Ten nonces per marque; one marque in ten is live, the rest expired long ago
(and reported), so ``ledger.reap`` should take the ledger back to the live tenth.
The bulk insert uses its own connection with ``synchronous = OFF``: it is
set-up, not measured.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

NONCES_PER_MARQUE = 10
LIVE_EVERY = 10  # one marque in ten is live
DAY = 86_400.0


def prefill_sqlite_ledger(
    path: str,
    template_marque_id: str,
    template_jti: str,
    entries: int,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Copy the template execution's rows ``entries`` times; returns rows written per table."""
    now = time.time() if now is None else now
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    written: dict[str, int] = {}
    try:
        conn.execute("PRAGMA synchronous = OFF")
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )]
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in tables:
                columns = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
                if "marque_id" in columns:
                    rows = conn.execute(
                        f'SELECT * FROM "{table}" WHERE marque_id = ?', (template_marque_id,)
                    ).fetchall()
                elif "jti" in columns:
                    rows = conn.execute(
                        f'SELECT * FROM "{table}" WHERE jti = ?', (template_jti,)
                    ).fetchall()
                else:
                    continue  # meta and the like: not per execution
                if not rows:
                    continue
                per_marque = "nonce" not in columns and "jti" not in columns
                generate = _rows(columns, rows, entries, per_marque, now)
                placeholders = ", ".join("?" for _ in columns)
                names = ", ".join(f'"{c}"' for c in columns)
                cur = conn.executemany(
                    f'INSERT INTO "{table}" ({names}) VALUES ({placeholders})', generate
                )
                written[table] = cur.rowcount
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return written


def _rows(
    columns: list[str],
    template: list[tuple[Any, ...]],
    entries: int,
    per_marque: bool,
    now: float,
) -> Iterator[tuple[Any, ...]]:
    expired_at, live_until, forgotten = now - DAY, now + 30 * DAY, now - 3600.0

    def marque_id(m: int) -> str:
        return f"mq_pf{m:024d}"

    makers: list[Callable[[int, int, int, Any], Any]] = []
    for name in columns:
        if name == "marque_id":
            makers.append(lambda k, m, j, v: marque_id(m))
        elif name == "nonce":
            makers.append(lambda k, m, j, v: f"pf-{k:032x}")
        elif name == "jti":
            makers.append(lambda k, m, j, v: f"pf{k:030x}")
        elif name == "id":
            makers.append(lambda k, m, j, v: f"{k:024x}{j:08x}" if isinstance(v, str) else None)
        elif name == "expires_at":
            makers.append(lambda k, m, j, v: live_until if m % LIVE_EVERY == 0 else expired_at)
        elif name == "forget_after":
            makers.append(lambda k, m, j, v: forgotten)
        else:
            makers.append(lambda k, m, j, v: v)
    step = NONCES_PER_MARQUE if per_marque else 1
    for k in range(0, entries, step):
        m = k // NONCES_PER_MARQUE
        for j, row in enumerate(template):
            yield tuple(make(k, m, j, v) for make, v in zip(makers, row, strict=True))


def sqlite_file_sizes(path: str) -> dict[str, int]:
    """Main file, WAL and free pages of a SQLite database, in bytes."""
    conn = sqlite3.connect(path, timeout=60)
    try:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()
    return {"pages_bytes": page * pages, "freelist_bytes": page * free}


def measure_reap(ledger: Any, path: str, *, vacuum: bool) -> dict[str, Any]:
    """Ledger size before and after ``ledger.reap(now)``; then checkpointed and vacuumed."""
    before = ledger.stats(time.time())
    started = time.perf_counter()
    reaped = ledger.reap(time.time())
    reap_seconds = time.perf_counter() - started
    after = ledger.stats(time.time())
    result: dict[str, Any] = {
        "ledger_size_bytes_before_reap": before["size_bytes"],
        "ledger_size_bytes_after_reap": after["size_bytes"],
        "reap_seconds": round(reap_seconds, 2),
        "reaped": reaped,
        "ledger_claims_before_reap": before["claims"],
        "ledger_claims_after_reap": after["claims"],
        "freelist_bytes_after_reap": sqlite_file_sizes(path)["freelist_bytes"],
    }
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        result["ledger_size_bytes_after_reap_checkpoint"] = ledger.stats(time.time())["size_bytes"]
        if vacuum:
            started = time.perf_counter()
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            result["vacuum_seconds"] = round(time.perf_counter() - started, 2)
            result["ledger_size_bytes_after_vacuum"] = ledger.stats(time.time())["size_bytes"]
    finally:
        conn.close()
    return result
