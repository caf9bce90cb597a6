"""End-to-end support: a real Pilot world built through the real ``marque`` CLI.

Every helper runs the console script as a subprocess (with a timeout, in the
environment :func:`support.cli.cli_env` builds; ``run_cli``, ``one_json`` and
``Result`` are :mod:`support.cli`'s, re-exported here) against real SQLite files
under ``tmp_path``: the bank target, the Pilot's ledger and its logbook. Nothing
is mocked.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.cli import MARQUE, TIMEOUT, Result, cli_env, one_json, run_cli
from support.cli import json_lines as json_lines  # the tests import them from here
from support.harbour import PilotServe
from support.world import EXECUTIONS, MAX_ROWS, PilotWorld, SqliteBank
from support.world import claims_of as claims_of  # the tests import them from here
from support.world import marque_id_of as marque_id_of

#: How long a cached default-TTL marque (15 minutes) is reused before a fresh one is issued.
TOKEN_REUSE_S = 300.0

OUTCOME_KEYS = {
    "marque_id", "nonce", "status", "attempt", "rows_affected", "replayed", "pilot", "error",
    "recorded",
}
EXIT = {"applied": 0, "usage": 2, "refused": 3, "aborted_not_applied": 4,
        "indeterminate": 5, "in_progress": 6}


class World(PilotWorld):
    """A Pilot home, a bank target and issuer/holder keys, all made by the CLI (the
    shared :class:`support.world.PilotWorld`, over SQLite files)."""

    pilot_id = "p1"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "pilot"
        self.bank = root / "bank.db"
        self.incarnation = ""
        self._issued = 0
        # Tokens issued for this incarnation, by their `marque issue` arguments. Copies
        # of a world share it (same keys, same incarnation, independent ledgers), so a
        # test suite does not pay one CLI run per identical marque.
        #: Default-TTL marques already issued, with when (monotonic): reused while young.
        self.token_cache: dict[tuple[Any, ...], tuple[float, str]] = {}

    # -- setup ----------------------------------------------------------------

    def bank_reader(self) -> SqliteBank:
        return SqliteBank(self.bank)

    def build(self) -> World:
        self.bank_reader().create([1, 2])

        # Independent steps run side by side: two keys and the ledger.
        env = cli_env()
        procs = {
            name: subprocess.Popen(
                [str(MARQUE), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, text=True, env=env,
            )
            for name, args in {
                "issuer": ("keys", "new", "--out", self.issuer_key, "--public"),
                "holder": ("keys", "new", "--out", self.holder_key, "--public"),
                "init": ("pilot", "init", "--home", self.home, "--pilot-id", self.pilot_id,
                         "--json"),
            }.items()
        }
        results = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=TIMEOUT)
            results[name] = Result(proc.returncode, out, err)
            assert proc.returncode == 0, (name, out, err)

        for who, pub in (("issuer", self.issuer_pub), ("holder", self.holder_pub)):
            jwk = one_json(results[who].stdout)
            assert "d" not in jwk, "--public must print the public JWK only"
            assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
            pub.write_text(json.dumps(jwk))

        ident = results["init"].json
        assert set(ident) == {"pilot_id", "incarnation", "adopted"}
        assert ident["adopted"] is False
        assert ident["pilot_id"] == self.pilot_id
        self.incarnation = ident["incarnation"]

        res = self.run("pilot", "trust", "--home", self.home, self.issuer_pub, "--json")
        assert res.returncode == 0, res
        assert isinstance(res.json["kid"], str)
        res = self.run("pilot", "target", "add", "--home", self.home, self.target,
                       f"sqlite:///{self.bank.resolve()}", "--json")
        assert res.returncode == 0, res
        assert res.json["target"] == self.target
        return self

    def copy_to(self, root: Path) -> World:
        """An independent copy of this CLI-built world under ``root``.

        Building a world costs five CLI runs; tests get a copy of one built
        once per session. The copy's ``pilot.json`` is repointed at the
        copy's own bank (its ledger is found inside its home), so nothing is
        shared.
        """
        shutil.copytree(self.root, root, dirs_exist_ok=True)
        twin = World(root)
        twin.incarnation = self.incarnation
        twin.token_cache = self.token_cache
        config_path = twin.home / "pilot.json"
        config = json.loads(config_path.read_text())
        assert config["ledger"] == "sqlite:///ledger.sqlite3"  # relative: it moves with the home
        assert config["targets"] == {"bank": f"sqlite:///{self.bank.resolve()}"}
        config["targets"]["bank"] = f"sqlite:///{twin.bank.resolve()}"
        # Tests do deliberately what an operator must not: run a copy of a home, whose ledger
        # is a clone of the original's incarnation, next to the original (each copy has its
        # own bank, so no marque can spend twice against one target). The Pilot refuses such
        # a copy (home_mismatch); here each copy gets a home id of its own and its ledger is
        # bound to it directly, as `pilot init` binds a new ledger.
        home_id = "home_" + uuid.uuid4().hex
        config["home_id"] = home_id
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        conn = sqlite3.connect(twin.home / "ledger.sqlite3")
        try:
            with conn:
                for key, value in (("home_id", home_id), ("home_path", str(twin.home.resolve()))):
                    updated = conn.execute("UPDATE meta SET value = ? WHERE key = ?",
                                           (value, key)).rowcount
                    assert updated == 1, f"the template's ledger has no {key} binding"
        finally:
            conn.close()
        return twin

    # -- CLI --------------------------------------------------------------------

    def run(self, *args: Any, env: dict[str, str] | None = None,
            timeout: float = TIMEOUT) -> Result:
        return run_cli(*args, env=env, timeout=timeout, cwd=self.root)

    def issue(
        self,
        sql: Sequence[str],
        params: Sequence[str] = (),
        *,
        executions: int = EXECUTIONS,
        max_rows: int = MAX_ROWS,
        attempts: int | None = None,  # None: the CLI's default (support.world.ATTEMPTS)
        ttl: str | None = None,
        incarnation: str | None = None,
    ) -> Path:
        """Issue a marque with ``marque issue``; returns the file holding it."""
        args: list[Any] = [
            "issue", "--issuer-key", self.issuer_key, "--pilot-id", self.pilot_id,
            "--incarnation", incarnation or self.incarnation, "--target", self.target,
            "--holder-key", self.holder_pub, "--executions", executions, "--max-rows", max_rows,
        ]
        for text in sql:
            args += ["--sql", text]
        for param in params:
            args += ["--param", param]
        if attempts is not None:
            args += ["--attempts", attempts]
        if ttl is not None:
            args += ["--ttl", ttl]
        key = (incarnation or self.incarnation, tuple(sql), tuple(params), executions,
               max_rows, attempts)
        cached = self.token_cache.get(key)
        # A default marque lives 15 minutes; one cached longer than a few could expire in a
        # slow run (a whole suite on a loaded machine), so it is issued anew.
        if ttl is not None or cached is None or time.monotonic() - cached[0] > TOKEN_REUSE_S:
            res = self.run(*args)
            assert res.returncode == 0, res
            token = res.stdout.strip()
            assert token.count(".") == 2 and "\n" not in token, res.stdout
            if ttl is None:  # a short-lived token must never stand in for a default one
                self.token_cache[key] = (time.monotonic(), token)
        else:
            token = cached[1]
        self._issued += 1
        path = self.root / f"marque-{self._issued}.jws"
        path.write_text(token + "\n")
        return path

    def exec_args(self, marque: Path, nonce: str) -> list[Any]:
        return ["exec", "--home", self.home, "--marque", marque, "--key", self.holder_key,
                "--nonce", nonce, "--json"]

    def exec(self, marque: Path, nonce: str, env: dict[str, str] | None = None) -> Result:
        return self.run(*self.exec_args(marque, nonce), env=env)

    def outcome(self, marque_id: str, nonce: str) -> Result:
        return self.run("outcome", "--home", self.home, marque_id, nonce, "--json")

    def reconcile(self) -> Result:
        return self.run("reconcile", "--home", self.home, "--json")

    def stats(self) -> dict[str, Any]:
        res = self.run("ledger", "stats", "--home", self.home, "--json")
        assert res.returncode == 0, res
        return res.json

    # -- direct reads of the ledger and logbook files (the bank's are PilotWorld's) ----

    def ledger_rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.home / "ledger.sqlite3")
        try:
            return conn.execute(sql, tuple(params)).fetchall()
        finally:
            conn.close()

    def ledger_count(self, table: str) -> int:
        [(count,)] = self.ledger_rows(f"SELECT COUNT(*) FROM {table}")
        return count

    def ledger_dump(self) -> list[str]:
        """Every row of every ledger table, for read-only checks."""
        conn = sqlite3.connect(self.home / "ledger.sqlite3")
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    def logbook(self, kind: str) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.home / "logbook.sqlite3")
        try:
            rows = conn.execute("SELECT kind, body FROM logbook WHERE kind = ? ORDER BY seq",
                                (kind,)).fetchall()
        finally:
            conn.close()
        return [{"kind": k, "body": json.loads(b)} for k, b in rows]


class Service(PilotServe):
    """A `marque pilot serve` child process over a world's home (the shared
    :class:`support.harbour.PilotServe`), started at once."""

    def __init__(self, world: World, *, port: int = 0, workers: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.world = world
        super().__init__(world.home, listen=f"127.0.0.1:{port}", env=env, cwd=world.root,
                         workers=workers)
        self.start()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGTERM: an orderly stop) if it runs; its exit status."""
        assert self.proc is not None
        self.signal(sig)
        status = self.proc.wait(timeout=60)
        self._close()
        return status
