"""``marque harbour oidc set|show|clear`` against a real OpenID provider on loopback, and the
Harbourmaster's view of the provider's keys (issue 27).

Every refusal is a typed error with nothing written; discovery is read from the provider
itself; an unknown ``kid`` makes one JWKS refetch, and refetches are rate-limited.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.oidc_support import OidcProvider, device_client, web_client
from support.harbour import MARQUE, TIMEOUT, Harbour, cli_env

from marque.errors import OidcLoginRefused
from marque.harbour.oidc.provider import Provider, Providers


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    root = tmp_path_factory.mktemp("idp")
    running = OidcProvider(root, clients=[
        web_client("marque-console", "s" * 40, "http://127.0.0.1:9/oidc/callback"),
        device_client("marque-cli")], users={"carol": {"email": "carol@example.com"}})
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return Harbour(tmp_path / "harbour").home


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text("s" * 40 + "\n")
    os.chmod(path, 0o600)
    return path


def oidc(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MARQUE), "harbour", "oidc", *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=cli_env(),
                          stdin=subprocess.DEVNULL)


def shown(home: Path) -> object:
    proc = oidc("show", "--home", home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["oidc"]


def test_set_checks_the_provider_and_keeps_the_settings(
        provider: OidcProvider, home: Path, secret: Path) -> None:
    """With the provider reachable, set reads its discovery document and keeps the settings;
    show answers them (the secret's file, never the secret); clear forgets them."""
    proc = oidc("set", "--home", home, "--issuer", provider.issuer, "--client-id",
                "marque-console", "--client-secret-file", secret, "--cli-client-id",
                "marque-cli", "--subject-claim", "email", "--groups-claim", "groups",
                "--group-role", "ops=approver", "--group-role", "ops=auditor")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["provider"]["reachable"] is True
    assert result["provider"]["device_authorization_endpoint"].startswith(provider.issuer)
    kept = shown(home)
    assert isinstance(kept, dict)
    assert (kept["issuer"], kept["subject_claim"], kept["group_roles"]) == (
        provider.issuer, "email", {"ops": ["approver", "auditor"]})
    assert "s" * 40 not in json.dumps(kept)
    assert json.loads(oidc("clear", "--home", home).stdout) == {"cleared": True}
    assert shown(home) is None


@pytest.mark.parametrize(("args", "setting"), [
    (("--issuer", "http://idp.example.com"), "issuer"),
    (("--group-role", "ops=pilot", "--groups-claim", "groups"), "group_roles"),
    (("--group-role", "ops=approver"), "group_roles"),
    (("--subject-claim", "no spaces please"), "subject_claim"),
    (("--redirect-uri", "https://marque.example/elsewhere"), "redirect_uri"),
])
def test_bad_settings_are_refused_and_nothing_is_written(
        provider: OidcProvider, home: Path, secret: Path, args: tuple[str, ...],
        setting: str) -> None:
    """Each bad setting is oidc_config_invalid (exit 2) naming it; nothing is stored."""
    base = {"--issuer": provider.issuer, "--client-id": "marque-console",
            "--client-secret-file": str(secret)}
    given = dict(base)
    extra: list[str] = []
    for key, value in zip(args[::2], args[1::2], strict=True):
        if key in given:
            given[key] = value
        else:
            extra += [key, value]
    proc = oidc("set", "--home", home, *[x for kv in given.items() for x in kv], *extra)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)["error"] if proc.stdout.strip() else {}
    assert error.get("code") == "oidc_config_invalid", (proc.stdout, proc.stderr)
    assert error.get("detail", {}).get("setting") == setting or setting in proc.stdout
    assert shown(home) is None


def test_a_secret_file_others_may_read_is_refused(
        provider: OidcProvider, home: Path, secret: Path) -> None:
    os.chmod(secret, 0o644)
    proc = oidc("set", "--home", home, "--issuer", provider.issuer, "--client-id", "c",
                "--client-secret-file", secret)
    assert proc.returncode == 2 and "chmod 600" in proc.stdout, proc.stdout
    assert shown(home) is None


def test_an_issuer_the_provider_does_not_name_is_refused(
        provider: OidcProvider, home: Path, secret: Path) -> None:
    """The discovery document's issuer must be exactly the one given (no trailing slash
    tolerated: a mix-up is refused, not corrected)."""
    proc = oidc("set", "--home", home, "--issuer", provider.issuer + "/", "--client-id", "c",
                "--client-secret-file", secret)
    assert proc.returncode == 2 and "oidc_config_invalid" in proc.stdout, proc.stdout
    assert shown(home) is None


def test_require_with_an_unreachable_provider_is_refused(
        home: Path, secret: Path) -> None:
    """Turning token login off for a provider nobody can reach would lock approvers out."""
    proc = oidc("set", "--home", home, "--issuer", "http://127.0.0.1:9", "--client-id", "c",
                "--client-secret-file", secret, "--require")
    assert proc.returncode == 2 and "require" in proc.stdout, proc.stdout
    assert shown(home) is None
    unreachable = oidc("set", "--home", home, "--issuer", "http://127.0.0.1:9",
                       "--client-id", "c", "--client-secret-file", secret)
    assert unreachable.returncode == 0
    assert json.loads(unreachable.stdout)["provider"]["reachable"] is False


class Clock:
    """A clock the test moves by hand (the rate limit's only input)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_unknown_kid_makes_one_rate_limited_refetch(tmp_path: Path) -> None:
    """The first key lookup fetches the JWKS; an unknown kid refetches once, a second
    unknown kid within the interval fetches nothing; after a rotation at the provider the
    new kid is found by the next allowed refetch."""
    running = OidcProvider(tmp_path / "idp", clients=[device_client("c")], users={}).start()
    try:
        clock = Clock()
        keys = Provider(running.issuer, clock=clock, refetch_seconds=30)
        assert keys.key("k1")["kid"] == "k1" and keys.jwks_fetches == 1
        with pytest.raises(OidcLoginRefused):
            keys.key("made-up")
        assert keys.jwks_fetches == 2
        with pytest.raises(OidcLoginRefused):
            keys.key("made-up-too")
        assert keys.jwks_fetches == 2
        new_kid = running.rotate()
        with pytest.raises(OidcLoginRefused):
            keys.key(new_kid)  # still within the interval: not fetched
        clock.now += 30
        assert keys.key(new_kid)["kid"] == new_kid and keys.jwks_fetches == 3
    finally:
        running.stop()


def init(home: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MARQUE), "harbour", "init", "--home", str(home),
                           *map(str, args), "--json"], capture_output=True, text=True,
                          timeout=TIMEOUT, env=cli_env(), stdin=subprocess.DEVNULL)


def test_init_sets_the_provider_up_from_the_start(
        provider: OidcProvider, tmp_path: Path, secret: Path) -> None:
    """`harbour init --oidc-…` makes the Harbourmaster with its provider kept, as `oidc set`
    would keep it (token login off with --oidc-require, the interval given)."""
    home = tmp_path / "new-harbour"
    proc = init(home, "--oidc-issuer", provider.issuer, "--oidc-client-id", "marque-console",
                "--oidc-client-secret-file", secret, "--oidc-cli-client-id", "marque-cli",
                "--oidc-recheck-seconds", 120, "--oidc-require")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert made["admin_token"] and made["oidc"]["provider"]["reachable"] is True
    kept = shown(home)
    assert isinstance(kept, dict)
    assert (kept["issuer"], kept["cli_client_id"], kept["require"],
            kept["recheck_seconds"]) == (provider.issuer, "marque-cli", True, 120)


@pytest.mark.parametrize(("args", "setting"), [
    (["--oidc-client-id", "marque-console"], "issuer"),
    (["--oidc-client-id", "marque-console", "--oidc-client-secret-file", "SECRET",
      "--oidc-recheck-seconds", 5], "recheck_seconds"),
    (["--oidc-client-id", "marque-console", "--oidc-client-secret-file", "SECRET",
      "--oidc-group-role", "ops=pilot", "--oidc-groups-claim", "groups"], "group_roles"),
    (["--oidc-client-id", "marque-console", "--oidc-client-secret-file", "WORLD"],
     "client_secret_file"),
])
def test_init_refuses_what_oidc_set_refuses_and_makes_nothing(
        provider: OidcProvider, tmp_path: Path, secret: Path, args: list[object],
        setting: str) -> None:
    """Bad OIDC options to `harbour init` are `oidc_config_invalid` naming the setting, as
    `oidc set` says it, and no home is made (they are checked first)."""
    readable = tmp_path / "readable-secret"
    readable.write_text("s" * 40 + "\n")
    os.chmod(readable, 0o644)
    swap = {"SECRET": str(secret), "WORLD": str(readable)}
    given = [swap.get(str(a), a) for a in args]
    if setting != "issuer":
        given = ["--oidc-issuer", provider.issuer, *given]
    home = tmp_path / "not-made"
    proc = init(home, *given)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)["error"]
    assert (error["code"], error["detail"]["setting"]) == ("oidc_config_invalid", setting)
    assert not home.exists()
    # `oidc set` says the same of the same settings (one code path).
    if setting != "issuer":
        same = oidc("set", "--home", Harbour(tmp_path / "h").home,
                    *[str(a).replace("--oidc-", "--") for a in given])
        assert json.loads(same.stdout)["error"]["detail"]["setting"] == setting


def test_a_providers_calls_share_one_kept_client_closed_with_the_service(
        provider: OidcProvider) -> None:
    """Discovery, the JWKS and later calls go through one httpx client per provider, made
    at the first call; closing the providers (as the service closes) closes it."""
    providers = Providers()
    kept = providers.get(provider.issuer)
    assert kept.discovery().issuer == provider.issuer
    client = kept.client()
    assert kept.key("k1")["kid"] == "k1"
    assert providers.get(provider.issuer).client() is client and not client.is_closed
    providers.close()
    assert client.is_closed
