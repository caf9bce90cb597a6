"""A console world signing in through a real OpenID provider (tests/e2e/oidc_support.py).

The world of ``conftest.make_world`` (a Harbourmaster, a joined Pilot, principals), plus
``oidc-provider`` on loopback with a confidential client ``marque-console`` whose
redirect URI is this Harbourmaster's ``/oidc/callback``, a public device client
``marque-cli``, a second web client ``other-app`` (another application at the same
provider), and users: ``carol`` and ``dave`` (approvers in Marque), ``alice`` (the
requester), ``gina`` (a requester in Marque, in the provider's ``marque-approvers``
group) and ``mallory`` (known to the provider, no principal). The settings are made
with ``marque harbour oidc set``, the command an admin runs.
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.oidc_support import OidcProvider, device_client, web_client
from support.harbour import MARQUE, TIMEOUT, cli_env

from .conftest import World, make_world

CONSOLE_CLIENT = "marque-console"
CLI_CLIENT = "marque-cli"
OTHER_CLIENT = "other-app"
SECRET = "console-client-secret-0123456789abcdef"
USERS = {
    "carol": {"email": "carol@example.com", "groups": ["ops"]},
    "dave": {"email": "dave@example.com", "groups": ["ops"]},
    "alice": {"email": "alice@example.com", "groups": ["dev"]},
    "gina": {"email": "gina@example.com", "groups": ["marque-approvers"]},
    "mallory": {"email": "mallory@example.com", "groups": ["marque-approvers"]},
    "erin": {"email": "erin@example.com", "groups": []},
}


@dataclass
class OidcWorld:
    """The console world and its provider."""

    world: World
    provider: OidcProvider
    secret_file: Path

    def oidc_set(self, *extra: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        """``marque harbour oidc set`` for this world's provider, plus ``extra``."""
        proc = subprocess.run(
            [str(MARQUE), "harbour", "oidc", "set", "--home", str(self.world.harbour.home),
             "--issuer", self.provider.issuer, "--client-id", CONSOLE_CLIENT,
             "--client-secret-file", str(self.secret_file), "--cli-client-id", CLI_CLIENT,
             "--json", *extra],
            capture_output=True, text=True, timeout=TIMEOUT, env=cli_env(),
            stdin=subprocess.DEVNULL)
        assert proc.returncode == expect, (proc.stdout, proc.stderr)
        return proc

    def groups_mode(self) -> None:
        """Roles from the provider's ``groups`` claim: marque-approvers → approver."""
        self.groups_mode_with()

    def groups_mode_with(self, *extra: str) -> None:
        """:meth:`groups_mode`, plus ``extra`` options of ``harbour oidc set``."""
        self.oidc_set("--groups-claim", "groups", "--group-role", "marque-approvers=approver",
                      "--group-role", "dev=requester", "--scope", "groups", *extra)


def make_oidc_world(root: Path, **provider_args: Any) -> Iterator[OidcWorld]:
    """Build a world, start its provider, configure the Harbourmaster for it."""
    for world in make_world(root):
        world.harbour.add("gina", "requester")
        redirect = world.url + "/oidc/callback"
        provider = OidcProvider(
            root / "provider",
            clients=[web_client(CONSOLE_CLIENT, SECRET, redirect,
                                backchannel_logout_uri=world.url + "/oidc/backchannel-logout",
                                backchannel_logout_session_required=True,
                                post_logout_redirect_uris=[world.url + "/login"]),
                     web_client(OTHER_CLIENT, "other-secret-0123456789abcdef0123",
                                "http://127.0.0.1:9/callback"),
                     device_client(CLI_CLIENT), device_client(OTHER_CLIENT + "-cli")],
            users=copy.deepcopy(USERS), **provider_args)
        provider.start()
        try:
            secret_file = root / "client-secret"
            secret_file.write_text(SECRET + "\n")
            os.chmod(secret_file, 0o600)
            oidc = OidcWorld(world, provider, secret_file)
            oidc.oidc_set()
            yield oidc
        finally:
            provider.stop()


def sign_in(page: Any, who: str, *, next_path: str = "/") -> None:
    """Sign in through the provider's own page as ``who`` (from the console's login page),
    and wait to be back at the console."""
    page.goto(f"/login?next={next_path}")
    page.get_by_role("button", name="Sign in with your identity provider").click()
    page.wait_for_load_state()
    if page.locator("input[name=login]").count() == 0:
        raise AssertionError(f"not the provider's sign-in page: {page.url}\n"
                             f"{page.content()[:3000]}")
    page.locator("input[name=login]").fill(who)
    page.locator("input[name=password]").fill("any password")
    page.get_by_role("button", name="Sign-in").click()


def back_at_console(page: Any, url: str) -> None:
    """Wait until the page is the console's queue at ``url``; fail showing where it is."""
    try:
        page.wait_for_url(url + "/", timeout=10_000)
    except Exception as exc:
        raise AssertionError(f"not back at the console: {page.url}\n"
                             f"{page.inner_text('body')[:1500]}") from exc


def confirm_device(browser: Any, url: str, who: str) -> None:
    """In a browser of its own, confirm a device code at ``url`` and sign in as ``who``."""
    context = browser.new_context()
    try:
        context.set_default_timeout(15_000)
        page = context.new_page()
        page.goto(url)
        page.get_by_role("button", name="Continue").click()
        page.locator("input[name=login]").fill(who)
        page.locator("input[name=password]").fill("any password")
        page.get_by_role("button", name="Sign-in").click()
        page.get_by_text("Sign-in Success").wait_for()
    finally:
        context.close()


def device_confirmed(provider: OidcProvider, client_id: str, browser: Any, who: str,
                     scope: str = "openid email") -> tuple[dict[str, Any], str]:
    """The device authorization grant for ``client_id``, confirmed in a browser as ``who``,
    done by hand (as any other application would): the provider's discovery document and
    the device code, ready to be redeemed at its token endpoint."""
    import httpx

    settings = httpx.get(provider.issuer + "/.well-known/openid-configuration").json()
    grant = httpx.post(settings["device_authorization_endpoint"],
                       data={"client_id": client_id, "scope": scope}).json()
    confirm_device(browser, grant["verification_uri_complete"], who)
    return settings, str(grant["device_code"])


def device_tokens(provider: OidcProvider, client_id: str, browser: Any,
                  who: str) -> dict[str, Any]:
    """:func:`device_confirmed`, redeemed: the provider's token answer."""
    import httpx

    settings, device_code = device_confirmed(provider, client_id, browser, who)
    answer = httpx.post(settings["token_endpoint"], data={
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "device_code": device_code, "client_id": client_id})
    assert answer.status_code == 200, answer.text
    tokens: dict[str, Any] = answer.json()
    return tokens
