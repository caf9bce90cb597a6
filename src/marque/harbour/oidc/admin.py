"""``marque harbour oidc set|show|clear`` (and ``harbour init --oidc-…``): a Harbourmaster's
identity provider, set offline.

``set`` checks everything before it writes anything: the settings themselves
(:class:`~.config.OidcConfig`), the client secret file (it must exist, hold one line and
be readable by its owner only), and the provider's discovery document when it can be
fetched — its ``issuer`` must be exactly the one given, it must offer PKCE with ``S256``,
and a device authorization endpoint when a command-line client is configured. A provider
that cannot be reached is said so in the answer and the settings are kept, except with
``--require``: turning token login off for a provider nobody can reach would lock every
approver out of the console, so that is refused.
"""

from __future__ import annotations

import os
from typing import Any

from marque.errors import OidcConfigInvalid, OidcProviderUnavailable
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.oidc.config import OidcConfig, read_secret
from marque.harbour.oidc.provider import discover
from marque.harbour.setup import operator


def check_with_provider(config: OidcConfig) -> dict[str, Any]:
    """What the provider's discovery document says of ``config``: ``{reachable, ...}``;
    ``OidcConfigInvalid`` when it contradicts it."""
    try:
        found = discover(config.issuer)
    except OidcProviderUnavailable as exc:
        return {"reachable": False, "why": exc.message}
    if found.code_challenge_methods is not None and "S256" not in found.code_challenge_methods:
        raise OidcConfigInvalid("the provider does not offer PKCE with S256, which Marque "
                                "requires", detail={"setting": "issuer"})
    if config.cli_client_id and found.device_authorization_endpoint is None:
        raise OidcConfigInvalid("the provider offers no device authorization endpoint, so the "
                                "command line cannot sign in through it: leave out "
                                "--cli-client-id", detail={"setting": "cli_client_id"})
    return {"reachable": True, "authorization_endpoint": found.authorization_endpoint,
            "device_authorization_endpoint": found.device_authorization_endpoint}


def check_oidc(config: OidcConfig) -> dict[str, Any]:
    """Everything ``set`` checks before it writes: the secret file, the provider (what
    :func:`check_with_provider` answers), and that ``require`` has a reachable provider."""
    read_secret(config.client_secret_file)
    provider = check_with_provider(config)
    if config.require and not provider["reachable"]:
        raise OidcConfigInvalid("--require turns the console's token login off, and the "
                                f"provider cannot be reached ({provider['why']}): fix that "
                                "first, or leave --require out",
                                detail={"setting": "require"})
    return provider


def keep_oidc(home: str | os.PathLike[str], config: OidcConfig,
              provider: dict[str, Any]) -> dict[str, Any]:
    """Keep settings :func:`check_oidc` passed in the store (logged)."""
    store = open_home_store(HarbourHome(home))
    try:
        ended = store.set_oidc_settings(config.to_dict(), actor=operator())
    finally:
        store.close()
    return {**config.to_dict(), "provider": provider, "token_sessions_ended": ended}


def set_oidc(home: str | os.PathLike[str], config: OidcConfig) -> dict[str, Any]:
    """Check ``config`` (and its provider, when reachable), then keep it in the store."""
    return keep_oidc(home, config, check_oidc(config))


def show_oidc(home: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The stored settings (None when there are none)."""
    store = open_home_store(HarbourHome(home))
    try:
        body = store.oidc_settings()
    finally:
        store.close()
    return None if body is None else OidcConfig.from_dict(body).to_dict()


def clear_oidc(home: str | os.PathLike[str]) -> bool:
    """Forget the settings (token login works again); False if there were none."""
    store = open_home_store(HarbourHome(home))
    try:
        return store.clear_oidc_settings(actor=operator())
    finally:
        store.close()
