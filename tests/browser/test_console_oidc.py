"""Signing in to the console through a real OpenID provider, in Chromium (issue 27).

``oidc-provider`` runs on loopback (tests/browser/oidc_world.py); Chromium goes from the
console's login page to the provider's sign-in page and back through the authorization
code flow with PKCE. Each refusal is observed as the console shows it and as the store
keeps it: no session cookie, no session row. Nothing is mocked.
"""

from __future__ import annotations

import html
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import DEBIT
from support.wait import wait_until

from marque.harbour.setup import set_roles

from .conftest import Console, World
from .oidc_world import (
    CONSOLE_CLIENT,
    OTHER_CLIENT,
    SECRET,
    OidcWorld,
    back_at_console,
    make_oidc_world,
    sign_in,
)

Consoles = Callable[..., Console]


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcWorld]:
    yield from make_oidc_world(tmp_path_factory.mktemp("oidc"))


@pytest.fixture(scope="module")
def world(oidc: OidcWorld) -> World:
    return oidc.world


def sessions(world: World) -> list[tuple[Any, ...]]:
    with sqlite3.connect(world.store_path) as db:
        return db.execute("SELECT principal, via, roles, roles_from, revoked_at "
                          "FROM console_sessions ORDER BY created_at").fetchall()


def session_cookie(console: Console) -> dict[str, Any] | None:
    found = [c for c in console.context.cookies() if c["name"] == "marque_session"]
    return found[0] if found else None


def test_an_approver_signs_in_through_the_provider_and_approves(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Carol signs in at the provider, lands on the queue as carol (approver), and her
    approval through the console is recorded as hers."""
    world = oidc.world
    made = world.submit("alice", DEBIT, reason="signed in through the provider")
    carol = consoles(None)
    sign_in(carol.page, "carol")
    back_at_console(carol.page, world.url)
    assert carol.page.get_by_test_id("viewer").inner_text() == "carol"
    cookie = session_cookie(carol)
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ("carol", "oidc", '["approver"]', "principal", None) in sessions(world)
    carol.page.goto(f"/requests/{made['id']}")
    carol.page.get_by_label("Reason").fill("checked the preview")
    carol.page.get_by_test_id("approve").click()
    carol.page.wait_for_url(f"**/requests/{made['id']}?done=approved")
    approvals = world.request(made["id"])["resolutions"]
    assert [a["approver"] for a in approvals] == ["carol"], approvals


def test_an_unknown_subject_gets_a_clear_page_and_no_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Mallory is known to the provider but to no principal: the login page says so (403)
    and nobody holds a session for her."""
    before = sessions(oidc.world)
    mallory = consoles(None)
    sign_in(mallory.page, "mallory")
    error = mallory.page.get_by_test_id("error")
    assert "oidc_subject_unknown" in error.inner_text()
    assert "mallory" in error.inner_text()
    assert session_cookie(mallory) is None
    assert sessions(oidc.world) == before


def test_a_replayed_state_is_refused(oidc: OidcWorld, consoles: Consoles,
                                     browser: Any) -> None:
    """The callback URL of a finished sign-in, opened again (in the same browser, and in
    another), is refused: its state was used; no second session is made."""
    carol = consoles(None)
    callbacks: list[str] = []
    carol.page.on("request", lambda r: callbacks.append(r.url)
                  if "/oidc/callback" in r.url else None)
    sign_in(carol.page, "carol")
    back_at_console(carol.page, oidc.world.url)
    assert len(callbacks) == 1
    count = len(sessions(oidc.world))
    again = consoles(None)
    response = again.page.goto(callbacks[0])
    assert response is not None and response.status == 401
    assert "state" in again.page.get_by_test_id("error").inner_text()
    carol.page.goto(callbacks[0])
    assert "already used" in carol.page.get_by_test_id("error").inner_text()
    assert len(sessions(oidc.world)) == count
    assert session_cookie(again) is None


def test_logout_ends_the_signed_in_session(oidc: OidcWorld, consoles: Consoles) -> None:
    """Logging out of a session opened through the provider ends it in the store; the old
    cookie opens nothing; the page offers signing out at the provider too, after which
    the provider asks for the password again."""
    dave = consoles(None)
    sign_in(dave.page, "dave")
    back_at_console(dave.page, oidc.world.url)
    cookie = session_cookie(dave)
    assert cookie is not None
    dave.page.get_by_role("button", name="Log out").click()
    dave.page.wait_for_url("**/login?why=logged_out")
    link = dave.page.get_by_test_id("provider-logout")
    assert link.get_attribute("href").startswith(oidc.provider.issuer + "/session/end?")
    dave.context.add_cookies([cookie])
    dave.page.goto("/")
    assert "/login" in dave.page.url
    assert [s for s in sessions(oidc.world) if s[0] == "dave"][-1][4] is not None
    # Signing out at the provider too: the next sign-in asks for the password again.
    dave.page.goto("/login?why=logged_out")
    dave.page.get_by_test_id("provider-logout").click()
    dave.page.get_by_role("button", name="Yes, sign me out").click()
    dave.page.wait_for_url(f"{oidc.world.url}/login**")
    dave.page.get_by_test_id("oidc-sign-in").click()
    dave.page.locator("input[name=password]").wait_for()


def refresh_token_of(world: World, who: str) -> str | None:
    """The refresh token ``who``'s latest session opened through the provider keeps."""
    with sqlite3.connect(world.store_path) as db:
        row = db.execute("SELECT c.refresh_token FROM console_sessions s LEFT JOIN "
                         "oidc_session_checks c ON c.session_hash = s.session_hash WHERE "
                         "s.principal = ? AND s.via = 'oidc' ORDER BY s.created_at DESC",
                         (who,)).fetchone()
    return None if row is None else row[0]


def refresh_at_provider(oidc: OidcWorld, refresh_token: str) -> httpx.Response:
    """The console client's refresh grant at the provider, as the Harbourmaster makes it."""
    settings = httpx.get(oidc.provider.issuer + "/.well-known/openid-configuration").json()
    return httpx.post(settings["token_endpoint"], auth=(CONSOLE_CLIENT, SECRET), data={
        "grant_type": "refresh_token", "refresh_token": refresh_token})


def test_logout_revokes_the_refresh_token_at_the_provider(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Logging out revokes the session's refresh token at the provider (RFC 7009): the
    provider then refuses it, while another sign-in's refresh token still works there;
    the store keeps it no longer."""
    carol, dave = consoles(None), consoles(None)
    for console, who in ((carol, "carol"), (dave, "dave")):
        sign_in(console.page, who)
        back_at_console(console.page, oidc.world.url)
    kept = refresh_token_of(oidc.world, "carol")
    other = refresh_token_of(oidc.world, "dave")
    assert kept and other
    carol.page.get_by_role("button", name="Log out").click()
    carol.page.wait_for_url("**/login?why=logged_out")
    refused = refresh_at_provider(oidc, kept)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant", \
        refused.text
    assert refresh_token_of(oidc.world, "carol") is None
    assert refresh_at_provider(oidc, other).status_code == 200  # not revoked: not logged out
    dave.page.get_by_role("button", name="Log out").click()  # leaves no session behind
    dave.page.wait_for_url("**/login?why=logged_out")


def test_a_revocation_that_fails_still_logs_out(own_oidc: OidcWorld, browser: Any) -> None:
    """With the provider down, logging out still ends the console session (the old cookie
    opens nothing), and the failure to revoke is logged."""
    carol = Console(browser, own_oidc.world, None)
    try:
        sign_in(carol.page, "carol")
        back_at_console(carol.page, own_oidc.world.url)
        cookie = session_cookie(carol)
        assert cookie is not None
        own_oidc.provider.stop()
        carol.page.get_by_role("button", name="Log out").click()
        carol.page.wait_for_url("**/login?why=logged_out")
        carol.context.add_cookies([cookie])
        carol.page.goto("/")
        assert "/login" in carol.page.url
        assert sessions(own_oidc.world)[-1][4] is not None
        assert "refresh token was not revoked" in own_oidc.world.server.logged()
    finally:
        carol.close()


def test_a_role_revoked_ends_the_session_at_the_next_request(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Erin (requester and approver) signs in; an admin takes her approver role away; her
    next page is the login page saying why."""
    erin = consoles(None)
    sign_in(erin.page, "erin")
    back_at_console(erin.page, oidc.world.url)
    set_roles(oidc.world.harbour.home, "erin", ["requester"])
    erin.page.goto("/")
    assert "why=role_revoked" in erin.page.url
    assert "revoked" in erin.page.get_by_test_id("login-message").inner_text()
    set_roles(oidc.world.harbour.home, "erin", ["requester", "approver"])


def test_roles_from_the_groups_claim(oidc: OidcWorld, consoles: Consoles) -> None:
    """With a groups mapping, Gina (a requester in Marque) is an approver through her
    provider group, and may approve; Carol, in no mapped group, gets no session."""
    oidc.groups_mode()
    try:
        world = oidc.world
        made = world.submit("alice", DEBIT, reason="gina approves")
        gina = consoles(None)
        sign_in(gina.page, "gina")
        back_at_console(gina.page, world.url)
        assert "approver" in gina.page.locator(".who .roles").inner_text()
        gina.page.goto(f"/requests/{made['id']}")
        gina.page.get_by_label("Reason").fill("fine by the group")
        gina.page.get_by_test_id("approve").click()
        gina.page.wait_for_url(f"**/requests/{made['id']}?done=approved")
        assert [a["approver"] for a in world.request(made["id"])["resolutions"]] == ["gina"]
        carol = consoles(None)
        sign_in(carol.page, "carol")
        assert "oidc_subject_unknown" in carol.page.get_by_test_id("error").inner_text()
        assert session_cookie(carol) is None
    finally:
        oidc.oidc_set()


def test_token_login_is_off_when_required(oidc: OidcWorld, consoles: Consoles) -> None:
    """With --require, the token form is gone, a posted token is refused
    (token_login_disabled) and token sessions end; without it, break-glass works again."""
    admin = consoles("admin")
    oidc.oidc_set("--require")
    try:
        admin.page.goto("/")
        assert "/login" in admin.page.url
        assert admin.page.get_by_test_id("token-login-off").count() == 1
        answer = oidc.world.server.call("POST", "/login", data={"token": "x", "csrf": "y"})
        assert answer.status_code == 403 and "token_login_disabled" in answer.text
    finally:
        oidc.oidc_set()
    consoles("admin")  # break-glass: the token form works again


@pytest.fixture
def expired_world(tmp_path: Path) -> Iterator[OidcWorld]:
    """A provider whose clock runs five minutes behind and whose ID tokens live one minute:
    every ID token it issues has expired (past the Harbourmaster's minute of leeway) when
    it arrives, while the provider's own cookies (ten minutes) still work."""
    yield from make_oidc_world(tmp_path, clock_offset_seconds=-300, id_token_ttl=60)


def test_an_expired_id_token_is_refused(expired_world: OidcWorld, browser: Any) -> None:
    """The provider's (real, signed) ID token has expired by the Harbourmaster's clock: the
    login page says so and no session is made."""
    page_owner = Console(browser, expired_world.world, None)
    try:
        sign_in(page_owner.page, "carol")
        error = page_owner.page.get_by_test_id("error").inner_text()
        assert "oidc_login_refused" in error and "expired" in error, error
        assert session_cookie(page_owner) is None
        assert sessions(expired_world.world) == []
    finally:
        page_owner.close()


@pytest.fixture
def own_oidc(tmp_path: Path) -> Iterator[OidcWorld]:
    yield from make_oidc_world(tmp_path)


def test_a_key_rotation_at_the_provider(own_oidc: OidcWorld, browser: Any) -> None:
    """Carol signs in (the Harbourmaster fetches the JWKS); the provider rotates to a new
    key and drops the old; the next sign-in is signed with a kid the Harbourmaster has not
    seen, which it fetches once, and it succeeds."""
    first = Console(browser, own_oidc.world, None)
    second = Console(browser, own_oidc.world, None)
    try:
        sign_in(first.page, "carol")
        back_at_console(first.page, own_oidc.world.url)
        own_oidc.provider.rotate()
        sign_in(second.page, "carol")
        back_at_console(second.page, own_oidc.world.url)
        assert second.page.get_by_test_id("viewer").inner_text() == "carol"
        wait_until(lambda: len(sessions(own_oidc.world)) == 2, "two sessions", step=0.1)
    finally:
        first.close()
        second.close()


def test_signing_out_at_the_provider_ends_the_console_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Dave signs in; a forged logout token ends nothing; then he signs out at the provider
    (its end-session page): the provider's back-channel logout token reaches the
    Harbourmaster, which ends his session at once."""
    dave = consoles(None)
    sign_in(dave.page, "dave")
    back_at_console(dave.page, oidc.world.url)
    live = [s for s in sessions(oidc.world) if s[0] == "dave" and s[4] is None]
    assert len(live) == 1
    # A logout token the provider did not sign is refused, and ends nothing.
    forged = oidc.world.server.call("POST", "/oidc/backchannel-logout",
                                    data={"logout_token": "eyJhbGciOiJub25lIn0.e30."})
    assert forged.status_code == 400
    assert [s for s in sessions(oidc.world) if s[0] == "dave" and s[4] is None] == live
    dave.page.goto(oidc.provider.issuer + "/session/end")
    dave.page.get_by_role("button", name="Yes, sign me out").click()
    dave.page.wait_for_load_state()
    wait_until(lambda: not [
        s for s in sessions(oidc.world) if s[0] == "dave" and s[4] is None],
        "the session ended", step=0.1)
    dave.page.goto(oidc.world.url + "/")
    assert "why=revoked" in dave.page.url


def begun_by_hand(world: World, who: str) -> tuple[httpx.Client, str]:
    """The code flow up to the provider's redirect back, driven over plain HTTP (the
    provider's own sign-in form posted as a browser would): the client holding the
    sign-in's cookie, and the callback URL it was sent to but did not open."""
    http = httpx.Client(timeout=30)
    answer = http.get(world.url + "/login/oidc", follow_redirects=False)
    while "/oidc/callback" not in answer.headers.get("location", ""):
        if answer.status_code in (302, 303):
            answer = http.get(httpx.URL(str(answer.url)).join(answer.headers["location"]),
                              follow_redirects=False)
            continue
        action = re.search(r'<form[^>]*action="([^"]+)"', answer.text)
        assert action, answer.text[:500]
        answer = http.post(httpx.URL(str(answer.url)).join(html.unescape(action.group(1))),
                           data={"prompt": "login", "login": who, "password": "x"},
                           follow_redirects=False)
    return http, answer.headers["location"]


def test_a_callback_in_another_browser_is_refused(oidc: OidcWorld, browser: Any) -> None:
    """A sign-in begun in one browser whose callback is opened in another (how a forged
    login would plant the attacker's session on a victim) is refused there (`browser`),
    and the state is spent: the one who began cannot use it afterwards either."""
    world = oidc.world
    attacker, callback = begun_by_hand(world, "carol")
    victim = Console(browser, world, None)
    try:
        before = len(sessions(world))
        victim.page.goto(callback)
        error = victim.page.get_by_test_id("error").inner_text()
        assert "another browser" in error, error
        assert session_cookie(victim) is None
        again = attacker.get(callback)
        assert again.status_code == 401 and "already used" in again.text
        assert len(sessions(world)) == before
    finally:
        victim.close()
        attacker.close()


@pytest.fixture
def swapped(tmp_path: Path) -> Iterator[OidcWorld]:
    """A provider whose token endpoint answers the console's client with an ID token minted
    (and signed with its own key) for another client, ``other-app``: a substituted token."""
    yield from make_oidc_world(tmp_path, audience_swap={CONSOLE_CLIENT: OTHER_CLIENT})


def test_an_id_token_for_another_client_is_refused(swapped: OidcWorld, browser: Any) -> None:
    """The sign-in goes through the provider, but the ID token it answers is for another
    client: the login page says so (the audience), and no session is made."""
    page_owner = Console(browser, swapped.world, None)
    try:
        sign_in(page_owner.page, "carol")
        error = page_owner.page.get_by_test_id("error").inner_text()
        assert "oidc_login_refused" in error and OTHER_CLIENT in error, error
        assert session_cookie(page_owner) is None
        assert sessions(swapped.world) == []
    finally:
        page_owner.close()
