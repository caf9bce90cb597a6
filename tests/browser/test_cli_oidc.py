"""``marque login --oidc``: the command line signs in through the device authorization grant
at a real OpenID provider (oidc-provider on loopback), confirmed in Chromium (issue 27).

What it stores is the Harbourmaster's own short-lived token (``mqs_…``), in a 0600 file;
it authenticates API calls as the principal; ``marque logout`` removes it, ends it on the
Harbourmaster and revokes the provider's refresh token (and, with the provider down,
still removes it, saying so). A renewal ends the token it replaces. The exchange
refuses an ID token issued to another application (audience), and one exchanged twice.
Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import MARQUE, TIMEOUT, cli_env

from .oidc_world import (
    CLI_CLIENT,
    OTHER_CLIENT,
    OidcWorld,
    confirm_device,
    device_confirmed,
    device_tokens,
    make_oidc_world,
)


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcWorld]:
    yield from make_oidc_world(tmp_path_factory.mktemp("oidc-cli"))


def test_the_settings_name_the_providers_endpoints(oidc: OidcWorld) -> None:
    """`GET /v1/oidc` names the provider's device, token and revocation endpoints, as its
    discovery document does (the last is where `marque logout` revokes)."""
    discovery = httpx.get(oidc.provider.issuer + "/.well-known/openid-configuration").json()
    settings = httpx.get(oidc.world.url + "/v1/oidc").json()
    assert settings["client_id"] == CLI_CLIENT and settings["refresh"] is True
    for member in ("device_authorization_endpoint", "token_endpoint", "revocation_endpoint"):
        assert settings[member] == discovery[member], member
    assert settings["revocation_endpoint"].startswith(oidc.provider.issuer)


def cli_login(oidc: OidcWorld, browser: Any, env: dict[str, str],
              who: str) -> dict[str, Any]:
    """`marque login --oidc --json` in ``env``, its device code confirmed in a browser as
    ``who``; its answer."""
    proc = subprocess.Popen([str(MARQUE), "login", "--harbour", oidc.world.url, "--oidc",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, env=env)
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()
        assert "To sign in, open" in said, said
        verification = said.split("open ", 1)[1].split(" and confirm", 1)[0].strip()
        assert verification.startswith(oidc.provider.issuer + "/device")
        confirm_device(browser, verification, who)
        out, rest = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, rest)
    result: dict[str, Any] = json.loads(out)
    return result


def test_the_cli_signs_in_with_the_device_flow_and_logs_out(
        oidc: OidcWorld, browser: Any, tmp_path: Path) -> None:
    """`marque login --oidc` prints a URL and a code; once Carol confirms them in a browser
    it stores a token of the Harbourmaster's (0600) that authenticates as carol; once it
    has expired a command renews it with the refresh token (the token it replaced is then
    401); `marque logout` removes it."""
    config = tmp_path / "config"
    env = cli_env({"XDG_CONFIG_HOME": str(config)})
    url = oidc.world.url
    result = cli_login(oidc, browser, env, "carol")
    assert (result["principal"], result["roles"]) == ("carol", ["approver"])
    stored = config / "marque" / "credentials.json"
    assert stat.S_IMODE(os.stat(stored).st_mode) == 0o600
    entry = json.loads(stored.read_text())["harbours"][url]
    assert entry["token"].startswith("mqs_") and entry["via"] == "oidc"
    assert entry["expires_at"] == result["expires_at"]
    who = oidc.world.server.call("GET", "/v1/whoami", entry["token"])
    assert who.status_code == 200 and who.json()["name"] == "carol"
    # The token is the command line's: it opens no console page.
    page = oidc.world.server.call("GET", "/", cookies={"marque_session": entry["token"]},
                                  follow_redirects=False)
    assert page.status_code == 303 and "/login" in page.headers["location"]
    # An hour later (the stored expiry moved back to say so), a command renews the sign-in
    # by itself with the provider's refresh token, and keeps the new token.
    assert entry["refresh_token"]  # renewed at once: the same ID token back is accepted too
    data = json.loads(stored.read_text())
    data["harbours"][url]["expires_at"] = 0
    stored.write_text(json.dumps(data))
    listed = subprocess.run([str(MARQUE), "requests", "list", "--harbour", url, "--json"],
                            capture_output=True, text=True, timeout=TIMEOUT, env=env,
                            stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, (listed.stdout, listed.stderr)
    renewed = json.loads(stored.read_text())["harbours"][url]
    assert renewed["token"].startswith("mqs_") and renewed["token"] != entry["token"]
    assert renewed["expires_at"] > entry["expires_at"] - 5
    assert oidc.world.server.call("GET", "/v1/whoami", renewed["token"]).json()["name"] \
        == "carol"
    # The renewal ended the token it replaced, on the server.
    replaced = oidc.world.server.call("GET", "/v1/whoami", entry["token"])
    assert replaced.status_code == 401 and replaced.json()["code"] == "unauthenticated"
    answer = json.loads(logout(env, url, "--json").stdout)
    assert answer["removed"] == [url] and answer["revocations"][0]["revoked"] is True
    assert url not in json.loads(stored.read_text())["harbours"]


def stored_entry(config: Path, url: str) -> dict[str, Any] | None:
    """What `marque login` keeps for ``url`` under the configuration directory ``config``."""
    found: dict[str, Any] | None = json.loads(
        (config / "marque" / "credentials.json").read_text())["harbours"].get(url)
    return found


def refresh_at_provider(oidc: OidcWorld, refresh_token: str) -> httpx.Response:
    """The command line's refresh grant at the provider (the public client: no secret)."""
    settings = httpx.get(oidc.provider.issuer + "/.well-known/openid-configuration").json()
    return httpx.post(settings["token_endpoint"], data={
        "grant_type": "refresh_token", "refresh_token": refresh_token,
        "client_id": CLI_CLIENT})


def logout(env: dict[str, str], url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`marque logout --harbour URL` in ``env`` (it must exit 0)."""
    proc = subprocess.run([str(MARQUE), "logout", "--harbour", url, *extra],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc


def test_logout_revokes_the_refresh_token_at_the_provider(
        oidc: OidcWorld, browser: Any, tmp_path: Path) -> None:
    """`marque logout` of a sign-in through the provider ends its `mqs_` token on the
    Harbourmaster (which then answers it 401 `unauthenticated`) and revokes its refresh
    token there (RFC 7009): the provider then refuses it (`invalid_grant`), and the entry
    is gone."""
    config = tmp_path / "config"
    env = cli_env({"XDG_CONFIG_HOME": str(config)})
    url = oidc.world.url
    cli_login(oidc, browser, env, "dave")
    entry = stored_entry(config, url)
    assert entry is not None and entry["refresh_token"]
    assert oidc.world.server.call("GET", "/v1/whoami", entry["token"]).status_code == 200
    answer = json.loads(logout(env, url, "--json").stdout)
    assert answer == {"removed": [url], "sessions": [
        {"harbour": url, "ended": True, "code": None, "message": None}], "revocations": [
        {"harbour": url, "revoked": True, "code": None, "message": None}]}, answer
    assert stored_entry(config, url) is None
    # The Harbourmaster's token ended on the server, not only here.
    after = oidc.world.server.call("GET", "/v1/whoami", entry["token"])
    assert after.status_code == 401 and after.json()["code"] == "unauthenticated", after.text
    refused = refresh_at_provider(oidc, entry["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant", \
        refused.text


@pytest.fixture
def own_oidc(tmp_path: Path) -> Iterator[OidcWorld]:
    """A world of its own, whose provider a test may stop."""
    yield from make_oidc_world(tmp_path / "world")


def test_logout_with_the_provider_down_still_forgets_the_sign_in(
        own_oidc: OidcWorld, browser: Any, tmp_path: Path) -> None:
    """With the provider stopped, `marque logout` still removes the entry and exits 0; it
    says the refresh token was not revoked: `revoked: false` and the reason in `--json`
    (and a warning event on stderr), a warning on stderr otherwise."""
    url = own_oidc.world.url
    configs = [tmp_path / "json", tmp_path / "human"]
    envs = [cli_env({"XDG_CONFIG_HOME": str(config)}) for config in configs]
    for env in envs:
        cli_login(own_oidc, browser, env, "carol")
    own_oidc.provider.stop()
    proc = logout(envs[0], url, "--json")
    answer = json.loads(proc.stdout)
    assert answer["removed"] == [url]
    [revocation] = answer["revocations"]
    assert revocation["harbour"] == url and revocation["revoked"] is False
    assert revocation["code"] == "oidc_provider_unavailable", revocation
    assert revocation["message"]
    [warning] = [json.loads(line) for line in proc.stderr.splitlines()]
    assert warning["event"] == "warning" and warning["code"] == "oidc_provider_unavailable"
    assert stored_entry(configs[0], url) is None
    assert answer["sessions"] == [{"harbour": url, "ended": True, "code": None,
                                   "message": None}], answer
    proc = logout(envs[1], url)
    assert proc.stdout.splitlines() == [f"logged out of {url}",
                                        f"the Harbourmaster's token for {url} is ended"], \
        proc.stdout
    assert "warning" in proc.stderr and "was not revoked" in proc.stderr, proc.stderr
    assert stored_entry(configs[1], url) is None


def test_logout_with_the_harbourmaster_silent_still_forgets_the_sign_in(
        tmp_path: Path) -> None:
    """A Harbourmaster that takes the connection and never answers does not hold a logout
    up (ending its token and the revocation's ask each have a timeout of their own): both
    logins are removed (a principal's token, which has nothing to end or revoke, and a
    sign-in through the provider, `ended: false` and `revoked: false`,
    `harbour_unavailable`)."""
    config = tmp_path / "config"
    (config / "marque").mkdir(parents=True, mode=0o700)
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts nor answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        stored = config / "marque" / "credentials.json"
        stored.write_text(json.dumps({"version": "marque-credentials/0.1", "harbours": {
            url: {"token": "mqs_x", "via": "oidc", "expires_at": time.time() + 300,
                  "saved_at": time.time(), "refresh_token": "a-refresh-token"},
            "http://127.0.0.1:9": {"token": "mqp_x", "saved_at": time.time()}}}))
        os.chmod(stored, 0o600)
        env = cli_env({"XDG_CONFIG_HOME": str(config)})
        proc = subprocess.run([str(MARQUE), "logout", "--json"], capture_output=True,
                              text=True, timeout=TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    finally:
        silent.close()
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    answer = json.loads(proc.stdout)
    assert answer["removed"] == sorted([url, "http://127.0.0.1:9"])
    [revocation] = answer["revocations"]
    assert (revocation["harbour"], revocation["revoked"], revocation["code"]) \
        == (url, False, "harbour_unavailable"), revocation
    [session] = answer["sessions"]
    assert (session["harbour"], session["ended"], session["code"]) \
        == (url, False, "harbour_unavailable"), session
    warned = [json.loads(line)["code"] for line in proc.stderr.splitlines()]
    assert warned == ["harbour_unavailable", "harbour_unavailable"], proc.stderr
    assert json.loads(stored.read_text())["harbours"] == {}


def test_the_logout_endpoint_ends_only_a_command_lines_own_sign_in(
        oidc: OidcWorld, browser: Any) -> None:
    """`POST /v1/oidc/logout` with an `mqs_` token ends that sign-in (`ended: true`), and
    again answers `ended: false` (idempotent); without a token, or with one nobody issued,
    it is 401 `unauthenticated`; a principal's own token is no sign-in: 400
    `input_invalid`, and it still works."""
    tokens = device_tokens(oidc.provider, CLI_CLIENT, browser, "dave")
    signed = exchange(oidc, tokens["id_token"]).json()
    call = oidc.world.server.call
    ended = call("POST", "/v1/oidc/logout", signed["token"])
    assert ended.status_code == 200 and ended.json() == {"ended": True}, ended.text
    assert call("GET", "/v1/whoami", signed["token"]).status_code == 401
    again = call("POST", "/v1/oidc/logout", signed["token"])
    assert again.status_code == 200 and again.json() == {"ended": False}, again.text
    nobody = call("POST", "/v1/oidc/logout")
    assert nobody.status_code == 401 and nobody.json()["code"] == "unauthenticated"
    forged = call("POST", "/v1/oidc/logout", "mqp_nobody-issued-this")
    assert forged.status_code == 401 and forged.json()["code"] == "unauthenticated"
    own = call("POST", "/v1/oidc/logout", oidc.world.token("carol"))
    assert own.status_code == 400, own.text
    assert own.json()["code"] == "input_invalid" and own.json()["token"] == "principal"
    assert call("GET", "/v1/whoami", oidc.world.token("carol")).status_code == 200


def test_an_id_token_for_another_audience_is_refused(oidc: OidcWorld, browser: Any) -> None:
    """An ID token the provider issued to another application (a real one, for Carol) is
    refused by the exchange: its audience is not the Harbourmaster's command-line client."""
    tokens = device_tokens(oidc.provider, OTHER_CLIENT + "-cli", browser, "carol")
    answer = oidc.world.server.call("POST", "/v1/oidc/exchange",
                                    json={"id_token": tokens["id_token"]})
    assert answer.status_code == 401, answer.text
    problem = answer.json()
    assert problem["code"] == "oidc_login_refused" and problem["check"] == "audience"


def test_an_id_token_is_exchanged_once(oidc: OidcWorld, browser: Any) -> None:
    """The command line's own ID token is exchanged once; the same token again is refused
    (check `replayed`), so a copy of it is worth nothing after its first use."""
    tokens = device_tokens(oidc.provider, CLI_CLIENT, browser, "dave")
    first = oidc.world.server.call("POST", "/v1/oidc/exchange",
                                   json={"id_token": tokens["id_token"]})
    assert first.status_code == 200, first.text
    assert first.json()["principal"] == "dave"
    again = oidc.world.server.call("POST", "/v1/oidc/exchange",
                                   json={"id_token": tokens["id_token"]})
    assert again.status_code == 401 and again.json()["check"] == "replayed", again.text


def test_an_unknown_subject_cannot_exchange(oidc: OidcWorld, browser: Any) -> None:
    """Mallory's real ID token for the command line's client names no principal: 403."""
    tokens = device_tokens(oidc.provider, CLI_CLIENT, browser, "mallory")
    answer = oidc.world.server.call("POST", "/v1/oidc/exchange",
                                    json={"id_token": tokens["id_token"]})
    assert answer.status_code == 403 and answer.json()["code"] == "oidc_subject_unknown"


def exchange(oidc: OidcWorld, id_token: str, renews: str | None = None) -> Any:
    """``POST /v1/oidc/exchange`` of ``id_token`` (renewing the sign-in ``renews``)."""
    body = {"id_token": id_token, **({"renews": renews} if renews else {})}
    return oidc.world.server.call("POST", "/v1/oidc/exchange", json=body)


def test_a_renewal_answered_the_same_id_token_is_accepted_and_a_replayed_login_is_not(
        oidc: OidcWorld, browser: Any) -> None:
    """The provider's refresh grant, in the second its sign-in was issued, answers the
    very same ID token. Exchanged again as a login it is refused (`replayed`); as the
    renewal of the sign-in it opened it is accepted, once: the renewed token stops
    working, the new one lasts no longer, and that sign-in cannot be renewed again."""
    settings, device_code = device_confirmed(oidc.provider, CLI_CLIENT, browser, "dave",
                                             "openid email offline_access")
    time.sleep(1.02 - time.time() % 1)  # both grants at the start of one second
    signed = httpx.post(settings["token_endpoint"], data={
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "device_code": device_code, "client_id": CLI_CLIENT}).json()
    refreshed = httpx.post(settings["token_endpoint"], data={
        "grant_type": "refresh_token", "refresh_token": signed["refresh_token"],
        "client_id": CLI_CLIENT}).json()
    assert refreshed["id_token"] == signed["id_token"], "not answered within one second"
    login = exchange(oidc, signed["id_token"])
    assert login.status_code == 200, login.text
    first = login.json()
    replayed = exchange(oidc, refreshed["id_token"])
    assert replayed.status_code == 401 and replayed.json()["check"] == "replayed"
    stranger = exchange(oidc, refreshed["id_token"], renews="mqs_not-a-sign-in")
    assert stranger.status_code == 401 and stranger.json()["check"] == "replayed"
    renewal = exchange(oidc, refreshed["id_token"], renews=first["token"])
    assert renewal.status_code == 200, renewal.text
    second = renewal.json()
    assert second["principal"] == "dave" and second["token"] != first["token"]
    assert second["expires_at"] <= first["expires_at"]
    whoami = oidc.world.server.call
    assert whoami("GET", "/v1/whoami", second["token"]).json()["name"] == "dave"
    assert whoami("GET", "/v1/whoami", first["token"]).status_code == 401
    again = exchange(oidc, refreshed["id_token"], renews=first["token"])
    assert again.status_code == 401 and again.json()["check"] == "replayed"
    assert exchange(oidc, signed["id_token"]).json()["check"] == "replayed"


def test_a_renewal_with_a_new_id_token_ends_the_sign_in_it_replaces(
        oidc: OidcWorld, browser: Any) -> None:
    """A renewal whose refresh grant brings a new ID token is a new sign-in, and the one its
    `renews` names ends as it opens (401 from then on). A `renews` naming no sign-in is
    accepted as a fresh sign-in would be, and ends nothing."""
    settings, device_code = device_confirmed(oidc.provider, CLI_CLIENT, browser, "dave",
                                             "openid email offline_access")
    signed = httpx.post(settings["token_endpoint"], data={
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "device_code": device_code, "client_id": CLI_CLIENT}).json()
    first = exchange(oidc, signed["id_token"]).json()
    refresh = signed["refresh_token"]
    answers = []
    for renews in ("mqs_not-a-sign-in", first["token"]):
        time.sleep(1.02 - time.time() % 1)  # a later second: a new ID token
        refreshed = refresh_at_provider(oidc, refresh).json()
        assert refreshed["id_token"] != signed["id_token"]
        refresh = refreshed.get("refresh_token") or refresh
        renewal = exchange(oidc, refreshed["id_token"], renews=renews)
        assert renewal.status_code == 200, renewal.text
        answers.append(renewal.json())
        still = oidc.world.server.call("GET", "/v1/whoami", first["token"])
        assert still.status_code == (200 if renews != first["token"] else 401), still.text
    stranger, second = answers
    call = oidc.world.server.call
    ended = call("GET", "/v1/whoami", first["token"])
    assert ended.json()["code"] == "unauthenticated"
    for token in (stranger["token"], second["token"]):
        assert call("GET", "/v1/whoami", token).json()["name"] == "dave"
