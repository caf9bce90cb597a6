"""The SQLite ledger's group commit when the COMMIT itself fails: every member hears of it.

The SQLite ledger makes many callers' work durable with one COMMIT (see
``ledger/sqlite.py``). Here that COMMIT fails for real: a child process lowers
its own file-size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored) so that
SQLite's WAL writes at COMMIT get ``EFBIG`` — what a full disk looks like to
SQLite — while eight threads write through the ledger at once. Every caller
whose work was in a failed group must get a typed error, and none of that
work may be durable; once the limit is lifted, the same ledger commits again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CALLERS = 8
MAX_ROUNDS = 60

# Runs in a child process: the file-size limit must not touch the test runner's own files.
CHILD = r"""
import json, resource, signal, sqlite3, sys, threading
from marque.ledger.sqlite import SqliteLedger

path, callers, max_rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
SqliteLedger.create(path, "pilot-gc").close()
ledger = SqliteLedger.open(path)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
rounds = []

def durable(keys):
    conn = sqlite3.connect(path)
    try:
        marks = ",".join("?" * len(keys))
        return sorted(r[0] for r in conn.execute(
            f"SELECT key FROM meta WHERE key IN ({marks})", keys))
    finally:
        conn.close()

for number in range(max_rounds):
    barrier = threading.Barrier(callers)
    results = {}

    def caller(index):
        key = f"r{number}c{index}"
        barrier.wait()
        try:
            with ledger.transaction() as tx:
                tx.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, "x" * 200))
            results[key] = {"ok": True}
        except Exception as exc:
            root = exc.__cause__ if exc.__cause__ is not None else exc
            results[key] = {"ok": False, "code": getattr(exc, "code", None),
                            "errorname": getattr(exc, "detail", {}).get("sqlite_errorname"),
                            "failure": id(root)}

    # Past 1 KiB nothing more can be written: the WAL's first frame at COMMIT fails.
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    rounds.append({"results": results, "durable": durable(sorted(results))})
    shared = {}
    for result in results.values():
        if not result["ok"]:
            shared[result["failure"]] = shared.get(result["failure"], 0) + 1
    if any(count > 1 for count in shared.values()):
        break  # a group of several callers failed together: that is the case under test

with ledger.transaction() as tx:  # the limit is lifted: the same ledger commits again
    tx.execute("INSERT INTO meta (key, value) VALUES ('after', 'x')")
after = durable(["after"])
ledger.close()
print(json.dumps({"rounds": rounds, "after": after}))
"""


def run_child(path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(CALLERS), str(MAX_ROUNDS)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_failed_group_commit_reaches_every_waiting_caller(tmp_path: Path) -> None:
    """A COMMIT that fails for a group raises a typed error in every member; none of it lands."""
    outcome = run_child(tmp_path / "ledger.sqlite3")

    grouped = 0
    for round_ in outcome["rounds"]:
        results = round_["results"]
        succeeded = sorted(k for k, r in results.items() if r["ok"])
        # Whatever returned normally is durable, and nothing else is.
        assert round_["durable"] == succeeded, round_
        failures: dict[int, list[str]] = {}
        for key, result in results.items():
            if result["ok"]:
                continue
            assert result["code"] == "ledger_unavailable", result
            assert result["errorname"] in ("SQLITE_FULL", "SQLITE_IOERR_WRITE"), result
            failures.setdefault(result["failure"], []).append(key)
        grouped += sum(1 for members in failures.values() if len(members) > 1)
    assert grouped, (f"no COMMIT carried several callers in {len(outcome['rounds'])} rounds; "
                     "the group case was never exercised")
    assert outcome["after"] == ["after"]
