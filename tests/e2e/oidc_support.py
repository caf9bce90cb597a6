"""A real OpenID provider on loopback for the OIDC tests: panva's ``oidc-provider`` in node.

:class:`OidcProvider` writes the JSON config ``tests/oidc/provider.mjs`` reads (clients,
users with ``sub``/``email``/``groups`` claims, signing keys, the provider's clock offset),
starts ``node`` on a free loopback port and waits for it to say it listens. Rotating its
key is what a real provider does: :meth:`OidcProvider.rotate` restarts it on the same
issuer with a new signing key first (the old one, if kept, only published). The package is
installed by ``scripts/ensure-oidc-provider`` under ``.cache/oidc-provider``; a test that
needs it and finds it missing fails and says how to install it. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joserfc.jwk import RSAKey
from support.harbour import TIMEOUT, free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "oidc" / "provider.mjs"
MODULES = Path(os.environ.get("MARQUE_OIDC_MODULES",
                              REPO / ".cache" / "oidc-provider" / "node_modules"))
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def new_key(kid: str) -> dict[str, Any]:
    """A fresh private RSA signing key (RS256), as a JWK with ``kid``."""
    key = RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"},
                              private=True)
    return key.as_dict(private=True)


def provider_available() -> str | None:
    """Why the provider cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "node is not installed (apt-get install nodejs npm)"
    if not (MODULES / "oidc-provider" / "package.json").is_file():
        return f"oidc-provider is not installed at {MODULES}: run ./scripts/ensure-oidc-provider"
    return None


@dataclass
class OidcProvider:
    """One provider process; ``issuer`` is ``http://127.0.0.1:PORT``."""

    root: Path
    clients: list[dict[str, Any]]
    users: dict[str, dict[str, Any]]
    keys: list[dict[str, Any]] = field(default_factory=lambda: [new_key("k1")])
    id_token_ttl: int = 300
    clock_offset_seconds: int = 0
    audience_swap: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    log: Path | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OidcProvider:
        """Write the config and start node; return once the provider serves."""
        missing = provider_available()
        if missing:
            raise AssertionError(missing)
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "provider.json"
        self.write_users()
        config.write_text(json.dumps({
            "issuer": self.issuer, "port": self.port, "clients": self.clients,
            "users_file": str(self.users_file), "keys": self.keys,
            "id_token_ttl": self.id_token_ttl, "audience_swap": self.audience_swap,
            "clock_offset_seconds": self.clock_offset_seconds}))
        log = self.log = Path(tempfile.mkstemp(prefix="oidc-provider-", suffix=".log",
                                               dir=self.root)[1])
        with log.open("w") as stderr:
            self.proc = subprocess.Popen(
                ["node", str(SCRIPT), str(config)], stdout=subprocess.PIPE, stderr=stderr,
                stdin=subprocess.DEVNULL, text=True,
                env={**os.environ, "MARQUE_OIDC_MODULES": str(MODULES)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.proc.wait(timeout=TIMEOUT)
            raise AssertionError(f"the OpenID provider did not start: {log.read_text()}")
        return self

    def said(self, event: str) -> int:
        """How many times the running provider logged ``event`` (e.g. ``grant.success
        refresh_token marque-console``: a refresh grant it answered)."""
        if self.log is None:
            return 0
        return sum(1 for line in self.log.read_text().splitlines() if line.startswith(event))

    @property
    def users_file(self) -> Path:
        return self.root / "users.json"

    def write_users(self) -> None:
        """Write ``users`` where the running provider reads them at every use (a user's
        groups changed, or the user removed, at the provider)."""
        temporary = self.users_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.users))
        temporary.replace(self.users_file)

    def stop(self) -> None:
        """Stop the provider (SIGTERM) and wait for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def rotate(self, *, keep_old: bool = False) -> str:
        """Sign with a new key from now on (the provider restarts on the same issuer);
        the new ``kid``."""
        kid = f"k{len(self.keys) + 1}-{os.getpid()}"
        self.keys = [new_key(kid), *(self.keys if keep_old else [])]
        self.stop()
        self.start()
        return kid


def web_client(client_id: str, secret: str, redirect_uri: str, **extra: Any) -> dict[str, Any]:
    """A confidential web client using the authorization code flow (and refresh tokens)."""
    return {"client_id": client_id, "client_secret": secret, "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            **extra}


def device_client(client_id: str) -> dict[str, Any]:
    """A public client using the device authorization grant (a command line)."""
    return {"client_id": client_id, "token_endpoint_auth_method": "none",
            "grant_types": [DEVICE_GRANT, "refresh_token"], "response_types": [],
            "redirect_uris": []}
