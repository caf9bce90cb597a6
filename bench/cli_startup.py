"""What a fresh ``marque`` process costs, side by side with its floor.

Issue 8 asked for ``marque exec`` of a fresh nonce under 150 ms wall. A CLI
process pays for the interpreter, its imports and its durable writes every
time, so this measures, interleaved, in one run, medians of N rounds:

* ``python_update``: ``python -c`` doing one SQLite UPDATE (WAL, synchronous=FULL)
  — the work a direct script does;
* ``import_click`` / ``import_joserfc``: the imports no ``exec`` can avoid
  (click parses the command line; joserfc, the project's JOSE library, signs the
  proof and verifies the marque, and imports ``cryptography.x509`` on the way);
* ``marque_help``, ``marque_version``: the CLI with nothing to do;
* ``marque_exec``: ``marque exec --json`` of a fresh nonce on a SQLite ledger and
  target (claim, fenced transaction, record, report to the local logbook).

Run: ``.venv/bin/python bench/cli_startup.py [ROUNDS]``. Byte-code caching is
left on for the children (as for an installed package), whatever the parent's
``PYTHONDONTWRITEBYTECODE`` says.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
MARQUE = str(BIN / "marque")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["COLUMNS"] = "200"
    return env


def _run(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{args[:3]} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return elapsed


def _setup(root: Path) -> Path:
    bank = root / "bank.db"
    with sqlite3.connect(bank) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        conn.execute("INSERT INTO accounts VALUES (1, 1000000)")
    conn.close()
    for who in ("issuer", "holder"):
        pub = subprocess.run([MARQUE, "keys", "new", "--out", f"{who}.jwk", "--public"],
                             cwd=root, env=_env(), capture_output=True, text=True, check=True)
        (root / f"{who}.pub.jwk").write_text(pub.stdout)
    init = subprocess.run([MARQUE, "pilot", "init", "--home", "pilot", "--pilot-id", "bench",
                           "--json"], cwd=root, env=_env(), capture_output=True, text=True,
                          check=True)
    incarnation = json.loads(init.stdout)["incarnation"]
    for args in (["pilot", "trust", "--home", "pilot", "issuer.pub.jwk"],
                 ["pilot", "target", "add", "--home", "pilot", "bank", f"sqlite:///{bank}"]):
        subprocess.run([MARQUE, *args], cwd=root, env=_env(), capture_output=True, check=True)
    token = subprocess.run(
        [MARQUE, "issue", "--issuer-key", "issuer.jwk", "--pilot-id", "bench", "--incarnation",
         incarnation, "--target", "bank", "--holder-key", "holder.pub.jwk", "--sql",
         "UPDATE accounts SET balance = balance - 1 WHERE id = 1", "--executions", "100000",
         "--max-rows", "1", "--ttl", "1d"],
        cwd=root, env=_env(), capture_output=True, text=True, check=True).stdout
    (root / "m.jws").write_text(token)
    return bank


def main() -> None:
    """Interleaved rounds; prints medians and ratios to the direct UPDATE."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    with tempfile.TemporaryDirectory(prefix="marque-cli-bench-") as tmp:
        root = Path(tmp)
        bank = _setup(root)
        update = (f"import sqlite3; c = sqlite3.connect({str(bank)!r}, isolation_level=None); "
                  "c.execute('PRAGMA synchronous = FULL'); "
                  "c.execute('UPDATE accounts SET balance = balance - 1 WHERE id = 1')")
        py = str(BIN / "python")
        cases = {
            "python_update": lambda i: [py, "-c", update],
            "import_click": lambda i: [py, "-c", "import click"],
            "import_joserfc": lambda i: [py, "-c", "import joserfc.jws"],
            "marque_version": lambda i: [MARQUE, "--version"],
            "marque_help": lambda i: [MARQUE, "--help"],
            "marque_exec": lambda i: [MARQUE, "exec", "--home", "pilot", "--marque", "m.jws",
                                      "--key", "holder.jwk", "--nonce", f"n{i}", "--json"],
        }
        for make in cases.values():  # warm the byte-code caches and the page cache
            _run(make(-1), root)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(rounds):
            for name, make in cases.items():
                times[name].append(_run(make(i), root))
    base = statistics.median(times["python_update"])
    results = {name: {"median_ms": round(statistics.median(t) * 1000, 1),
                      "x_python_update": round(statistics.median(t) / base, 2)}
               for name, t in times.items()}
    print(json.dumps({"rounds": rounds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
