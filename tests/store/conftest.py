"""Fixtures for the ledger behaviour suite: one suite, every ledger engine.

Each engine is a :class:`LedgerEngine` in ``LEDGER_ENGINES``; the ``engine`` and
``ledger`` fixtures are parametrised over that list, so every test in
``tests/store`` runs once per engine: SQLite files, and PostgreSQL databases on
the server the test run starts (``pg_admin_dsn``).

``location`` hands out a fresh, never-used place for a ledger (a file path for
SQLite; a DSN with its own schema or database for PostgreSQL), ``create`` and
``open`` are the engine's lifecycle entry points, ``open_second`` opens an
independent handle on a live ledger (what a second Pilot process would hold;
``None`` skips the cross-handle race test) and ``destroy`` drops whatever a
location left behind once its ledgers are closed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from marque.ledger.base import ClaimTicket, Ledger
from marque.ledger.sqlite import SqliteLedger


@dataclass(frozen=True)
class LedgerEngine:
    """How to make, reopen and dispose of ledgers on one storage engine."""

    name: str
    location: Callable[[Path], str]
    create: Callable[[str, str], Ledger]
    open: Callable[[str], Ledger]
    open_second: Callable[[str], Ledger] | None = None
    destroy: Callable[[str], None] | None = None


def _sqlite_location(workdir: Path) -> str:
    # A new file name each call, so one test may hold several distinct ledgers.
    return str(workdir / f"ledger-{uuid.uuid4().hex[:12]}.sqlite3")


SQLITE = LedgerEngine(
    name="sqlite",
    location=_sqlite_location,
    create=SqliteLedger.create,
    open=SqliteLedger.open,
    # A second SqliteLedger on the same file has its own connection, exactly
    # what another Pilot process would have.
    open_second=SqliteLedger.open,
)

LEDGER_ENGINES: list[LedgerEngine] = [SQLITE]
ENGINE_NAMES = ["sqlite", "postgres"]


def postgres_engine(admin_dsn: str) -> LedgerEngine:
    """PostgreSQL ledgers, each in a fresh database on the test run's server."""
    from support.pgcluster import create_database, drop_database

    from marque.ledger.postgres import PostgresLedger

    names: dict[str, str] = {}

    def location(_: Path) -> str:
        name, dsn = create_database(admin_dsn)
        names[dsn] = name
        return dsn

    def destroy(dsn: str) -> None:
        if dsn in names:
            drop_database(admin_dsn, names.pop(dsn))

    return LedgerEngine(
        name="postgres",
        location=location,
        create=PostgresLedger.create,
        open=PostgresLedger.open,
        open_second=PostgresLedger.open,
        destroy=destroy,
    )

PILOT_ID = "pilot-test"


class LedgerPool:
    """Ledgers a test opened; all closed (and their locations destroyed) at teardown."""

    def __init__(self, engine: LedgerEngine, workdir: Path) -> None:
        self.engine = engine
        self.workdir = workdir
        self._ledgers: list[Ledger] = []
        self._locations: list[str] = []

    def location(self) -> str:
        """A fresh location that holds no ledger yet."""
        location = self.engine.location(self.workdir)
        self._locations.append(location)
        return location

    def track(self, ledger: Ledger) -> Ledger:
        self._ledgers.append(ledger)
        return ledger

    def create(self, location: str | None = None, pilot_id: str = PILOT_ID) -> Ledger:
        return self.track(self.engine.create(location or self.location(), pilot_id))

    def open(self, location: str) -> Ledger:
        return self.track(self.engine.open(location))

    def open_second(self, location: str) -> Ledger:
        if self.engine.open_second is None:
            pytest.skip(f"engine {self.engine.name} cannot open a second handle")
        return self.track(self.engine.open_second(location))

    def close_all(self) -> None:
        for ledger in reversed(self._ledgers):
            try:
                ledger.close()
            except Exception:  # noqa: BLE001 - teardown must close every ledger
                pass
        self._ledgers.clear()
        if self.engine.destroy is not None:
            for location in self._locations:
                self.engine.destroy(location)
        self._locations.clear()


def make_ticket(
    marque_id: str = "mq_test",
    nonce: str = "nonce-1",
    *,
    target: str = "bank",
    executions: int = 3,
    max_rows: int = 10,
    attempts_per_nonce: int = 3,
    expires_at: float | None = None,
    owner_process: str = "proc_test",
    lease_seconds: float = 60,
    now: float | None = None,
    pop_jti: str | None = None,
) -> ClaimTicket:
    """A claim ticket with test defaults; the marque expires ten minutes after ``now``."""
    now = time.time() if now is None else now
    return ClaimTicket(
        marque_id=marque_id,
        nonce=nonce,
        target=target,
        executions=executions,
        max_rows=max_rows,
        attempts_per_nonce=attempts_per_nonce,
        expires_at=now + 600 if expires_at is None else expires_at,
        owner_process=owner_process,
        lease_seconds=lease_seconds,
        now=now,
        pop_jti=pop_jti,
        pop_forget_after=now + 300,
    )


@pytest.fixture(scope="session", params=ENGINE_NAMES)
def engine(request: pytest.FixtureRequest) -> LedgerEngine:
    """The ledger engine under test (session-scoped so hypothesis tests may use it)."""
    if request.param == "postgres":
        return postgres_engine(request.getfixturevalue("pg_admin_dsn"))
    return SQLITE


@pytest.fixture(scope="session")
def ticket() -> Callable[..., ClaimTicket]:
    """The :func:`make_ticket` builder."""
    return make_ticket


@pytest.fixture
def pool(engine: LedgerEngine, tmp_path: Path) -> Iterator[LedgerPool]:
    """Creates and opens ledgers on the engine under test; closes them at teardown."""
    pool = LedgerPool(engine, tmp_path)
    try:
        yield pool
    finally:
        pool.close_all()


@pytest.fixture
def ledger_location(pool: LedgerPool) -> str:
    """Where the ``ledger`` fixture's ledger lives."""
    return pool.location()


@pytest.fixture
def ledger(pool: LedgerPool, ledger_location: str) -> Ledger:
    """A freshly created, empty ledger on the engine under test."""
    return pool.create(ledger_location)


@pytest.fixture(scope="session")
def shared_ledger(
    engine: LedgerEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ledger]:
    """One ledger per engine for the whole session (property tests use fresh nonces)."""
    pool = LedgerPool(engine, tmp_path_factory.mktemp(f"shared-{engine.name}"))
    try:
        yield pool.create()
    finally:
        pool.close_all()
