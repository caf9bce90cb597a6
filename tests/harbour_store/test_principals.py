"""Principals, routing configs and Pilots in the store, each change in the logbook."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from marque.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from marque.harbour.lifecycle import RequestState, StaleVersion
from marque.harbour.principals import TOKEN_BYTES, Role, hash_token
from marque.harbour.store import schema
from marque.harbour.store.base import HarbourStore, StoredRequest
from marque.token import thumbprint

from .conftest import (
    T0,
    StorePool,
    all_entries,
    assert_chain_verifies,
    insert_old_principal,
    make_draft,
    raw_tx,
)

S = RequestState
JWK = {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}


def test_a_principal_token_authenticates_and_is_stored_hashed(store: HarbourStore) -> None:
    """add returns a ≥256-bit token once; only its SHA-256 is stored; it authenticates."""
    principal, token = store.add_principal("alice", ["requester", "approver"], actor="root",
                                           now=T0)
    assert principal.roles == {Role.REQUESTER, Role.APPROVER}
    assert len(token) >= 43 and TOKEN_BYTES * 8 >= 256
    assert store.authenticate(token) == principal
    with raw_tx(store) as tx:
        stored = tx.execute("SELECT token_hash FROM principals")
    assert stored == [(hash_token(token),)]
    assert token not in str(all_entries(store)[-1].to_dict())
    entry = all_entries(store)[-1]
    assert (entry.kind, entry.subject, entry.actor) == ("principal.added", "alice", "root")
    assert entry.body["roles"] == ["approver", "requester"]


def test_unknown_and_revoked_tokens_are_unauthenticated(store: HarbourStore) -> None:
    """An unknown token, an empty one, and a revoked one are all Unauthenticated."""
    _, token = store.add_principal("bob", ["requester"], actor="root", now=T0)
    for bad in ("", "mqh_nope", token + "x"):
        with pytest.raises(Unauthenticated):
            store.authenticate(bad)
    revoked = store.revoke_principal("bob", actor="root", now=T0 + 1)
    assert revoked.revoked_at == T0 + 1
    with pytest.raises(Unauthenticated):
        store.authenticate(token)
    # Revoking again changes nothing and logs nothing more.
    assert store.revoke_principal("bob", actor="root", now=T0 + 2).revoked_at == T0 + 1
    kinds = [e.kind for e in all_entries(store)]
    assert kinds == ["principal.added", "principal.revoked"]


def test_principal_names_are_unique_and_roles_closed(store: HarbourStore) -> None:
    """A taken name is Conflict; an unknown role or none at all is InvalidInput."""
    store.add_principal("carol", ["admin"], actor="root", now=T0)
    with pytest.raises(Conflict):
        store.add_principal("carol", ["auditor"], actor="root", now=T0)
    with pytest.raises(InvalidInput):
        store.add_principal("dave", ["superuser"], actor="root", now=T0)
    with pytest.raises(InvalidInput):
        store.add_principal("dave", [], actor="root", now=T0)
    with pytest.raises(InvalidInput):
        store.add_principal("bad\nname", ["admin"], actor="root", now=T0)
    assert [p.name for p in store.list_principals()] == ["carol"]


def test_public_keys_are_registered_and_logged(store: HarbourStore) -> None:
    """set_public_key stores the JWK; get and list show it; unknown names are NotFound."""
    store.add_principal("erin", ["requester"], actor="root", now=T0)
    updated = store.set_public_key("erin", JWK, actor="root", now=T0 + 1)
    assert updated.public_jwk == JWK == store.get_principal("erin").public_jwk
    assert all_entries(store)[-1].kind == "principal.key_set"
    with pytest.raises(NotFound):
        store.set_public_key("nobody", JWK, actor="root")
    with pytest.raises(NotFound):
        store.get_principal("nobody")
    with pytest.raises(NotFound):
        store.revoke_principal("nobody", actor="root")


def test_adopting_a_config_is_durable_and_idempotent(store: HarbourStore) -> None:
    """adopt records the CID and source; adopting the current one again changes nothing."""
    assert store.current_routing_config() is None
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert store.adopt_routing_config(a, "[[entry]]\n", actor="root", now=T0)
    assert not store.adopt_routing_config(a, "[[entry]]\n", actor="root", now=T0 + 1)
    adopted_first = store.current_routing_config()
    assert adopted_first is not None and adopted_first.config_cid == a
    assert store.adopt_routing_config(b, "# b\n", actor="root", now=T0 + 2)
    assert store.adopt_routing_config(a, "[[entry]]\n", actor="root", now=T0 + 3)
    current = store.current_routing_config()
    assert current is not None and (current.config_cid, current.source) == (a, "[[entry]]\n")
    assert current.adopted_at == T0
    assert store.get_routing_config(b).source == "# b\n"
    with pytest.raises(NotFound):
        store.get_routing_config("sha256:" + "c" * 64)
    adopted = [e.body for e in all_entries(store) if e.kind == "config.adopted"]
    assert adopted == [{"config_cid": a, "previous": None}, {"config_cid": b, "previous": a},
                       {"config_cid": a, "previous": b}]


def test_pilot_registration_returns_the_previous_incarnation(store: HarbourStore) -> None:
    """register returns None first, then the incarnation it replaces; get and list show it."""
    assert store.register_pilot("pilot-1", "http://p1", "inc_1", ["bank"], now=T0) is None
    assert store.register_pilot("pilot-1", "http://p1b", "inc_1", ["bank", "shop"],
                                now=T0 + 1) == "inc_1"
    pilot = store.get_pilot("pilot-1")
    assert (pilot.url, pilot.incarnation, pilot.targets) == ("http://p1b", "inc_1",
                                                             ["bank", "shop"])
    assert (pilot.registered_at, pilot.last_seen) == (T0, T0 + 1)
    assert [p.pilot_id for p in store.list_pilots()] == ["pilot-1"]
    with pytest.raises(NotFound):
        store.get_pilot("pilot-2")
    assert [e.kind for e in all_entries(store)] == ["pilot.registered"] * 2


def test_a_changed_incarnation_moves_pinned_requests_to_reconciliation(
        store: HarbourStore) -> None:
    """A new incarnation: a finding, and prepared/executing requests → reconciliation."""
    store.register_pilot("pilot-1", "http://p1", "inc_1", ["bank"], now=T0)
    states = {}
    for name, path in {"prep": ["prepared"], "exec": ["prepared", "executing"],
                       "rec": ["prepared", "reconciliation"], "ver": ["prepared", "verified"],
                       "wait": ["awaiting_approval"]}.items():
        request, _ = store.create_request(make_draft(name), now=T0)
        for step in path:
            request = store.transition(request.id, request.version, step, actor="h", now=T0)
        states[name] = request
    other, _ = store.create_request(make_draft("elsewhere", pilot_id="pilot-2"), now=T0)
    other = store.transition(other.id, 1, "prepared", actor="h", now=T0)
    mark = store.logbook_head()["seq"]

    assert store.register_pilot("pilot-1", "http://p1", "inc_2", ["bank"], now=T0 + 5) == "inc_1"
    after = {name: store.get_request(r.id).state for name, r in states.items()}
    assert after == {"prep": S.RECONCILIATION, "exec": S.RECONCILIATION,
                     "rec": S.RECONCILIATION, "ver": S.VERIFIED, "wait": S.AWAITING_APPROVAL}
    assert store.get_request(other.id).state is S.PREPARED
    new = store.logbook_entries(after=mark)
    assert [e.kind for e in new] == ["pilot.registered", "finding.ledger_incarnation_changed",
                                     "request.reconciliation", "request.reconciliation"]
    finding = new[1].body
    assert finding["previous_incarnation"] == "inc_1" and finding["incarnation"] == "inc_2"
    assert set(finding["requests"]) == {states[n].id for n in ("prep", "exec", "rec")}
    assert {e.subject for e in new[2:]} == {states["prep"].id, states["exec"].id}
    assert_chain_verifies(store)


def test_re_registration_racing_transitions_never_deadlocks(store: HarbourStore) -> None:
    """A changed incarnation and request moves at once: each either wins or loses the CAS."""
    store.register_pilot("pilot-1", "http://p1", "inc_0", ["bank"], now=T0)
    requests = []
    for n in range(6):
        request, _ = store.create_request(make_draft(f"r{n}"), now=T0)
        requests.append(store.transition(request.id, 1, "prepared", actor="h", now=T0))
    gate = threading.Barrier(len(requests) + 1)
    errors: list[BaseException] = []

    def move(request: StoredRequest) -> None:
        gate.wait(timeout=30)
        try:
            store.transition(request.id, request.version, "executing", actor="h", now=T0 + 1)
        except StaleVersion:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def register() -> None:
        gate.wait(timeout=30)
        for _ in range(20):
            try:
                store.register_pilot("pilot-1", "http://p1", "inc_1", ["bank"], now=T0 + 2)
                return
            except StaleVersion:
                continue  # a request moved under it: register again, as a Pilot would
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
        errors.append(AssertionError("registration lost 20 times"))

    threads = [threading.Thread(target=move, args=(r,)) for r in requests]
    threads.append(threading.Thread(target=register))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert store.get_pilot("pilot-1").incarnation == "inc_1"
    assert {store.get_request(r.id).state for r in requests} == {S.RECONCILIATION}
    assert_chain_verifies(store)


def _jwk() -> dict[str, Any]:
    from marque.token import new_key, public_jwk

    return public_jwk(new_key())


def test_one_key_is_one_unrevoked_principal(store: HarbourStore) -> None:
    """A key an unrevoked principal holds is Conflict for add, set_public_key and rotate —
    by its RFC 7638 thumbprint, so the same key with another kid is the same key."""
    key = _jwk()
    alice, _ = store.add_principal("alice", ["requester"], public_jwk=key, actor="root", now=T0)
    assert alice.key_thumbprint == thumbprint(key)
    same_key = {**key, "kid": "another-kid"}
    for attempt in (
        lambda: store.add_principal("twin", ["approver"], public_jwk=same_key, actor="root"),
        lambda: store.add_principal("twin", ["approver"], public_jwk=key, actor="root"),
    ):
        with pytest.raises(Conflict) as refused:
            attempt()
        assert refused.value.detail["holder"] == "alice"
    store.add_principal("bob", ["approver"], actor="root", now=T0)
    with pytest.raises(Conflict):
        store.set_public_key("bob", key, actor="root")
    with pytest.raises(Conflict):
        store.rotate_principal("bob", public_jwk=key, actor="root")
    assert store.get_principal("bob").public_jwk is None
    assert [p.name for p in store.list_principals()] == ["alice", "bob"]
    # The constraint itself refuses it, not only the code in front of it.
    with pytest.raises(Conflict), raw_tx(store) as tx:
        tx.execute("UPDATE principals SET key_thumbprint = ? WHERE name = 'bob'",
                   (alice.key_thumbprint,))
    # Once alice moves to another key, hers is free.
    store.rotate_principal("alice", public_jwk=_jwk(), actor="root", now=T0 + 1)
    twin, _ = store.add_principal("twin", ["approver"], public_jwk=key, actor="root", now=T0 + 2)
    assert twin.key_thumbprint == alice.key_thumbprint


def test_a_revoked_name_can_be_added_again_as_a_new_principal(store: HarbourStore) -> None:
    """Revoked alice stays listed with her own id; the new alice has another id and token;
    get_principal answers the unrevoked one; a revoked key is free again."""
    key = _jwk()
    old, old_token = store.add_principal("alice", ["requester"], public_jwk=key, actor="root",
                                         now=T0)
    store.revoke_principal("alice", actor="root", now=T0 + 1)
    new, new_token = store.add_principal("alice", ["approver"], public_jwk=key, actor="root",
                                         now=T0 + 2)
    assert new.id != old.id and new_token != old_token
    assert store.get_principal("alice") == new == store.authenticate(new_token)
    with pytest.raises(Unauthenticated):
        store.authenticate(old_token)
    assert [(p.id, p.revoked) for p in store.list_principals()] == [(old.id, True),
                                                                      (new.id, False)]
    with pytest.raises(Conflict):
        store.add_principal("alice", ["auditor"], actor="root")
    assert store.revoke_principal("alice", actor="root", now=T0 + 3).id == new.id
    assert store.get_principal("alice").id == new.id  # the latest, revoked
    kinds = [(e.kind, e.body.get("id")) for e in all_entries(store)]
    assert kinds == [("principal.added", old.id), ("principal.revoked", old.id),
                     ("principal.added", new.id), ("principal.revoked", new.id)]


def test_rotation_replaces_the_token_ends_sessions_and_is_logged(store: HarbourStore) -> None:
    """rotate: a new token authenticates, the old one does not, live console sessions end;
    a revoked or unknown principal is NotFound; `principal.rotated` never holds a token."""
    principal, token = store.add_principal("carol", ["approver"], actor="root", now=T0)
    session = "a" * 64
    store.create_session(session, "carol", csrf_secret="s" * 32, expires_at=T0 + 3600, now=T0)
    rotated, new_token = store.rotate_principal("carol", actor="root", now=T0 + 1)
    assert rotated.id == principal.id and new_token != token
    assert store.authenticate(new_token).name == "carol"
    with pytest.raises(Unauthenticated):
        store.authenticate(token)
    with pytest.raises(Unauthenticated) as ended:
        store.get_session(session, now=T0 + 2)
    assert ended.value.detail["reason"] == "revoked"
    entry = all_entries(store)[-1]
    assert (entry.kind, entry.body["sessions_ended"], entry.body["key_rotated"]) == (
        "principal.rotated", 1, False)
    assert token not in str(entry.to_dict()) and new_token not in str(entry.to_dict())
    store.revoke_principal("carol", actor="root", now=T0 + 3)
    with pytest.raises(NotFound):
        store.rotate_principal("carol", actor="root")
    with pytest.raises(NotFound):
        store.rotate_principal("nobody", actor="root")


def test_a_revoked_principals_session_never_wakes_as_the_new_one(store: HarbourStore) -> None:
    """A session of revoked dave stays dead after dave is added again."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    session = "b" * 64
    store.create_session(session, "dave", csrf_secret="s" * 32, expires_at=T0 + 3600, now=T0)
    store.revoke_principal("dave", actor="root", now=T0 + 1)
    store.add_principal("dave", ["approver"], actor="root", now=T0 + 2)
    with pytest.raises(Unauthenticated) as dead:
        store.get_session(session, now=T0 + 3)
    assert dead.value.detail["reason"] == "principal_revoked"


def test_roles_are_replaced_and_logged_with_what_they_replace(store: HarbourStore) -> None:
    """set_roles: exactly the new roles; one `principal.roles_set` with `previous`; the same
    roles again log nothing; unknown roles and revoked principals are refused."""
    _, token = store.add_principal("erin", ["requester"], actor="root", now=T0)
    changed = store.set_roles("erin", ["approver", "auditor"], actor="root", now=T0 + 1)
    assert changed.roles == {Role.APPROVER, Role.AUDITOR} == store.authenticate(token).roles
    store.set_roles("erin", ["auditor", "approver"], actor="root", now=T0 + 2)
    sets = [e.body for e in all_entries(store) if e.kind == "principal.roles_set"]
    assert [(b["roles"], b["previous"]) for b in sets] == [(["approver", "auditor"],
                                                            ["requester"])]
    with pytest.raises(InvalidInput):
        store.set_roles("erin", ["root"], actor="root")
    store.revoke_principal("erin", actor="root", now=T0 + 3)
    with pytest.raises(NotFound):
        store.set_roles("erin", ["admin"], actor="root")


def test_migration_6_gives_ids_and_thumbprints_and_revokes_a_shared_key(
        stores: StorePool) -> None:
    """A version-5 store whose unrevoked principals share a key: opened by current code,
    each keeps its token, the oldest keeps the key, the later one is revoked with a
    `finding.principal_key_shared`, and sessions still find their principal."""
    location = stores.location()
    old = stores.create_at_version(location, 5)
    key = _jwk()
    alice_token = insert_old_principal(old, "alice", ["requester"], public_jwk=key, now=T0)
    twin_token = insert_old_principal(old, "twin", ["approver"], public_jwk=key, now=T0 + 1)
    insert_old_principal(old, "gone", ["approver"], public_jwk=key, now=T0 + 2,
                         revoked_at=T0 + 3)
    bob_token = insert_old_principal(old, "bob", ["approver"], now=T0 + 4)
    session = "c" * 64
    with raw_tx(old) as tx:  # a session as version 5 stored it
        tx.execute("INSERT INTO console_sessions (session_hash, principal, csrf_secret, "
                   "created_at, expires_at) VALUES (?, 'bob', ?, ?, ?)",
                   (session, "s" * 32, T0, T0 + 3600))
    old.close()

    store = stores.open(location)
    assert store.schema_version == schema.LATEST
    alice = store.authenticate(alice_token)
    assert alice.id.startswith("pr_") and alice.key_thumbprint == thumbprint(key)
    with pytest.raises(Unauthenticated):
        store.authenticate(twin_token)
    assert store.get_session(session, now=T0 + 5)[1].name == "bob"
    assert store.authenticate(bob_token).key_thumbprint is None
    [finding] = [e for e in all_entries(store) if e.kind == "finding.principal_key_shared"]
    assert (finding.subject, finding.body["holder"]) == ("twin", "alice")
    assert len({p.id for p in store.list_principals()}) == 4
    assert_chain_verifies(store)


def test_an_agent_is_stored_as_a_role_of_its_own(store: HarbourStore) -> None:
    """The role agent round-trips, and is refused beside any other role, when added and when
    the roles are set (docs/agents.md)."""
    agent, token = store.add_principal("claude", ["agent"], public_jwk=JWK, actor="root",
                                       now=T0)
    assert agent.roles == {Role.AGENT}
    assert store.authenticate(token).has(Role.AGENT)
    with pytest.raises(InvalidInput, match="cannot be combined"):
        store.add_principal("claude-2", ["agent", "approver"], actor="root", now=T0)
    with pytest.raises(InvalidInput, match="cannot be combined"):
        store.set_roles("claude", ["agent", "admin"], actor="root", now=T0)
    assert store.get_principal("claude").roles == {Role.AGENT}
    assert [p.name for p in store.list_principals()] == ["claude"]
