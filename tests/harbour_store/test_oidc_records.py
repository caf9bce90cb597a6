"""Signing in through an identity provider, in the store (store/oidc_sql.py), on SQLite and
PostgreSQL alike: one-time states, ID tokens exchanged once, sessions granted roles, and
the switch that turns token login off ending token sessions."""

from __future__ import annotations

import hashlib
import secrets

import pytest

from marque.errors import InvalidInput, OidcLoginRefused, Unauthenticated
from marque.harbour.principals import Role
from marque.harbour.store import schema
from marque.harbour.store.base import HarbourStore, OidcLogin

from .conftest import T0, StorePool, all_entries, raw_tx

HOUR = 3600.0


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def a_login(browser: str = "browser-secret", *, expires_at: float = T0 + 600) -> OidcLogin:
    return OidcLogin(browser_hash=digest(browser), nonce="n" * 43, code_verifier="v" * 64,
                     next_path="/requests/rq_1", issuer="https://idp.example",
                     created_at=T0, expires_at=expires_at)


def check_of(excinfo: pytest.ExceptionInfo[OidcLoginRefused]) -> str:
    check: str = excinfo.value.detail["check"]
    return check


def test_a_state_is_used_once(store: HarbourStore) -> None:
    """The first finish answers what begin stored; the second is `state_used`; a state
    never stored is `state_unknown`."""
    state = digest(secrets.token_urlsafe(32))
    store.begin_oidc_login(state, a_login())
    found = store.finish_oidc_login(state, now=T0 + 5)
    assert (found.nonce, found.code_verifier, found.next_path) == ("n" * 43, "v" * 64,
                                                                   "/requests/rq_1")
    with pytest.raises(OidcLoginRefused) as used:
        store.finish_oidc_login(state, now=T0 + 6)
    assert check_of(used) == "state_used"
    with pytest.raises(OidcLoginRefused) as unknown:
        store.finish_oidc_login(digest("never"), now=T0)
    assert check_of(unknown) == "state_unknown"


def test_an_expired_state_is_refused_and_spent(store: HarbourStore) -> None:
    """A callback after the sign-in's time is `state_expired`, and the state is used up."""
    state = digest("late")
    store.begin_oidc_login(state, a_login(expires_at=T0 + 600))
    with pytest.raises(OidcLoginRefused) as late:
        store.finish_oidc_login(state, now=T0 + 600)
    assert check_of(late) == "state_expired"
    with pytest.raises(OidcLoginRefused) as again:
        store.finish_oidc_login(state, now=T0 + 1)
    assert check_of(again) == "state_used"


def test_an_id_token_is_noted_once(store: HarbourStore) -> None:
    """note_exchanged_token answers True once per token hash, then False."""
    token = digest("an id token")
    assert store.note_exchanged_token(token, expires_at=T0 + 300, now=T0) is True
    assert store.note_exchanged_token(token, expires_at=T0 + 300, now=T0 + 1) is False
    assert store.note_exchanged_token(digest("another"), expires_at=T0 + 300, now=T0) is True


def test_a_signed_in_session_holds_the_roles_it_was_granted(store: HarbourStore) -> None:
    """Roles from groups replace the principal's; roles from the principal end the session
    (`role_revoked`) once it no longer holds one of them."""
    store.add_principal("gina", ["requester"], actor="root", now=T0)
    store.add_principal("carol", ["approver"], actor="root", now=T0)
    groups, principal = digest("s1"), digest("s2")
    store.create_session(groups, "gina", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0,
                         via="oidc", roles=("approver",), roles_from="groups",
                         oidc_subject="gina", oidc_sid="sid-1")
    store.create_session(principal, "carol", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                         now=T0, via="oidc", roles=("approver",), roles_from="principal",
                         oidc_subject="carol", oidc_sid="sid-2")
    session, gina = store.get_session(groups, now=T0 + 1)
    assert gina.roles == {Role.APPROVER} and session.via == "oidc"
    assert store.get_session(principal, now=T0 + 1)[1].roles == {Role.APPROVER}
    store.set_roles("carol", ["auditor"], actor="root", now=T0 + 2)
    with pytest.raises(Unauthenticated) as revoked:
        store.get_session(principal, now=T0 + 3)
    assert revoked.value.detail["reason"] == "role_revoked"


def test_back_channel_logout_ends_the_sessions_of_a_provider_session(
        store: HarbourStore) -> None:
    """end_oidc_sessions by sid ends that sign-in's sessions only, never a token session."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    mine, other, token = digest("a"), digest("b"), digest("c")
    for session, sid in ((mine, "sid-x"), (other, "sid-y")):
        store.create_session(session, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                             now=T0, via="oidc", roles=("approver",), roles_from="principal",
                             oidc_subject="dave", oidc_sid=sid)
    store.create_session(token, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0)
    assert store.end_oidc_sessions(sid="sid-x", now=T0 + 1) == 1
    with pytest.raises(Unauthenticated):
        store.get_session(mine, now=T0 + 2)
    store.get_session(other, now=T0 + 2)
    assert store.end_oidc_sessions(subject="dave", now=T0 + 3) == 1
    store.get_session(token, now=T0 + 4)  # a token session is not the provider's to end


def test_requiring_the_provider_ends_token_sessions_and_is_logged(store: HarbourStore) -> None:
    """Settings with require on end every token session in the same transaction; the
    logbook says so; signed-in sessions stay; clearing is logged too."""
    store.add_principal("admin", ["admin"], actor="root", now=T0)
    token, signed = digest("t"), digest("o")
    store.create_session(token, "admin", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0)
    store.create_session(signed, "admin", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                         now=T0, via="oidc", roles=("admin",), roles_from="principal")
    assert store.set_oidc_settings({"issuer": "https://idp.example", "require": False},
                                   actor="root", now=T0 + 1) == 0
    assert store.set_oidc_settings({"issuer": "https://idp.example", "require": True},
                                   actor="root", now=T0 + 2) == 1
    assert store.oidc_settings() == {"issuer": "https://idp.example", "require": True}
    with pytest.raises(Unauthenticated):
        store.get_session(token, now=T0 + 3)
    store.get_session(signed, now=T0 + 3)
    assert store.clear_oidc_settings(actor="root", now=T0 + 4) is True
    assert store.clear_oidc_settings(actor="root", now=T0 + 5) is False
    assert store.oidc_settings() is None
    kinds = [e.kind for e in all_entries(store)]
    assert kinds[-3:] == ["oidc.configured", "oidc.configured", "oidc.cleared"]


def test_migration_10_keeps_a_version_9_session_as_a_token_session(stores: StorePool) -> None:
    """A session written by a version-9 store (no `via`, no roles) still works after the
    migration, as a token session with its principal's live roles."""
    location = stores.location()
    old = stores.create_at_version(location, 9)
    old.add_principal("carol", ["approver"], actor="root", now=T0)
    session = digest("old session")
    with raw_tx(old) as tx:
        tx.execute("INSERT INTO console_sessions (session_hash, principal, principal_id, "
                   "csrf_secret, created_at, expires_at) SELECT ?, name, id, ?, ?, ? "
                   "FROM principals WHERE name = 'carol'",
                   (session, "c" * 43, T0, T0 + HOUR))
    old.close()
    store = stores.open(location)
    assert store.schema_version == schema.LATEST >= 10
    found, carol = store.get_session(session, now=T0 + 1)
    assert (found.via, found.roles, found.roles_from) == ("token", None, None)
    assert carol.roles == {Role.APPROVER}
    assert store.oidc_settings() is None


def test_a_state_used_through_one_process_is_used_for_all(stores: StorePool) -> None:
    """Two stores on one location (two `harbour serve` processes): a sign-in begun through
    one is finished through the other, and a replay through the first finds it used."""
    location = stores.location()
    first = stores.create(location)
    second = stores.open(location)
    state = digest("shared")
    first.begin_oidc_login(state, a_login())
    assert second.finish_oidc_login(state, now=T0 + 1).next_path == "/requests/rq_1"
    with pytest.raises(OidcLoginRefused) as replayed:
        first.finish_oidc_login(state, now=T0 + 2)
    assert check_of(replayed) == "state_used"
    token = digest("an id token")
    assert first.note_exchanged_token(token, expires_at=T0 + 300, now=T0)
    assert not second.note_exchanged_token(token, expires_at=T0 + 300, now=T0)


def a_cli_session(store: HarbourStore, name: str, *, expires_at: float = T0 + HOUR) -> str:
    session = digest(name)
    store.create_session(session, "dave", csrf_secret="c" * 43, expires_at=expires_at,
                         now=T0, via="cli", roles=("approver",), roles_from="principal",
                         oidc_subject="dave")
    return session


def test_an_exchanged_token_renews_only_the_live_session_it_opened(
        stores: StorePool) -> None:
    """Through two stores on one location: an ID token seen before is refused as a login
    (no session renewed), and as the renewal of any session but the one it opened; as
    that one's renewal it is accepted once (the renewed session ends, its expiry is
    answered), after which renewing the ended session again is refused."""
    location = stores.location()
    first = stores.create(location)
    second = stores.open(location)
    first.add_principal("dave", ["approver"], actor="root", now=T0)
    token = digest("an id token renewed")
    opened = a_cli_session(first, "opened", expires_at=T0 + 300)
    other = a_cli_session(first, "another sign-in")
    assert first.note_exchanged_token(token, expires_at=T0 + 300, now=T0 + 1,
                                      session_hash=opened)
    assert not second.note_exchanged_token(token, expires_at=T0 + 300, now=T0 + 1,
                                           session_hash=digest("replay"))
    assert second.renew_exchanged_token(token, renewing=other, session_hash=digest("n1"),
                                        now=T0 + 1) is None
    renewed = digest("renewed")
    assert second.renew_exchanged_token(token, renewing=opened, session_hash=renewed,
                                        now=T0 + 1) == T0 + 300
    with pytest.raises(Unauthenticated) as ended:
        first.get_session(opened, now=T0 + 2)
    assert ended.value.detail["reason"] == "revoked"
    assert first.renew_exchanged_token(token, renewing=opened, session_hash=digest("n2"),
                                       now=T0 + 2) is None
    first.get_session(other, now=T0 + 2)  # a refused renewal ends nothing


def test_a_token_renews_no_expired_session_nor_one_it_did_not_open(
        store: HarbourStore) -> None:
    """The renewed session must be live: an expired one renews nothing; a token recorded
    with no session (exchanged before sessions were recorded) renews none."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    short = a_cli_session(store, "short", expires_at=T0 + 10)
    token = digest("a token of an expired sign-in")
    assert store.note_exchanged_token(token, expires_at=T0 + 300, now=T0, session_hash=short)
    assert store.renew_exchanged_token(token, renewing=short, session_hash=digest("n"),
                                       now=T0 + 10) is None
    old = digest("a token from before")
    live = a_cli_session(store, "live")
    assert store.note_exchanged_token(old, expires_at=T0 + 300, now=T0)
    assert store.renew_exchanged_token(old, renewing=live, session_hash=digest("m"),
                                       now=T0 + 1) is None


def test_a_command_lines_sign_in_is_ended_once_and_nothing_else_is(
        stores: StorePool) -> None:
    """end_cli_session ends a live command line's sign-in once, through any store on the
    location (the second finds none); an expired one, a console session (opened through
    the provider or with a token) and a hash nobody stored are not ended."""
    location = stores.location()
    first = stores.create(location)
    second = stores.open(location)
    first.add_principal("dave", ["approver"], actor="root", now=T0)
    live = a_cli_session(first, "live")
    assert first.end_cli_session(live, now=T0 + 1)
    assert not second.end_cli_session(live, now=T0 + 2)
    with pytest.raises(Unauthenticated) as ended:
        second.get_session(live, now=T0 + 2)
    assert ended.value.detail["reason"] == "revoked"
    short = a_cli_session(first, "short", expires_at=T0 + 10)
    assert not second.end_cli_session(short, now=T0 + 10)
    console = an_oidc_session(first, "console")
    token = digest("a token session")
    first.create_session(token, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0)
    for other in (console, token, digest("nobody's"), "not a hash"):
        assert not second.end_cli_session(other, now=T0 + 1), other
    for kept in (console, token):
        second.get_session(kept, now=T0 + 1)


def test_a_renewal_ends_only_a_live_sign_in_of_its_own_principal(store: HarbourStore) -> None:
    """A command line's session that `replaces` another ends it as it opens, when that one
    is a live command line's sign-in of the same principal; another principal's, a console
    session, an expired or ended one, or a hash nobody stored are left alone, and the new
    session opens all the same. Only a command line's session replaces one."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    store.add_principal("erin", ["approver"], actor="root", now=T0)
    theirs = digest("erin's sign-in")
    store.create_session(theirs, "erin", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0,
                         via="cli", roles=("approver",), roles_from="principal")
    console = an_oidc_session(store, "console")
    short = a_cli_session(store, "short", expires_at=T0 + 10)
    for other in (theirs, console, short, digest("nobody's")):
        renewal = digest(f"renewal of {other}")
        store.create_session(renewal, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                             now=T0 + 10, via="cli", roles=("approver",),
                             roles_from="principal", replaces=other)
        store.get_session(renewal, now=T0 + 11)
    for kept in (theirs, console):
        store.get_session(kept, now=T0 + 11)
    live = a_cli_session(store, "live")
    renewed = digest("renewed")
    store.create_session(renewed, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                         now=T0 + 1, via="cli", roles=("approver",), roles_from="principal",
                         replaces=live)
    with pytest.raises(Unauthenticated) as ended:
        store.get_session(live, now=T0 + 2)
    assert ended.value.detail["reason"] == "revoked"
    again = digest("renewed again")
    store.create_session(again, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR,
                         now=T0 + 2, via="cli", roles=("approver",), roles_from="principal",
                         replaces=live)  # already ended: nothing more ends
    for opened in (renewed, again):
        store.get_session(opened, now=T0 + 3)
    with pytest.raises(InvalidInput):
        store.create_session(digest("a console one"), "dave", csrf_secret="c" * 43,
                             expires_at=T0 + HOUR, now=T0, via="oidc", roles=("approver",),
                             roles_from="principal", replaces=renewed)


def an_oidc_session(store: HarbourStore, name: str, who: str = "dave") -> str:
    session = digest(name)
    store.create_session(session, who, csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0,
                         via="oidc", roles=("approver",), roles_from="principal",
                         oidc_subject=who, oidc_sid=f"sid-{name}")
    return session


def test_a_session_is_read_with_its_last_check(store: HarbourStore) -> None:
    """get_session answers when the session was last checked at the provider, in the
    same read (None before any check is recorded, and for a token session)."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    session = an_oidc_session(store, "read with its check")
    assert store.get_session(session, now=T0 + 1)[0].oidc_checked_at is None
    store.note_oidc_check(session, refresh_token="r1", checked_at=T0 + 2)
    assert store.get_session(session, now=T0 + 3)[0].oidc_checked_at == T0 + 2
    token = digest("a token session")
    store.create_session(token, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0)
    assert store.get_session(token, now=T0 + 3)[0].oidc_checked_at is None


def test_a_sessions_refresh_token_is_taken_once(store: HarbourStore) -> None:
    """At logout the refresh token a session kept is taken from the store: answered once,
    then gone (a second logout has nothing to revoke)."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    session = an_oidc_session(store, "logged out")
    store.note_oidc_check(session, refresh_token="r1", checked_at=T0)
    assert store.take_oidc_refresh_token(session) == "r1"
    assert store.take_oidc_refresh_token(session) is None
    assert store.take_oidc_refresh_token(digest("never noted")) is None


def test_a_sessions_check_is_claimed_once_when_due(stores: StorePool) -> None:
    """Through two stores on one location (two processes): a check not yet due is claimed
    by neither; once due, by one only, which gets the refresh token; a session with no
    check recorded is due, with no token to check it by."""
    location = stores.location()
    first = stores.create(location)
    second = stores.open(location)
    first.add_principal("dave", ["approver"], actor="root", now=T0)
    session = an_oidc_session(first, "checked")
    first.note_oidc_check(session, refresh_token="r1", checked_at=T0)
    assert first.claim_oidc_check(session, due_before=T0 - 1, now=T0 + 10) is None
    claimed = second.claim_oidc_check(session, due_before=T0 + 60, now=T0 + 61)
    assert claimed is not None and claimed.refresh_token == "r1"
    assert first.claim_oidc_check(session, due_before=T0 + 60, now=T0 + 61) is None
    second.note_oidc_check(session, refresh_token="r2", checked_at=T0 + 62)
    again = first.claim_oidc_check(session, due_before=T0 + 200, now=T0 + 201)
    assert again is not None and again.refresh_token == "r2"
    never = first.claim_oidc_check(digest("never noted"), due_before=T0, now=T0 + 1)
    assert never is not None and never.refresh_token is None


def test_checks_of_ended_sessions_are_dropped(store: HarbourStore) -> None:
    """The refresh token of an ended session does not stay in the store: the next check
    recorded drops the checks of sessions that ended or expired."""
    store.add_principal("dave", ["approver"], actor="root", now=T0)
    ended, live = an_oidc_session(store, "ended"), an_oidc_session(store, "live")
    store.note_oidc_check(ended, refresh_token="gone", checked_at=T0)
    store.revoke_session(ended, now=T0 + 1)
    store.note_oidc_check(live, refresh_token="kept", checked_at=T0 + 2)
    with raw_tx(store) as tx:
        rows = tx.execute("SELECT session_hash, refresh_token FROM oidc_session_checks")
    assert [tuple(r) for r in rows] == [(live, "kept")]


def test_migration_11_makes_old_sessions_due_with_no_token(stores: StorePool) -> None:
    """A session opened through the provider before checks existed gets a check row from
    its start with no refresh token: its first check, once due, ends it."""
    location = stores.location()
    old = stores.create_at_version(location, 10)
    old.add_principal("dave", ["approver"], actor="root", now=T0)
    session = an_oidc_session(old, "old")
    token = digest("token session")
    old.create_session(token, "dave", csrf_secret="c" * 43, expires_at=T0 + HOUR, now=T0)
    old.close()
    store = stores.open(location)
    assert store.schema_version == schema.LATEST >= 11
    assert store.claim_oidc_check(session, due_before=T0 - 1, now=T0 + 1) is None
    claimed = store.claim_oidc_check(session, due_before=T0, now=T0 + 1)
    assert claimed is not None and claimed.refresh_token is None
    with raw_tx(store) as tx:
        rows = tx.execute("SELECT session_hash FROM oidc_session_checks")
    assert [tuple(r) for r in rows] == [(session,)]  # none for the token session
