"""Fixtures for the Harbourmaster store suite: one suite, both engines.

The ``harbour_engine`` fixture is parametrised over SQLite files and
PostgreSQL databases on the test run's server (``pg_admin_dsn``), so every
test here runs once per engine. ``stores`` hands out stores on fresh
locations and closes (and drops) them all at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from marque.cid import cid
from marque.harbour.store.base import HarbourStore, LogbookEntry, RequestDraft
from marque.harbour.store.sqlite import SqliteHarbourStore
from marque.logbook.chain import GENESIS, entry_hash, verify_against_head, verify_entries

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class HarbourEngine:
    """How to make, reopen and dispose of stores on one engine."""

    name: str
    location: Callable[[Path], str]
    create: Callable[[str], HarbourStore]
    open: Callable[[str], HarbourStore]
    create_at_version: Callable[[str, int], HarbourStore]
    destroy: Callable[[str], None] | None = None


def _sqlite_location(workdir: Path) -> str:
    return str(workdir / f"harbour-{uuid.uuid4().hex[:12]}.sqlite3")


SQLITE = HarbourEngine(
    name="sqlite", location=_sqlite_location, create=SqliteHarbourStore.create,
    open=SqliteHarbourStore.open, create_at_version=SqliteHarbourStore.create_at_version)


def postgres_engine(admin_dsn: str) -> HarbourEngine:
    """PostgreSQL stores, each in a fresh database on the test run's server."""
    from support.pgcluster import create_database, drop_database

    from marque.harbour.store.postgres import PostgresHarbourStore

    names: dict[str, str] = {}

    def location(_: Path) -> str:
        name, dsn = create_database(admin_dsn)
        names[dsn] = name
        return dsn

    def destroy(dsn: str) -> None:
        if dsn in names:
            drop_database(admin_dsn, names.pop(dsn))

    return HarbourEngine(
        name="postgres", location=location, create=PostgresHarbourStore.create,
        open=PostgresHarbourStore.open,
        create_at_version=PostgresHarbourStore.create_at_version, destroy=destroy)


class StorePool:
    """Stores a test opened; all closed (and their locations destroyed) at teardown."""

    def __init__(self, engine: HarbourEngine, workdir: Path) -> None:
        self.engine = engine
        self.workdir = workdir
        self._stores: list[HarbourStore] = []
        self._locations: list[str] = []

    def location(self) -> str:
        location = self.engine.location(self.workdir)
        self._locations.append(location)
        return location

    def track(self, store: HarbourStore) -> HarbourStore:
        self._stores.append(store)
        return store

    def create(self, location: str | None = None) -> HarbourStore:
        return self.track(self.engine.create(location or self.location()))

    def open(self, location: str) -> HarbourStore:
        return self.track(self.engine.open(location))

    def create_at_version(self, location: str, version: int) -> HarbourStore:
        return self.track(self.engine.create_at_version(location, version))

    def close_all(self) -> None:
        for store in reversed(self._stores):
            try:
                store.close()
            except Exception:  # noqa: BLE001 - teardown must close every store
                pass
        self._stores.clear()
        if self.engine.destroy is not None:
            for location in self._locations:
                self.engine.destroy(location)
        self._locations.clear()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def harbour_engine(request: pytest.FixtureRequest) -> HarbourEngine:
    """The store engine under test."""
    if request.param == "postgres":
        return postgres_engine(request.getfixturevalue("pg_admin_dsn"))
    return SQLITE


@pytest.fixture
def stores(harbour_engine: HarbourEngine, tmp_path: Path) -> Iterator[StorePool]:
    """Creates and opens stores on the engine under test; closes them at teardown."""
    pool = StorePool(harbour_engine, tmp_path)
    try:
        yield pool
    finally:
        pool.close_all()


@pytest.fixture
def store_location(stores: StorePool) -> str:
    """Where the ``store`` fixture's store lives."""
    return stores.location()


@pytest.fixture
def store(stores: StorePool, store_location: str) -> HarbourStore:
    """A freshly created, empty store on the engine under test."""
    return stores.create(store_location)


@pytest.fixture(scope="session")
def shared_store(harbour_engine: HarbourEngine,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[HarbourStore]:
    """One store per engine for a whole session (property tests use fresh scopes)."""
    pool = StorePool(harbour_engine, tmp_path_factory.mktemp(f"harbour-{harbour_engine.name}"))
    try:
        yield pool.create()
    finally:
        pool.close_all()


def raw_tx(store: HarbourStore) -> Any:
    """The engine's own transaction, to read or damage rows behind the interface's back."""
    return getattr(store, "transaction")()  # noqa: B009 - not part of HarbourStore


def insert_old_principal(store: HarbourStore, name: str, roles: list[str], *,
                         public_jwk: dict[str, Any] | None = None, now: float = T0,
                         revoked_at: float | None = None) -> str:
    """A principal row as a store before schema 6 wrote it (name as key, no id, no
    thumbprint); returns its token."""
    from marque.harbour.principals import hash_token, mint_token
    from marque.harbour.store.columns import canonical_json

    token = mint_token()
    with raw_tx(store) as tx:
        tx.execute("INSERT INTO principals (name, token_hash, roles, public_jwk, created_at, "
                   "revoked_at) VALUES (?, ?, ?, ?, ?, ?)",
                   (name, hash_token(token), canonical_json(sorted(roles)),
                    canonical_json(public_jwk), now, revoked_at))
    return token


def make_draft(request_id: str = "req-1", *, principal: str = "alice",
               scope: str | None = None, fingerprint: str | None = None,
               pilot_id: str = "pilot-1", rolls_back: str | None = None,
               sql: str = "UPDATE accounts SET balance = balance - 1 WHERE id = 1",
               reason: str | None = "a test") -> RequestDraft:
    """A request draft; its scope and fingerprint follow its id and SQL unless given."""
    change = {"statements": [{"sql": sql, "params": []}]}
    authority = cid({"version": "marque-authority-scope/0.1", "harbour_id": "hb_test",
                     "principal": principal})
    return RequestDraft(
        request_id=request_id, principal=principal, pilot_id=pilot_id, target="bank",
        change=change, budget={"executions": 1, "max_rows": 1, "attempts_per_nonce": 1},
        ttl_seconds=600, change_cid=cid(change), authority_scope_cid=authority,
        logical_request_scope=scope or cid({"scope": authority, "id": request_id}),
        intent_fingerprint=fingerprint or cid({"sql": sql}), reason=reason,
        rolls_back=rolls_back)


def all_entries(store: HarbourStore) -> list[LogbookEntry]:
    """Every logbook entry, page by page."""
    out: list[LogbookEntry] = []
    while True:
        page = store.logbook_entries(after=out[-1].seq if out else 0, limit=500)
        if not page:
            return out
        out.extend(page)


def assert_chain_verifies(store: HarbourStore) -> list[LogbookEntry]:
    """Recompute every entry's hash with ``entry_hash``: seqs 1..n, linked, head matches."""
    entries = all_entries(store)
    prev = GENESIS
    for expected_seq, entry in enumerate(entries, start=1):
        fields: dict[str, Any] = entry.to_dict()
        assert entry.seq == expected_seq
        assert entry.prev_hash == prev
        assert entry_hash(fields) == entry.hash, entry
        prev = entry.hash
    head = store.logbook_head()
    assert head["seq"] == len(entries)
    assert head["hash"] == prev
    assert verify_entries(e.to_dict() for e in entries) is None
    assert verify_against_head((e.to_dict() for e in entries), head) is None
    return entries


def evidence_for(marque_id: str, pilot_id: str = "pilot-1", *, claims: list[Any] | None = None,
                 stamps: list[Any] | None = None, budget: Any = None,
                 reachable: bool | None = True) -> dict[str, Any]:
    """A Pilot's ``GET /v1/marques/{id}`` body (the shape of marque.pilot.evidence)."""
    return {"marque_id": marque_id, "pilot": {"id": pilot_id, "incarnation": "inc_1"},
            "budget": budget, "claims": claims or [], "stamps": stamps or [],
            "target_reachable": reachable}
