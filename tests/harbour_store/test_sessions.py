"""The web console's sessions in the store (DESIGN §12), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import hashlib
import secrets

import pytest

from marque.errors import InvalidInput, Unauthenticated
from marque.harbour.principals import Role
from marque.harbour.store import schema
from marque.harbour.store.base import HarbourStore

from .conftest import T0, StorePool, all_entries, insert_old_principal, raw_tx

HOUR = 3600.0


def new_hash() -> tuple[str, str]:
    """A session id and the SHA-256 the store keeps of it."""
    session_id = secrets.token_urlsafe(32)
    return session_id, hashlib.sha256(session_id.encode()).hexdigest()


def csrf_secret() -> str:
    return secrets.token_urlsafe(32)


def reason_of(excinfo: pytest.ExceptionInfo[Unauthenticated]) -> str:
    reason: str = excinfo.value.detail["reason"]
    return reason


def test_a_session_is_stored_by_its_hash_and_finds_its_principal(store: HarbourStore) -> None:
    """create_session keeps only the id's SHA-256; get_session answers it and the principal."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    session_id, digest = new_hash()
    secret = csrf_secret()
    made = store.create_session(digest, "carol", csrf_secret=secret, expires_at=T0 + HOUR,
                                now=T0)
    assert (made.principal, made.expires_at, made.created_at) == ("carol", T0 + HOUR, T0)
    session, principal = store.get_session(digest, now=T0 + 10)
    assert session == made and session.csrf_secret == secret
    assert principal.name == "carol" and principal.roles == {Role.APPROVER}
    with raw_tx(store) as tx:
        rows = tx.execute("SELECT session_hash FROM console_sessions")
    assert rows == [(digest,)]
    assert session_id not in str(rows)
    # Sessions change nothing a logbook records.
    assert [e.kind for e in all_entries(store)] == ["principal.added"]


def test_an_unknown_or_malformed_session_is_unauthenticated(store: HarbourStore) -> None:
    """A hash never stored, and text that is no hash at all, are both `unknown`."""
    for bad in (new_hash()[1], "", "nope", "0" * 63):
        with pytest.raises(Unauthenticated) as excinfo:
            store.get_session(bad, now=T0)
        assert reason_of(excinfo) == "unknown"


def test_a_session_expires_at_its_expiry(store: HarbourStore) -> None:
    """Up to expires_at the session works; from then on it is `expired`."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    _, digest = new_hash()
    store.create_session(digest, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    store.get_session(digest, now=T0 + HOUR - 0.001)
    with pytest.raises(Unauthenticated) as excinfo:
        store.get_session(digest, now=T0 + HOUR)
    assert reason_of(excinfo) == "expired"


def test_logging_out_ends_the_session_once(store: HarbourStore) -> None:
    """revoke_session ends a session (True once, then False); it is then `revoked`."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    _, digest = new_hash()
    _, other = new_hash()
    store.create_session(digest, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    store.create_session(other, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    assert store.revoke_session(digest, now=T0 + 1) is True
    assert store.revoke_session(digest, now=T0 + 2) is False
    assert store.revoke_session(new_hash()[1], now=T0 + 2) is False
    with pytest.raises(Unauthenticated) as excinfo:
        store.get_session(digest, now=T0 + 3)
    assert reason_of(excinfo) == "revoked"
    # The same principal's other session is untouched.
    assert store.get_session(other, now=T0 + 3)[1].name == "carol"


def test_revoking_a_principal_ends_its_sessions(store: HarbourStore) -> None:
    """A principal revoked after logging in: its session is `principal_revoked` at once."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    _, digest = new_hash()
    store.create_session(digest, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    store.revoke_principal("carol", actor="root", now=T0 + 5)
    with pytest.raises(Unauthenticated) as excinfo:
        store.get_session(digest, now=T0 + 6)
    assert reason_of(excinfo) == "principal_revoked"


def test_only_an_unrevoked_principal_gets_a_session(store: HarbourStore) -> None:
    """An unknown or revoked principal is refused and no row is written."""
    store.add_principal("dave", ["auditor"], actor="root", now=T0)
    store.revoke_principal("dave", actor="root", now=T0 + 1)
    for name in ("nobody", "dave"):
        with pytest.raises(Unauthenticated):
            store.create_session(new_hash()[1], name, csrf_secret=csrf_secret(),
                                 expires_at=T0 + HOUR, now=T0 + 2)
    with raw_tx(store) as tx:
        assert tx.execute("SELECT count(*) FROM console_sessions") == [(0,)]


def test_session_arguments_are_checked(store: HarbourStore) -> None:
    """A hash that is not 64 hex digits, a short CSRF secret, or a past expiry is refused."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    with pytest.raises(InvalidInput):
        store.create_session("not-a-hash", "carol", csrf_secret=csrf_secret(),
                             expires_at=T0 + HOUR, now=T0)
    with pytest.raises(InvalidInput):
        store.create_session(new_hash()[1], "carol", csrf_secret="short",
                             expires_at=T0 + HOUR, now=T0)
    with pytest.raises(InvalidInput):
        store.create_session(new_hash()[1], "carol", csrf_secret=csrf_secret(),
                             expires_at=T0, now=T0)


def test_purge_deletes_only_sessions_expired_before(store: HarbourStore) -> None:
    """purge_sessions(before=t) removes sessions whose expiry is earlier, and no others."""
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    hashes = [new_hash()[1] for _ in range(3)]
    for offset, digest in zip((10.0, 20.0, 30.0), hashes, strict=True):
        store.create_session(digest, "carol", csrf_secret=csrf_secret(),
                             expires_at=T0 + offset, now=T0)
    assert store.purge_sessions(before=T0 + 25) == 2
    with raw_tx(store) as tx:
        assert tx.execute("SELECT session_hash FROM console_sessions") == [(hashes[2],)]


def test_a_session_made_through_one_store_works_through_another(stores: StorePool) -> None:
    """Two stores on one location (two `harbour serve` processes): a session made through
    one is found, and ended, through the other."""
    location = stores.location()
    first = stores.create(location)
    second = stores.open(location)
    first.add_principal("carol", ["approver"], actor="root", now=T0)
    _, digest = new_hash()
    first.create_session(digest, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    assert second.get_session(digest, now=T0 + 1)[1].name == "carol"
    assert second.revoke_session(digest, now=T0 + 2)
    with pytest.raises(Unauthenticated):
        first.get_session(digest, now=T0 + 3)


def test_migration_4_adds_the_sessions_table_to_an_older_store(stores: StorePool) -> None:
    """A store left at version 3 opens at the latest version with a working sessions table,
    and its logbook and principals untouched."""
    location = stores.location()
    old = stores.create_at_version(location, 3)
    insert_old_principal(old, "carol", ["approver"])
    before = [e.to_dict() for e in all_entries(old)]
    old.close()
    store = stores.open(location)
    assert store.schema_version == schema.LATEST >= 4
    assert [e.to_dict() for e in all_entries(store)] == before
    _, digest = new_hash()
    store.create_session(digest, "carol", csrf_secret=csrf_secret(), expires_at=T0 + HOUR,
                         now=T0)
    assert store.get_session(digest, now=T0)[1].name == "carol"
