"""Principals, routing configs and Pilots in the store, each change in the logbook."""

from __future__ import annotations

import threading

import pytest

from marque.errors import Conflict, InvalidInput, NotFound, Unauthenticated
from marque.harbour.lifecycle import RequestState, StaleVersion
from marque.harbour.principals import TOKEN_BYTES, Role, hash_token
from marque.harbour.store.base import HarbourStore, Request

from .conftest import T0, all_entries, assert_chain_verifies, make_draft, raw_tx

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

    def move(request: Request) -> None:
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
