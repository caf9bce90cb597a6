"""What a fresh ``marque`` process costs, side by side with its floor.

The start-up target: ``marque exec`` of a fresh nonce in at most 150 ms wall. A CLI
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

Then what ``marque exec``'s imports cost (``python -X importtime``, the same command,
median of the rounds): the modules' own import time summed by top-level package —
Marque's own, joserfc, cryptography (which joserfc imports), click, and the rest
(the standard library) — and in all. ``-X importtime`` slows imports down a little;
read its figures as shares.

Run: ``.venv/bin/python bench/cli_startup.py [ROUNDS]`` (default 15). Byte-code caching is
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


#: Top-level packages whose import time is reported on its own; the rest is "other".
PACKAGES = ("marque", "joserfc", "cryptography", "click")


def _import_ms(args: list[str], cwd: Path) -> dict[str, float]:
    """Self import time (ms) of ``args``' modules by top-level package, from -X importtime."""
    done = subprocess.run([str(BIN / "python"), "-X", "importtime", "-m", *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{args[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    totals = dict.fromkeys((*PACKAGES, "other"), 0.0)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, self_us, _, name = (part.strip() for part in line.replace("|", ":").split(":", 3))
        top = name.split(".")[0]
        totals[top if top in PACKAGES else "other"] += int(self_us) / 1000
    totals["all"] = sum(totals.values())
    return totals


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
        imports: list[dict[str, float]] = []
        for i in range(rounds):
            for name, make in cases.items():
                times[name].append(_run(make(i), root))
            imports.append(_import_ms(["marque", *cases["marque_exec"](i)[1:-2],
                                       f"imports-{i}", "--json"], root))
    base = statistics.median(times["python_update"])
    results = {name: {"median_ms": round(statistics.median(t) * 1000, 1),
                      "x_python_update": round(statistics.median(t) / base, 2)}
               for name, t in times.items()}
    import_ms = {name: round(statistics.median(r[name] for r in imports), 1)
                 for name in imports[0]}
    exec_ms = results["marque_exec"]["median_ms"]
    print(json.dumps({"rounds": rounds, "load_average": [round(x, 2) for x in os.getloadavg()],
                      "results": results, "marque_exec_import_ms": import_ms,
                      "marque_exec_target_ms": 150,
                      "marque_exec_meets_target": exec_ms <= 150}, indent=2))


if __name__ == "__main__":
    main()
