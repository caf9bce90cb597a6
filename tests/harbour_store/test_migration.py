"""Schema migrations: version 1's column UNIQUE becomes a partial index; no row changes."""

from __future__ import annotations

from typing import Any

import pytest

from marque.errors import Conflict, HarbourUnavailable, NotFound
from marque.harbour.lifecycle import IntentConflict
from marque.harbour.store import schema
from marque.harbour.store.base import HarbourStore
from marque.harbour.store.columns import canonical_json
from marque.harbour.store.sqlite import SqliteHarbourStore

from .conftest import T0, HarbourEngine, StorePool, assert_chain_verifies, make_draft, raw_tx

COLUMNS = ", ".join(schema.REQUEST_COLUMNS)


def _rows(store: HarbourStore) -> list[tuple[Any, ...]]:
    """Every requests row as the engine stores it (with SQLite's storage classes)."""
    typed = ""
    if isinstance(store, SqliteHarbourStore):
        typed = ", " + ", ".join(f"typeof({c})" for c in schema.REQUEST_COLUMNS)
    with raw_tx(store) as tx:
        return tx.execute(f"SELECT {COLUMNS}{typed} FROM requests ORDER BY id")


def _insert_v1_row(store: HarbourStore, n: int, state: str, scope: str) -> None:
    draft = make_draft(f"old-{n}", sql=f"SELECT {n}", scope=scope)
    with raw_tx(store) as tx:
        tx.execute(
            f"INSERT INTO requests ({COLUMNS}) VALUES "
            f"({', '.join('?' for _ in schema.REQUEST_COLUMNS)})",
            (f"rq_old{n}", draft.request_id, draft.principal, "réason ✓", draft.pilot_id,
             draft.target, canonical_json(draft.change), canonical_json(draft.budget), 600,
             draft.change_cid, draft.authority_scope_cid, draft.logical_request_scope,
             draft.intent_fingerprint,
             canonical_json({"outcome": "allow", "config_cid": "sha256:" + "e" * 64}),
             None, None, f"mq_old{n}", None, state, 3, T0 + n + 0.125, T0 + n + 0.5))


def test_schema_1_forbids_a_second_row_per_scope(stores: StorePool) -> None:
    """Version 1, as released, refuses any second row of a scope, even after expiry."""
    old = stores.create_at_version(stores.location(), 1)
    assert old.schema_version == 1
    _insert_v1_row(old, 1, "expired", "sha256:" + "5" * 64)
    with pytest.raises(Conflict):
        _insert_v1_row(old, 2, "preparing", "sha256:" + "5" * 64)


def test_migration_to_the_partial_index_keeps_every_row(stores: StorePool,
                                                        harbour_engine: HarbourEngine) -> None:
    """A version-1 store opened by current code: rows byte-identical, the partial index governs."""
    location = stores.location()
    old = stores.create_at_version(location, 1)
    expired_scope = make_draft().logical_request_scope
    _insert_v1_row(old, 1, "expired", expired_scope)
    _insert_v1_row(old, 2, "verified", "sha256:" + "7" * 64)
    _insert_v1_row(old, 3, "failed", "sha256:" + "8" * 64)
    harbour_id = old.harbour_id
    old.append("finding.test", "t", "s", {"before": "migration"}, now=T0)
    before = _rows(old)
    old.close()

    store = stores.open(location)
    assert store.schema_version == schema.LATEST
    assert store.harbour_id == harbour_id
    assert _rows(store) == before
    # The expired row no longer blocks a fresh request in its scope…
    fresh, created = store.create_request(make_draft(), now=T0 + 100)
    assert created and fresh.logical_request_scope == expired_scope
    assert [r.id for r in store.find_history(expired_scope)] == ["rq_old1", fresh.id]
    # …while the verified one still blocks its own.
    with pytest.raises(IntentConflict):
        store.create_request(make_draft("x", scope="sha256:" + "7" * 64), now=T0 + 100)
    assert store.get_request("rq_old2").reason == "réason ✓"
    assert_chain_verifies(store)
    store.close()
    # Opening again finds nothing more to migrate.
    assert stores.open(location).schema_version == schema.LATEST


def test_a_store_from_a_newer_marque_is_refused(stores: StorePool) -> None:
    """A schema version above LATEST is HarbourUnavailable, not a silent downgrade."""
    location = stores.location()
    store = stores.create(location)
    with raw_tx(store) as tx:
        tx.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(HarbourUnavailable):
        stores.open(location)


def test_create_refuses_an_existing_store_and_open_a_missing_one(
        stores: StorePool, harbour_engine: HarbourEngine) -> None:
    """create over a store is Conflict (nothing overwritten); a missing store is NotFound."""
    location = stores.location()
    store = stores.create(location)
    store.append("finding.test", "a", "s", {}, now=T0)
    with pytest.raises(Conflict):
        stores.create(location)
    assert stores.open(location).harbour_id == store.harbour_id
    assert len(assert_chain_verifies(store)) == 1
    with pytest.raises(NotFound):
        stores.open(stores.location())


def test_migration_8_adds_the_pilots_report_key_and_keeps_every_pilot(
        stores: StorePool) -> None:
    """A version-5 store's Pilot (written as version 5 wrote it) reads back unchanged, with no
    report key; its next registration with a key stores the key and says what changed."""
    location = stores.location()
    old = stores.create_at_version(location, 5)
    with raw_tx(old) as tx:
        tx.execute("INSERT INTO pilots (pilot_id, url, incarnation, targets, registered_at, "
                   "last_seen, dialects) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   ("p-old", "http://127.0.0.1:1", "inc_1", canonical_json(["bank"]), T0, T0 + 1,
                    canonical_json({"bank": "sqlite"})))
    old.close()
    store = stores.open(location)
    assert store.schema_version == schema.LATEST >= 10
    pilot = store.get_pilot("p-old")
    assert (pilot.url, pilot.incarnation, pilot.targets, pilot.dialects, pilot.last_seen,
            pilot.report_key) == ("http://127.0.0.1:1", "inc_1", ["bank"], {"bank": "sqlite"},
                                  T0 + 1, None)
    key = {"kty": "OKP", "crv": "Ed25519", "x": "c" * 43, "kid": "k"}
    store.register_pilot("p-old", "http://127.0.0.1:1", "inc_1", ["bank"],
                         dialects={"bank": "sqlite"}, report_key=key, now=T0 + 2)
    assert store.get_pilot("p-old").report_key == key
    [entry] = [e for e in assert_chain_verifies(store) if e.kind == "pilot.registered"]
    assert entry.body["changed"] == ["report_key"]
