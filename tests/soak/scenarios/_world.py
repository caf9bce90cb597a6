"""A small real Pilot world for the token, proof and durability rows (12, 13, 14, 16).

:class:`TokenWorld` is a Pilot home made in-process through the product's own
setup functions (``init_home``, ``trust_issuer``, ``add_target``) with a SQLite
``bank`` target and real Ed25519 keys: a trusted issuer, the holder a marque
is bound to, and an attacker nobody trusts. It issues real marques, preview
and query tokens and proofs, opens real Pilots on the home, serves it as a
real ``marque pilot serve`` process, and reads the ledger and the bank
directly (plain sqlite3) to prove that a refusal claimed, stamped and spent
nothing. Nothing here is a mock.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from support.cli import MARQUE as MARQUE  # the scenarios import it from here
from support.harbour import PilotServe

from marque.change import Budget, Change, Statement
from marque.pilot import Pilot, open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk
from marque.token.service_tokens import PreviewGrant, issue_preview_token, issue_query_token

PILOT_ID = "p1"
TARGET = "bank"
DEBIT = "UPDATE accounts SET balance = balance - 1 WHERE id = 1"


class TokenWorld:
    """A Pilot home ``root/pilot`` serving ``bank`` (accounts 1, 2 at 100); one trusted issuer."""

    def __init__(self, root: Path, *, ledger_dsn: str | None = None,
                 pilot_id: str = PILOT_ID) -> None:
        # Absolute: the Pilot it serves runs with the world as its directory.
        self.root = root = root.absolute()
        self.home = root / "pilot"
        self.bank = root / "bank.db"
        self.pilot_id = pilot_id
        root.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(self.bank) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
        conn.close()
        self.issuer = new_key()
        self.holder = new_key()
        self.attacker = new_key()
        self.incarnation: str = init_home(self.home, pilot_id, ledger_dsn)["incarnation"]
        self.kid = trust_issuer(self.home, public_jwk(self.issuer))
        add_target(self.home, TARGET, f"sqlite:///{self.bank.resolve()}")
        self.ledger_dsn = ledger_dsn

    # -- tokens -----------------------------------------------------------------------

    @staticmethod
    def change(sql: str = DEBIT) -> Change:
        return Change(statements=(Statement(sql),))

    def marque(self, *, executions: int = 1000, max_rows: int = 1, ttl_seconds: int = 3600,
               holder: dict[str, Any] | None = None, pilot_id: str | None = None,
               attempts: int = 1, now: float | None = None) -> str:
        """A real marque from the trusted issuer, bound to ``holder`` (the world's by default)."""
        return issue_marque(
            self.issuer, pilot_id=pilot_id or self.pilot_id, incarnation=self.incarnation,
            target=TARGET, holder_jwk=public_jwk(holder or self.holder), change=self.change(),
            budget=Budget(executions, max_rows, attempts), ttl_seconds=ttl_seconds, now=now)

    def preview(self, **kwargs: Any) -> str:
        """A real preview token from the trusted issuer for this Pilot."""
        return issue_preview_token(self.issuer, PreviewGrant(
            pilot_id=self.pilot_id, incarnation=self.incarnation, target=TARGET,
            change=self.change()), **kwargs)

    def query(self, marque_id: str, **kwargs: Any) -> str:
        """A real query token from the trusted issuer for ``marque_id`` on this Pilot."""
        return issue_query_token(self.issuer, pilot_id=self.pilot_id, marque_id=marque_id,
                                 **kwargs)

    def proof(self, token: str, nonce: str, **kwargs: Any) -> str:
        """A real proof of possession by the world's holder (``kwargs`` as ``make_proof``)."""
        kwargs.setdefault("pilot_id", self.pilot_id)
        key = kwargs.pop("key", self.holder)
        return make_proof(key, token, nonce=nonce, **kwargs)

    # -- the Pilot ----------------------------------------------------------------------

    def open(self) -> Pilot:
        """A Pilot opened on the home, as every command opens it."""
        return open_pilot(self.home)

    def serve(self) -> PilotServer:
        """``marque pilot serve`` on a free loopback port."""
        return PilotServer(self.home, cwd=self.root)

    # -- direct reads -----------------------------------------------------------------------

    def ledger_counts(self) -> dict[str, int]:
        """Rows of a SQLite ledger's claim, budget, attempt and proof-jti tables, read directly."""
        conn = sqlite3.connect(self.home / "ledger.sqlite3")
        try:
            return {table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                    for table in ("claims", "budgets", "attempts", "pop_jtis")}
        finally:
            conn.close()

    def budget_left(self, marque_id: str) -> int | None:
        """The marque's remaining executions (None: never seen by the ledger)."""
        conn = sqlite3.connect(self.home / "ledger.sqlite3")
        try:
            row = conn.execute("SELECT executions_left FROM budgets WHERE marque_id = ?",
                               (marque_id,)).fetchone()
        finally:
            conn.close()
        return None if row is None else int(row[0])

    def stamps(self) -> int:
        conn = sqlite3.connect(self.bank)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'marque_stamps'").fetchone()
            return 0 if found is None else conn.execute(
                "SELECT COUNT(*) FROM marque_stamps").fetchone()[0]
        finally:
            conn.close()

    def balance(self) -> int:
        conn = sqlite3.connect(self.bank)
        try:
            return int(conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()[0])
        finally:
            conn.close()


class PilotServer(PilotServe):
    """A ``marque pilot serve`` child process on a free loopback port, started at once."""

    def __init__(self, home: Path, *, cwd: Path) -> None:
        super().__init__(home, cwd=cwd)
        self.start()
