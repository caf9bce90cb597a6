"""A Pilot world over a real PostgreSQL target, and helpers the pg tests share.

Nothing is mocked: the target is a real PostgreSQL database read back with
psycopg; the Pilot is wired by ``open_pilot`` from a home made by
``init_home`` / ``trust_issuer`` / ``add_target``; marques and proofs are
signed with real Ed25519 keys. The ledger is the home's default SQLite file or
a second, fresh PostgreSQL database.

CLI subprocesses run in :func:`support.cli.cli_env`'s environment (``cli_env``,
``one_json`` and ``MARQUE`` are re-exported here).

This module is importable from spawned worker processes (``pg.pgworld``), so
it holds no pytest fixtures.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from support import cli
from support.cli import MARQUE, Result, cli_env
from support.cli import one_json as one_json  # the tests import it from here
from support.world import (
    ATTEMPTS,
    EXECUTIONS,
    MAX_ROWS,
    TARGET,
    TTL_SECONDS,
    PilotWorld,
    PostgresBank,
    make_keys,
)
from support.world import STAMP_COLUMNS as STAMP_COLUMNS  # the tests import them from here
from support.world import marque_id_of as marque_id_of

from marque.errors import MarqueError
from marque.outcome import Outcome
from marque.pilot import Pilot, open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import (
    Budget,
    Change,
    Guard,
    Statement,
    issue_marque,
    make_proof,
    public_jwk,
)

PILOT_ID = "pg-pilot"
LATTICE = {"in_progress", "indeterminate", "aborted_not_applied", "applied"}


def make_accounts(dsn: str) -> None:
    """``accounts(id int primary key, balance int)`` with (1,100), (2,100), (3,100)."""
    PostgresBank(dsn).create([1, 2, 3])


def run_outcome(pilot: Pilot, holder: dict[str, Any], token: str, nonce: str,
                on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Execute with a fresh proof; the outcome dict, or ``{status: refused, error}``."""
    proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot.pilot_id)
    try:
        return pilot.execute(token, proof, nonce, on_event=on_event).to_dict()
    except MarqueError as exc:
        return {"status": "refused", "nonce": nonce, "error": exc.to_dict()}


@dataclass
class World(PilotWorld):
    """A Pilot home, a PostgreSQL target ``bank`` and issuer/holder keys, made with the
    Python API (the shared :class:`support.world.PilotWorld`)."""

    pilot_id = PILOT_ID

    root: Path
    target_dsn: str  # the target, direct (for reading back); the Pilot may go via a proxy
    ledger: str  # "sqlite" or "postgres"
    issuer: dict[str, Any]
    holder: dict[str, Any]
    incarnation: str
    _pilot: Pilot | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    # -- the Pilot ---------------------------------------------------------------

    @property
    def pilot(self) -> Pilot:
        """The world's in-process Pilot, opened (with start-up recovery) on first use."""
        if self._pilot is None:
            self._pilot = open_pilot(self.home)
        return self._pilot

    def open_pilot(self, *, recover: bool = True) -> Pilot:
        """(Re)open the world's Pilot from its home."""
        self.close_pilot()
        self._pilot = open_pilot(self.home, recover=recover)
        return self._pilot

    def close_pilot(self) -> None:
        if self._pilot is not None:
            self._pilot.close()
            self._pilot = None

    # -- marques -----------------------------------------------------------------

    def issue(
        self,
        *statements: str | Statement,
        executions: int = EXECUTIONS,
        max_rows: int = MAX_ROWS,
        attempts: int = ATTEMPTS,
        isolation: str = "read_committed",
        statement_timeout_ms: int | None = None,
        guards: tuple[Guard, ...] = (),
    ) -> str:
        """A marque for ``statements`` on ``bank``, bound to the holder key."""
        change = Change(
            tuple(s if isinstance(s, Statement) else Statement(s) for s in statements),
            guards=guards,
            isolation=isolation,
            statement_timeout_ms=statement_timeout_ms,
        )
        return issue_marque(
            self.issuer, pilot_id=self.pilot_id, incarnation=self.incarnation,
            target=self.target, holder_jwk=public_jwk(self.holder), change=change,
            budget=Budget(executions, max_rows, attempts), ttl_seconds=TTL_SECONDS,
        )

    def execute(self, token: str, nonce: str,
                on_event: Callable[[dict[str, Any]], None] | None = None,
                pilot: Pilot | None = None) -> Outcome:
        """Execute through the Pilot with a fresh proof of possession."""
        pilot = pilot or self.pilot
        proof = make_proof(self.holder, token, nonce=nonce, pilot_id=PILOT_ID)
        sink = on_event or self.events.append
        return pilot.execute(token, proof, nonce, on_event=sink)

    # -- files for the CLI --------------------------------------------------------

    def holder_file(self) -> Path:
        """The holder's private key file (written with the world's keys)."""
        return self.holder_key

    def marque_file(self, token: str) -> Path:
        path = self.root / f"{marque_id_of(token)}.marque"
        path.write_text(token + "\n")
        return path

    # -- the target, read directly (balances and stamps are PilotWorld's) --------------

    def bank_reader(self) -> PostgresBank:
        return PostgresBank(self.target_dsn)

    def close(self) -> None:
        self.close_pilot()


def build_world(root: Path, target_dsn: str, *, ledger: str = "sqlite",
                ledger_dsn: str | None = None, pilot_target_dsn: str | None = None,
                accounts: bool = True) -> World:
    """A fresh world: accounts in ``target_dsn``, a Pilot home whose target ``bank``
    is ``pilot_target_dsn`` (default: the target itself)."""
    if accounts:
        make_accounts(target_dsn)
    root.mkdir(parents=True, exist_ok=True)
    issuer, holder = make_keys(root)
    ident = init_home(root / "home", PILOT_ID, ledger_dsn)
    trust_issuer(root / "home", public_jwk(issuer))
    add_target(root / "home", TARGET, pilot_target_dsn or target_dsn)
    return World(root, target_dsn, ledger, issuer, holder, ident["incarnation"])


# -- the real CLI ------------------------------------------------------------------


#: The pg tier gives a CLI call 120 s, not support.cli's 30: its runs may meet a
#: PostgreSQL server a fault test stalls or cuts (kept as it was).
PG_TIMEOUT = 120.0


def run_cli(*args: Any, env: dict[str, str] | None = None,
            timeout: float = PG_TIMEOUT) -> Result:
    """:func:`support.cli.run_cli`, with :data:`PG_TIMEOUT` as its default timeout."""
    return cli.run_cli(*args, env=env, timeout=timeout)


class StreamingCli:
    """A ``marque`` subprocess whose stderr JSON events are read as they arrive."""

    def __init__(self, *args: Any, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(MARQUE), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, env=cli_env(env),
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self.events.put(event)
        self.events.put(None)

    def wait_for(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind!r} event; saw {[e['event'] for e in self.seen]}"
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            assert event is not None, (
                f"process ended before {kind!r}; saw {[e['event'] for e in self.seen]}"
            )
            self.seen.append(event)
            if event.get("event") == kind:
                return event

    def drain(self, timeout: float = 30) -> list[str]:
        """After the process ended: every event kind it wrote, in order."""
        while True:
            event = self.events.get(timeout=timeout)
            if event is None:
                return [e["event"] for e in self.seen]
            self.seen.append(event)


# -- waiting on the server, bounded ------------------------------------------------


def backends_waiting_on_lock(dsn: str, like: str) -> int:
    """How many other backends run a query matching ``like`` and wait on a lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            (like,),
        ).fetchone()
    return int(row[0]) if row else 0


def backends_running(dsn: str, like: str) -> int:
    """How many other backends are active on a query matching ``like``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND state = 'active' AND query LIKE %s",
            (like,),
        ).fetchone()
    return int(row[0]) if row else 0


def outcomes_summary(outcomes: Sequence[dict[str, Any]]) -> dict[str, int]:
    """``{status or error code: count}`` for a batch of outcome dicts."""
    summary: dict[str, int] = {}
    for o in outcomes:
        key = o["status"] if o["status"] != "refused" else o["error"]["code"]
        summary[key] = summary.get(key, 0) + 1
    return summary


# -- a separate Pilot process (multiprocessing "spawn" target) --------------------------


def process_worker(home: str, holder: dict[str, Any], token: str, nonces: list[str],
                   start: Any, results: Any) -> None:
    """One Pilot process: open the Pilot from ``home``, then run ``nonces`` on threads
    released together (after every process is ready); put the outcome dicts on
    ``results``."""
    outcomes: list[dict[str, Any]] = []
    try:
        pilot = open_pilot(home)
        try:
            gate = threading.Barrier(len(nonces))
            slots: list[dict[str, Any] | None] = [None] * len(nonces)

            def one(index: int) -> None:
                gate.wait(timeout=60)
                try:
                    slots[index] = run_outcome(pilot, holder, token, nonces[index])
                except Exception as exc:  # surfaced to the test as a failure
                    slots[index] = {"status": "crashed", "error": repr(exc)}

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(nonces))]
            start.wait(timeout=120)
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            outcomes = [s or {"status": "crashed", "error": "thread did not finish"}
                        for s in slots]
        finally:
            pilot.close()
    except Exception as exc:
        outcomes.append({"status": "crashed", "error": repr(exc)})
    results.put((os.getpid(), outcomes))
