"""A soak world: a Pilot home, a target with an effects table, keys, and `pilot serve`.

The effects table has **no** unique key: each execution of an operation's
marque inserts one row tagged with the operation, so a double apply is two
rows, visible to the checker whatever the ledger or the stamps claim.
Every operation gets a marque of its own (``executions`` executions, one
statement ``INSERT INTO effects (op) VALUES (?)``), so rows per operation
must never exceed its budget, and rows per nonce must be 0 or 1.

Marques and proofs are made in process with the library (the same code the
CLI runs); the Pilot runs as a real ``marque pilot serve`` child process
that scenarios SIGKILL, SIGSTOP and restart (the tests' one ``pilot serve``
helper, :class:`support.harbour.PilotServe`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from support.cli import MARQUE as MARQUE  # the scenarios import it from here
from support.cli import cli_env
from support.harbour import DiedAtStart, PilotServe  # noqa: F401 - scenarios import both

from marque.change import Budget, Change, Statement
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk, unverified_claims

TARGET = "t"


#: The environment of a CLI child (the scenarios' name for support.cli's cli_env).
_env = cli_env


@dataclass(frozen=True)
class Op:
    """One operation: its marque, and the tag its effect row carries."""

    op: str
    token: str
    marque_id: str
    executions: int


class SoakWorld:
    """A Pilot home under ``root`` serving target ``t`` (SQLite file, or ``target_dsn``)."""

    pilot_id = "soak"

    def __init__(self, root: Path, *, target_dsn: str | None = None,
                 ledger_dsn: str | None = None, settings: dict[str, Any] | None = None) -> None:
        # Absolute: `pilot serve` runs with the world as its directory (see PilotProcess).
        self.root = root = root.absolute()
        root.mkdir(parents=True, exist_ok=True)
        self.home = root / "pilot"
        self.target_dsn = target_dsn or f"sqlite:///{(root / 'target.db').resolve()}"
        self.dialect = "postgres" if self.target_dsn.startswith("postgresql") else "sqlite"
        self.ledger_dsn = ledger_dsn
        self.issuer = new_key()
        self.holder = new_key()
        self._make_effects_table()
        made = init_home(self.home, self.pilot_id, ledger_dsn)
        self.incarnation: str = made["incarnation"]
        trust_issuer(self.home, public_jwk(self.issuer))
        add_target(self.home, TARGET, self.target_dsn)
        if settings:
            config_path = self.home / "pilot.json"
            config = json.loads(config_path.read_text())
            config.setdefault("settings", {}).update(settings)
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    # -- the target ---------------------------------------------------------------

    def _make_effects_table(self) -> None:
        ddl = "CREATE TABLE effects (op TEXT NOT NULL, at DOUBLE PRECISION)"
        if self.dialect == "sqlite":
            conn = sqlite3.connect(self.target_dsn.removeprefix("sqlite:///"))
            try:
                with conn:
                    conn.execute(ddl)
            finally:
                conn.close()
        else:
            import psycopg

            with psycopg.connect(self.target_dsn, autocommit=True) as conn:
                conn.execute(ddl)

    def effects(self) -> dict[str, int]:
        """Rows in the effects table, by operation."""
        sql = "SELECT op, count(*) FROM effects GROUP BY op"
        if self.dialect == "sqlite":
            conn = sqlite3.connect(self.target_dsn.removeprefix("sqlite:///"))
            try:
                return dict(conn.execute(sql).fetchall())
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.target_dsn, autocommit=True) as conn:
            return {op: int(n) for op, n in conn.execute(sql).fetchall()}

    # -- marques and proofs ------------------------------------------------------

    def op(self, name: str, *, executions: int = 1, attempts: int = 3, ttl_seconds: int = 3600,
           sql: str | None = None, statement_timeout_ms: int | None = None,
           not_before: float | None = None, now: float | None = None) -> Op:
        """A fresh operation: a marque whose statement inserts one effect row tagged ``name``."""
        placeholder = "?" if self.dialect == "sqlite" else "%s"
        statement = sql or f"INSERT INTO effects (op, at) VALUES ({placeholder}, 0)"
        change = Change((Statement(statement, (name,)),),
                        statement_timeout_ms=statement_timeout_ms)
        token = issue_marque(
            self.issuer, pilot_id=self.pilot_id, incarnation=self.incarnation, target=TARGET,
            holder_jwk=public_jwk(self.holder), change=change,
            budget=Budget(executions, 1, attempts), ttl_seconds=ttl_seconds,
            subject="soak", now=now, not_before=not_before)
        claims = unverified_claims(token) or {}
        return Op(name, token, str(claims["jti"]), executions)

    def proof(self, op: Op, nonce: str, *, now: float | None = None) -> str:
        """A fresh proof of possession for ``nonce`` (each post needs its own)."""
        return make_proof(self.holder, op.token, nonce=nonce, pilot_id=self.pilot_id, now=now)


class PilotProcess(PilotServe):
    """``marque pilot serve`` over a world's home, started at once: on a free loopback
    port, or on ``port`` (a joined Pilot's URL is known up front); its log in the world."""

    def __init__(self, world: SoakWorld, *, env: dict[str, str] | None = None,
                 workers: int | None = None, port: int = 0) -> None:
        self.world = world
        super().__init__(world.home, listen=f"127.0.0.1:{port}", env=env, cwd=world.root,
                         workers=workers,
                         log=world.root / f"pilot-serve-{time.monotonic_ns()}.log")
        self.start()


@dataclass
class Answer:
    """What a client was told: Jepsen's ``ok`` / ``fail`` / ``info``, and the details."""

    type: str
    status: str | None = None
    code: str | None = None
    attempt: int | None = None
    recorded: bool | None = None
    replayed: bool | None = None
    events: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"status": self.status, "code": self.code, "attempt": self.attempt,
                "recorded": self.recorded, "replayed": self.replayed,
                "events": list(self.events)}


#: Outcome statuses as Jepsen answer types: unknown is never a failure.
_TYPES = {"applied": "ok", "aborted_not_applied": "fail", "indeterminate": "info",
          "in_progress": "info"}


def post_execution(url: str, world: SoakWorld, op: Op, nonce: str, *,
                   timeout: float = 30.0, proof: str | None = None) -> Answer:
    """POST one execution and read its stream to the end, whatever happens on the way."""
    body = {"marque": op.token, "nonce": nonce, "proof": proof or world.proof(op, nonce)}
    events: list[str] = []
    try:
        with httpx.stream("POST", f"{url}/v1/executions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                try:
                    code = r.json().get("code")
                except ValueError:
                    code = None
                # A refusal or an unavailable ledger: nothing was sent to a target. (A
                # claim whose connection was lost may be recorded, `in_progress`, but it
                # never runs: reconciliation ends it aborted_not_applied.)
                return Answer("fail", status="refused", code=code)
            for line in r.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("event")
                if kind == "outcome":
                    outcome = event["outcome"]
                    status = outcome["status"]
                    return Answer(_TYPES.get(status, "info"), status=status,
                                  code=(outcome.get("error") or {}).get("code"),
                                  attempt=outcome.get("attempt"),
                                  recorded=outcome.get("recorded"),
                                  replayed=outcome.get("replayed"), events=tuple(events))
                if kind == "error":
                    return Answer("info", status="error",
                                  code=(event.get("error") or {}).get("code"),
                                  events=tuple(events))
                events.append(str(kind))
    except (httpx.TransportError, ValueError) as exc:
        return Answer("info", status="lost", code=type(exc).__name__, events=tuple(events))
    return Answer("info", status="lost", code="stream_ended", events=tuple(events))
