"""A sign-in through the provider is checked again at the provider (issue 27): a user whose
groups no longer grant the role, whom the provider no longer knows, or whose provider
cannot be reached loses the console session at its next page once the check is due; a
principal whose role, key or principal is taken away loses it at the next page at once;
and the command line's stored sign-in is refused at its next renewal.

A check is due ``oidc.recheck_seconds`` after the last one. Rather than wait, a test
moves the session's last check back in the store (``oidc_session_checks.checked_at``),
which is what the passing of that time looks like there; the provider, the refresh
grant and Chromium are real. Nothing is mocked.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harbour import MARQUE, TIMEOUT, cli_env

from marque.harbour.setup import revoke_principal, rotate_principal, set_roles

from .conftest import Console, World
from .oidc_world import (
    OidcWorld,
    back_at_console,
    confirm_device,
    make_oidc_world,
    sign_in,
)

Consoles = Callable[..., Console]
RECHECK = 60
REFRESHED = "grant.success refresh_token marque-console"


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcWorld]:
    for made in make_oidc_world(tmp_path_factory.mktemp("oidc-recheck")):
        made.world.harbour.add("hal", "requester")
        made.world.harbour.add("ivy", "requester")
        made.provider.users.update({
            "hal": {"email": "hal@example.com", "groups": ["marque-approvers"]},
            "ivy": {"email": "ivy@example.com", "groups": ["marque-approvers"]}})
        made.provider.write_users()
        yield made


@pytest.fixture(scope="module")
def world(oidc: OidcWorld) -> World:
    return oidc.world


def groups_mode(oidc: OidcWorld) -> None:
    oidc.groups_mode_with("--recheck-seconds", str(RECHECK))


def checks(world: World, who: str) -> list[tuple[Any, ...]]:
    """``(refresh_token, checked_at, revoked_at)`` of ``who``'s console sessions."""
    with sqlite3.connect(world.store_path) as db:
        return db.execute("SELECT c.refresh_token, c.checked_at, s.revoked_at "
                          "FROM console_sessions s LEFT JOIN oidc_session_checks c "
                          "ON c.session_hash = s.session_hash WHERE s.principal = ? "
                          "AND s.via = 'oidc' ORDER BY s.created_at", (who,)).fetchall()


def time_passes(world: World, who: str) -> float:
    """Move ``who``'s last checks back past the interval: the next page checks again.
    The moved-to time."""
    with sqlite3.connect(world.store_path) as db:
        db.execute("UPDATE oidc_session_checks SET checked_at = checked_at - ? WHERE "
                   "session_hash IN (SELECT session_hash FROM console_sessions WHERE "
                   "principal = ?)", (RECHECK + 1, who))
        row = db.execute("SELECT max(c.checked_at) FROM oidc_session_checks c JOIN "
                         "console_sessions s ON s.session_hash = c.session_hash WHERE "
                         "s.principal = ?", (who,)).fetchone()
    return float(row[0])


def signed_in(oidc: OidcWorld, consoles: Consoles, who: str) -> Console:
    console = consoles(None)
    sign_in(console.page, who)
    back_at_console(console.page, oidc.world.url)
    return console


def ended(console: Console, reason: str) -> str:
    """Open the queue; it must be the login page saying why (``reason``): its message."""
    console.page.goto("/")
    assert f"why={reason}" in console.page.url, console.page.url
    return console.page.get_by_test_id("login-message").inner_text()


def test_a_due_check_keeps_a_session_the_provider_still_grants(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Gina's session keeps the provider's refresh token; once due, her next page checks
    it at the provider (a refresh grant) and, her group unchanged, she stays signed in and
    the check is recorded."""
    groups_mode(oidc)
    gina = signed_in(oidc, consoles, "gina")
    [(refresh, _, _)] = checks(oidc.world, "gina")[-1:]
    assert refresh, "the provider's refresh token is kept with the session"
    refreshed = oidc.provider.said(REFRESHED)
    gina.page.goto("/")
    assert oidc.provider.said(REFRESHED) == refreshed  # not due: no call to the provider
    moved = time_passes(oidc.world, "gina")
    gina.page.goto("/")
    assert gina.page.get_by_test_id("viewer").inner_text() == "gina"
    [(_, checked_at, revoked_at)] = checks(oidc.world, "gina")[-1:]
    assert checked_at > moved and revoked_at is None
    assert oidc.provider.said(REFRESHED) == refreshed + 1


def test_groups_that_no_longer_grant_the_role_end_the_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Hal is an approver through marque-approvers; the provider moves him to dev
    (requester only). Until the check is due his session goes on; at the check it ends,
    and the login page says his groups changed."""
    groups_mode(oidc)
    hal = signed_in(oidc, consoles, "hal")
    assert "approver" in hal.page.locator(".who .roles").inner_text()
    oidc.provider.users["hal"]["groups"] = ["dev"]
    oidc.provider.write_users()
    hal.page.goto("/")
    assert hal.page.get_by_test_id("viewer").inner_text() == "hal"  # not due yet
    time_passes(oidc.world, "hal")
    assert "groups" in ended(hal, "groups_changed")
    assert checks(oidc.world, "hal")[-1][2] is not None
    hal.page.goto("/")
    assert "why=revoked" in hal.page.url  # the session stays ended


def test_a_user_the_provider_no_longer_knows_loses_the_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """Ivy is removed at the provider: at the due check the provider refuses the refresh
    grant, and her session ends."""
    groups_mode(oidc)
    ivy = signed_in(oidc, consoles, "ivy")
    del oidc.provider.users["ivy"]
    oidc.provider.write_users()
    time_passes(oidc.world, "ivy")
    assert "no longer vouches" in ended(ivy, "provider_refused")
    assert checks(oidc.world, "ivy")[-1][2] is not None


def test_a_provider_that_cannot_be_reached_ends_a_due_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """The provider is down when Gina's check is due: an unconfirmed sign-in is not carried
    past its interval, so the session ends and the login page says why."""
    groups_mode(oidc)
    gina = signed_in(oidc, consoles, "gina")
    oidc.provider.stop()
    try:
        time_passes(oidc.world, "gina")
        assert "could not be reached" in ended(gina, "provider_unreachable")
        assert checks(oidc.world, "gina")[-1][2] is not None
    finally:
        oidc.provider.start()


def test_a_check_that_cannot_be_made_ends_the_session(
        oidc: OidcWorld, consoles: Consoles) -> None:
    """The client secret file turns readable by others (so the Harbourmaster will not use
    it) when Gina's check is due: nothing confirmed the sign-in, so the session ends, and
    the login page says it could not be checked."""
    groups_mode(oidc)
    gina = signed_in(oidc, consoles, "gina")
    oidc.secret_file.chmod(0o644)
    try:
        time_passes(oidc.world, "gina")
        assert "could not be checked" in ended(gina, "check_failed")
    finally:
        oidc.secret_file.chmod(0o600)


@pytest.mark.parametrize("taken", ["role", "key", "principal"])
def test_in_principal_mode_what_an_admin_takes_away_ends_the_session(
        oidc: OidcWorld, consoles: Consoles, taken: str) -> None:
    """Roles from the principal: taking Dave's approver role away, rotating his token, or
    revoking his principal ends his session opened through the provider at his next page,
    with no check due."""
    oidc.oidc_set()
    home = oidc.world.harbour.home
    dave = signed_in(oidc, consoles, "dave")
    try:
        if taken == "role":
            set_roles(home, "dave", ["requester"])
            ended(dave, "role_revoked")
        elif taken == "key":
            rotate_principal(home, "dave")
            ended(dave, "revoked")
        else:
            revoke_principal(home, "dave")
            ended(dave, "principal_revoked")
    finally:
        if taken == "role":
            set_roles(home, "dave", ["approver"])
        elif taken == "principal":
            oidc.world.harbour.add("dave", "approver")


def cli_login(oidc: OidcWorld, browser: Any, env: dict[str, str], who: str) -> dict[str, Any]:
    """`marque login --oidc`, confirmed in Chromium as ``who``: its JSON answer."""
    proc = subprocess.Popen([str(MARQUE), "login", "--harbour", oidc.world.url, "--oidc",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, env=env)
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
        verification = said.split("open ", 1)[1].split(" and confirm", 1)[0].strip()
        confirm_device(browser, verification, who)
        out, rest = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, rest)
    answer: dict[str, Any] = json.loads(out)
    return answer


def test_the_cli_sign_in_is_refused_at_its_renewal_once_groups_change(
        oidc: OidcWorld, browser: Any, tmp_path: Path) -> None:
    """In groups mode the command line's token lasts no longer than the recheck interval;
    once Gina's groups no longer grant a role, its renewal (a fresh ID token, exchanged)
    is refused, the command fails saying so, and the stored sign-in is dropped."""
    groups_mode(oidc)
    env = cli_env({"XDG_CONFIG_HOME": str(tmp_path / "config")})
    signed = cli_login(oidc, browser, env, "gina")
    assert signed["roles"] == ["approver"]
    stored = tmp_path / "config" / "marque" / "credentials.json"
    entry = json.loads(stored.read_text())["harbours"][oidc.world.url]
    assert entry["expires_at"] - entry["saved_at"] <= RECHECK
    oidc.provider.users["gina"]["groups"] = ["nobody"]
    oidc.provider.write_users()
    data = json.loads(stored.read_text())
    data["harbours"][oidc.world.url]["expires_at"] = 0  # the interval has passed
    stored.write_text(json.dumps(data))
    listed = subprocess.run([str(MARQUE), "requests", "list", "--harbour", oidc.world.url,
                             "--json"], capture_output=True, text=True, timeout=TIMEOUT,
                            env=env, stdin=subprocess.DEVNULL)
    assert listed.returncode != 0
    assert "oidc_subject_unknown" in listed.stdout + listed.stderr, listed
    assert oidc.world.url not in json.loads(stored.read_text())["harbours"]
    oidc.provider.users["gina"]["groups"] = ["marque-approvers"]
    oidc.provider.write_users()
