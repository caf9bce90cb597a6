"""One Pilot world: the parts the end-to-end and PostgreSQL tiers' worlds share.

Its :class:`Bank` readers also serve the in-process worlds (``tests/integration``'s
``Env``, :mod:`support.effects_world`), so every tier reads a target's stamps one way.

A world is a folder (``root``) holding an issuer's and a holder's Ed25519 keys,
a Pilot home that trusts the issuer, and a target named ``bank`` whose
``accounts (id, balance)`` rows start at 100. Its marques get one set of
defaults (those of ``marque issue``), and the bank is read back — balances and
Marque's stamps — directly, through a :class:`Bank` reader of the target's kind.

How a world is made is its tier's own, on purpose:

* ``tests/e2e`` (``e2e_support.World``) makes keys, home and target through the
  real ``marque`` CLI and issues with ``marque issue``, over SQLite files;
* ``tests/pg`` (``pg.pgworld.World``) makes them with the Python API
  (:func:`make_keys`, ``init_home`` …) and signs with
  ``issue_marque``, over a real PostgreSQL target.

Nothing here is mocked. The PostgreSQL driver is imported only when a
:class:`PostgresBank` reads, so the SQLite tiers never need it.
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from marque.token import new_key, public_jwk, unverified_claims

#: The target every world's Pilot knows.
TARGET = "bank"
#: What a marque may spend and how long it lives unless a test says otherwise: the
#: defaults of `marque issue` (one execution, one row, three attempts, fifteen minutes).
EXECUTIONS = 1
MAX_ROWS = 1
ATTEMPTS = 3
TTL_SECONDS = 900
#: Where a world's keys live under its root, as the CLI reads them (`--issuer-key`,
#: `--key`, `pilot trust`): each one's private JWK, and its public half.
KEY_FILES = {"issuer": ("issuer.jwk", "issuer.pub.jwk"),
             "holder": ("holder.jwk", "holder.pub.jwk")}
#: Every account's balance in a fresh bank.
OPENING_BALANCE = 100
#: The ``marque.stamps`` columns a PostgreSQL bank's :meth:`~Bank.stamps` returns.
STAMP_COLUMNS = ("marque_id", "nonce", "attempt", "kind", "pilot_id", "incarnation",
                 "rows_affected")


def make_keys(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """New (issuer, holder) Ed25519 keys made in-process, each written to its
    :data:`KEY_FILES` under ``root``."""
    made = []
    for who in ("issuer", "holder"):
        jwk = new_key()
        private, public = KEY_FILES[who]
        (root / private).write_text(json.dumps(jwk))
        (root / public).write_text(json.dumps(public_jwk(jwk)))
        made.append(jwk)
    return made[0], made[1]


def claims_of(marque: str | Path) -> dict[str, Any]:
    """The claims of a marque — a compact JWS, or a file holding one — read without
    verifying it (tests only)."""
    token = marque.read_text() if isinstance(marque, Path) else marque
    claims = unverified_claims(token)
    assert claims is not None, f"{marque} holds no compact JWS"
    return claims


def marque_id_of(marque: str | Path) -> str:
    """The ``jti`` (marque id) of a marque or a marque file."""
    return str(claims_of(marque)["jti"])


# -- the bank, read directly ----------------------------------------------------------


class Bank(ABC):
    """A target's ``accounts`` table and the stamps Marque keeps beside it, reached
    directly (never through a Pilot), for setting up and checking a test."""

    @abstractmethod
    def create(self, ids: Sequence[int]) -> None:
        """Create ``accounts`` with one row of :data:`OPENING_BALANCE` per id."""

    @abstractmethod
    def balances(self) -> dict[int, int]:
        """``{account id: balance}``."""

    @abstractmethod
    def stamps(self, marque_id: str | None = None) -> list[dict[str, Any]]:
        """The stamp rows (all, or one marque's); none before the first execution."""

    @abstractmethod
    def row_stamps(self) -> list[dict[str, Any]]:
        """Every column of every Effect Set row stamp, oldest first; none before the
        first Effect Set row is applied."""


def bank_at(dsn: str) -> Bank:
    """The reader of the target behind a Pilot's target DSN (``sqlite:///PATH`` or a
    PostgreSQL DSN)."""
    if dsn.startswith("sqlite:///"):
        return SqliteBank(Path(dsn.removeprefix("sqlite:///")))
    return PostgresBank(dsn)


@dataclass(frozen=True)
class SqliteBank(Bank):
    """A bank in a SQLite file; its stamps are the ``marque_stamps`` table."""

    path: Path

    def create(self, ids: Sequence[int]) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.executemany("INSERT INTO accounts VALUES (?, ?)",
                             [(i, OPENING_BALANCE) for i in ids])
        conn.close()

    def balances(self) -> dict[int, int]:
        conn = sqlite3.connect(self.path)
        try:
            return dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id"))
        finally:
            conn.close()

    def _rows(self, table: str, tail: str, params: tuple[Any, ...] = ()
              ) -> list[dict[str, Any]]:
        """Every column of ``table``'s rows (``tail``: their WHERE and ORDER BY); none
        before the table exists."""
        conn = sqlite3.connect(self.path)
        conn.row_factory = sqlite3.Row
        try:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                                (table,)).fetchone():
                return []
            return [dict(r) for r in conn.execute(f"SELECT * FROM {table} {tail}", params)]
        finally:
            conn.close()

    def stamps(self, marque_id: str | None = None) -> list[dict[str, Any]]:
        """Every column of ``marque_stamps``, ordered by (marque_id, nonce)."""
        if marque_id is None:
            return self._rows("marque_stamps", "ORDER BY marque_id, nonce")
        return self._rows("marque_stamps", "WHERE marque_id = ? ORDER BY marque_id, nonce",
                          (marque_id,))

    def row_stamps(self) -> list[dict[str, Any]]:
        """Every column of ``marque_row_stamps``, ordered by created_at."""
        return self._rows("marque_row_stamps", "ORDER BY created_at")


@dataclass(frozen=True)
class PostgresBank(Bank):
    """A bank in a PostgreSQL database; its stamps are the ``marque.stamps`` table."""

    dsn: str

    def _connect(self) -> Any:
        import psycopg  # here, so a world over SQLite never needs the driver

        return psycopg.connect(self.dsn, autocommit=True)

    def create(self, ids: Sequence[int]) -> None:
        with self._connect() as conn:
            conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
            conn.cursor().executemany("INSERT INTO accounts VALUES (%s, %s)",
                                      [(i, OPENING_BALANCE) for i in ids])

    def balances(self) -> dict[int, int]:
        with self._connect() as conn:
            rows = conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
        return {r[0]: r[1] for r in rows}

    def stamps(self, marque_id: str | None = None) -> list[dict[str, Any]]:
        """The :data:`STAMP_COLUMNS` of ``marque.stamps``, oldest first."""
        with self._connect() as conn:
            exists = conn.execute("SELECT to_regclass('marque.stamps')").fetchone()
            if not exists or exists[0] is None:
                return []
            sql = f"SELECT {', '.join(STAMP_COLUMNS)} FROM marque.stamps"
            params: tuple[Any, ...] = ()
            if marque_id is not None:
                sql += " WHERE marque_id = %s"
                params = (marque_id,)
            rows = conn.execute(sql + " ORDER BY created_at", params).fetchall()
        return [dict(zip(STAMP_COLUMNS, r, strict=True)) for r in rows]

    def row_stamps(self) -> list[dict[str, Any]]:
        """Every column of ``marque.row_stamps``, ordered by created_at."""
        with self._connect() as conn:
            exists = conn.execute("SELECT to_regclass('marque.row_stamps')").fetchone()
            if not exists or exists[0] is None:
                return []
            cur = conn.execute("SELECT * FROM marque.row_stamps ORDER BY created_at")
            names = [column.name for column in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# -- the world ------------------------------------------------------------------------


class PilotWorld(ABC):
    """A Pilot home trusting an issuer, a target ``bank``, and issuer and holder keys,
    all under ``root``. A tier's world says how they are made, and which :class:`Bank`
    reads its target (:meth:`bank_reader`)."""

    #: The Pilot's id (a tier's own).
    pilot_id: ClassVar[str]
    target: ClassVar[str] = TARGET

    root: Path
    home: Path
    incarnation: str

    marque_id = staticmethod(marque_id_of)

    # -- keys (see KEY_FILES) -------------------------------------------------------

    @property
    def issuer_key(self) -> Path:
        return self.root / KEY_FILES["issuer"][0]

    @property
    def issuer_pub(self) -> Path:
        return self.root / KEY_FILES["issuer"][1]

    @property
    def holder_key(self) -> Path:
        return self.root / KEY_FILES["holder"][0]

    @property
    def holder_pub(self) -> Path:
        return self.root / KEY_FILES["holder"][1]

    # -- the bank ---------------------------------------------------------------------

    @abstractmethod
    def bank_reader(self) -> Bank:
        """The reader of this world's target."""

    def balances(self) -> dict[int, int]:
        """``{account id: balance}`` of the bank, read directly."""
        return self.bank_reader().balances()

    def stamps(self, marque_id: str | None = None) -> list[dict[str, Any]]:
        """The bank's stamp rows (all, or one marque's), read directly."""
        return self.bank_reader().stamps(marque_id)
