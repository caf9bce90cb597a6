"""Fixtures for in-process Pilot tests: a real Pilot home over a real SQLite bank.

Nothing here is mocked: the Pilot is wired by :func:`open_pilot` from a home
made by ``init_home`` / ``trust_issuer`` / ``add_target``; marques and proofs
are signed with real Ed25519 keys; the target is a SQLite file made and read back
by the shared :class:`support.world.SqliteBank`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.world import SqliteBank

from marque.outcome import Outcome
from marque.pilot import Pilot, open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.target.stamps import migrate_sqlite
from marque.token import (
    Budget,
    Change,
    Guard,
    Statement,
    issue_marque,
    make_proof,
    new_key,
    public_jwk,
    unverified_claims,
)

PILOT_ID = "pilot-1"


def marque_id_of(token: str) -> str:
    """The ``jti`` of a compact marque, read without verifying it."""
    claims = unverified_claims(token)
    assert claims is not None, "not a compact JWS"
    return str(claims["jti"])


@dataclass
class Env:
    """A Pilot home in a temporary directory, with helpers to issue, run and look."""

    home: Path
    bank_path: Path
    issuer: dict[str, Any]
    holder: dict[str, Any]
    pilot: Pilot
    events: list[dict[str, Any]] = field(default_factory=list)

    # -- marques and proofs ---------------------------------------------------

    def issue(
        self,
        change_sql_list: Sequence[str],
        executions: int = 1,
        max_rows: int = 1,
        attempts: int = 3,
        ttl: int = 600,
        params: Sequence[Sequence[Any]] | None = None,
        guards: Sequence[Guard] = (),
        pilot_id: str | None = None,
        incarnation: str | None = None,
        target: str = "bank",
        now: float | None = None,
        not_before: float | None = None,
        issuer: dict[str, Any] | None = None,
        holder: dict[str, Any] | None = None,
        statement_timeout_ms: int | None = None,
    ) -> str:
        """A marque for ``change_sql_list`` (``params`` parallel to it), signed by the issuer."""
        params = params or [()] * len(change_sql_list)
        change = Change(
            tuple(Statement(sql, tuple(p)) for sql, p in zip(change_sql_list, params, strict=True)),
            tuple(guards),
            statement_timeout_ms=statement_timeout_ms,
        )
        return issue_marque(
            issuer or self.issuer,
            pilot_id=pilot_id or self.pilot.pilot_id,
            incarnation=incarnation or self.pilot.incarnation,
            target=target,
            holder_jwk=public_jwk(holder or self.holder),
            change=change,
            budget=Budget(executions, max_rows, attempts),
            ttl_seconds=ttl,
            now=now,
            not_before=not_before,
        )

    def proof(self, token: str, nonce: str, holder: dict[str, Any] | None = None) -> str:
        """A fresh proof of possession for ``token`` and ``nonce``."""
        return make_proof(holder or self.holder, token, nonce=nonce, pilot_id=self.pilot.pilot_id)

    def run(self, token: str, nonce: str, holder: dict[str, Any] | None = None) -> Outcome:
        """Execute ``token`` for ``nonce`` with a fresh proof; events land in ``self.events``."""
        proof = self.proof(token, nonce, holder)
        return self.pilot.execute(token, proof, nonce, on_event=self.events.append)

    # -- the target, read directly ----------------------------------------------

    def _bank(self) -> sqlite3.Connection:
        return sqlite3.connect(self.bank_path, isolation_level=None)

    def bank_reader(self) -> SqliteBank:
        """The shared reader of bank.db (:class:`support.world.SqliteBank`)."""
        return SqliteBank(self.bank_path)

    def balances(self) -> dict[int, int]:
        """``{id: balance}`` straight from bank.db."""
        return self.bank_reader().balances()

    def set_balance(self, account: int, balance: int) -> None:
        """Change a balance behind the Pilot's back."""
        conn = self._bank()
        try:
            conn.execute("UPDATE accounts SET balance = ? WHERE id = ?", (balance, account))
        finally:
            conn.close()

    def stamps(self) -> list[dict[str, Any]]:
        """Every row of ``marque_stamps`` (empty if the table does not exist yet), ordered by
        (marque_id, nonce)."""
        return self.bank_reader().stamps()

    def plant_stamp(
        self, marque_id: str, nonce: str, *, kind: str, attempt: int = 1,
        rows_affected: int | None = None, incarnation: str | None = None,
    ) -> None:
        """Insert a stamp into bank.db by hand, as if an earlier run had left it."""
        conn = self._bank()
        try:
            conn.execute("BEGIN IMMEDIATE")
            migrate_sqlite(conn, "bank")  # the Pilot's own stamp table, at its current version
            conn.execute(
                "INSERT INTO marque_stamps (marque_id, nonce, attempt, kind, pilot_id, "
                "incarnation, rows_affected, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (marque_id, nonce, attempt, kind, self.pilot.pilot_id,
                 incarnation or self.pilot.incarnation, rows_affected, time.time()),
            )
            conn.execute("COMMIT")
        finally:
            conn.close()

    # -- lifecycle ------------------------------------------------------------------

    def reopen(self) -> Pilot:
        """Close the Pilot and open it again from its home (start-up recovery included)."""
        self.pilot.close()
        self.pilot = open_pilot(self.home)
        return self.pilot

    def close(self) -> None:
        self.pilot.close()


def make_bank(path: Path) -> None:
    """bank.db with accounts 1, 2 and 3 holding 100 each."""
    SqliteBank(path).create([1, 2, 3])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    """A fresh Pilot home with one SQLite target ``bank`` and a trusted issuer."""
    bank_path = tmp_path / "bank.db"
    make_bank(bank_path)
    home = tmp_path / "home"
    issuer = new_key()
    holder = new_key()
    init_home(home, PILOT_ID)
    trust_issuer(home, public_jwk(issuer))
    add_target(home, "bank", "sqlite:///" + str(bank_path))
    environment = Env(home, bank_path, issuer, holder, open_pilot(home))
    try:
        yield environment
    finally:
        environment.close()


@pytest.fixture
def pilot(env: Env) -> Pilot:
    """The Pilot of ``env``."""
    return env.pilot


@pytest.fixture
def issue(env: Env) -> Any:
    """``issue(change_sql_list, ...)`` → a signed marque for ``env``'s Pilot."""
    return env.issue


@pytest.fixture
def run(env: Env) -> Any:
    """``run(token, nonce, holder=None)`` → the Outcome of executing through ``env``'s Pilot."""
    return env.run
