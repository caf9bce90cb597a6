"""What the SQLite ledger writes per fresh execution: WAL bytes and pages, by b-tree.

    PYTHONPATH=<tree>/src .venv/bin/python bench/ledger_wal.py

A Pilot with a SQLite ledger and the bench's PostgreSQL target runs ``WARM`` fresh
executions (so the ledger's b-trees have grown past their first pages), then, with
the WAL emptied and SQLite's automatic checkpoint off on the ledger's writing
connection, ``N`` more, their settles and their reports flushed. Every page a commit
dirties is one frame of the WAL (a 24-byte header and the whole page), so the WAL's
size over ``N`` is what the ledger wrote to its log per execution: the claim, the
settle carried in the next claim, the outbox acknowledgements. Each frame's page is
then named by ``dbstat`` (the table or index that owns it; page 1 is the schema page,
whose header holds the file's size; pages no b-tree owns are pointer-map and freelist
pages of ``auto_vacuum``). Statements are counted on the writing connection by
SQLite's trace callback. Prints one table; run it for the old and the new tree in
turn (figures are per execution, so the runs compare directly; they do not depend
on timing).
"""

from __future__ import annotations

import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import BenchCluster  # noqa: E402
from scenarios import MarqueBed  # noqa: E402

N = int(os.environ.get("N", "500"))
WARM = int(os.environ.get("WARM", "1000"))


def wal_frames(path: str) -> tuple[list[int], int, int]:
    """The page number of each frame in the WAL file, its commits and its page size."""
    data = Path(path).read_bytes()
    if len(data) < 32:
        return [], 0, 0
    page_size = struct.unpack(">I", data[8:12])[0]
    pages, commits = [], 0
    for at in range(32, len(data) - page_size - 23, page_size + 24):
        page, size_after_commit = struct.unpack(">II", data[at:at + 8])
        pages.append(page)
        commits += size_after_commit != 0
    return pages, commits, page_size


def statement_kind(sql: str) -> str:
    words = sql.split()
    verb = words[0].upper()
    if verb in ("INSERT", "DELETE") and len(words) > 2:
        return f"{verb} {words[2]}"
    if verb == "UPDATE" and len(words) > 1:
        return f"{verb} {words[1]}"
    return verb


def main() -> None:
    cluster = BenchCluster()
    workdir = tempfile.mkdtemp(prefix="marque-wal-")
    try:
        bed = MarqueBed(Path(workdir), "wal", cluster.dsn("bench"))
        ledger = bed.pilot.ledger
        token = bed.issue(3)

        def run(count: int) -> None:
            nonces = [f"n-{uuid.uuid4().hex}" for _ in range(count)]
            for nonce, proof in [(n, bed.proof(token, n)) for n in nonces]:
                outcome = bed.pilot.execute(token, proof, nonce)
                assert outcome.status == "applied", outcome

        def settle() -> None:
            if bed.pilot.settler is not None:
                bed.pilot.settler.flush()
            bed.pilot.report()

        run(WARM)
        settle()
        writer = ledger._conn  # type: ignore[attr-defined]  # the SQLite ledger's writer
        with ledger._cond:  # type: ignore[attr-defined]  # between group commits
            writer.execute("PRAGMA wal_autocheckpoint = 0")
            writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        statements: collections.Counter[str] = collections.Counter()
        writer.set_trace_callback(lambda sql: statements.update([statement_kind(sql)]))
        run(N)
        settle()
        writer.set_trace_callback(None)

        wal = ledger.path + "-wal"  # type: ignore[attr-defined]
        pages, commits, page_size = wal_frames(wal)
        reader = sqlite3.connect(ledger.path)  # type: ignore[attr-defined]
        owners = dict(reader.execute("SELECT pageno, name FROM dbstat"))
        reader.close()
        by_owner = collections.Counter(owners.get(p, "(pointer map, freelist)") for p in pages)
        size = os.path.getsize(wal)
        print(f"{N} fresh executions after {WARM}; page size {page_size}")
        print(f"WAL bytes per execution: {size / N:,.0f}; pages {len(pages) / N:.2f}; "
              f"commits {commits / N:.2f}\n")
        print("| b-tree | WAL pages per execution |\n| --- | ---: |")
        for owner, count in by_owner.most_common():
            print(f"| {owner} | {count / N:.2f} |")
        print("\n| statement (writing connection) | per execution |\n| --- | ---: |")
        for kind, count in statements.most_common():
            print(f"| {kind} | {count / N:.2f} |")
        bed.close()
    finally:
        cluster.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
