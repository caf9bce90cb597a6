"""``marque harbour oidc``: sign in to the console (and the command line) through the
company's identity provider (docs/console.md, "Signing in with OIDC")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from marque.cli.common import emit_json, guarded, json_option, literal, out
from marque.cli.harbour_home import harbour_home_option
from marque.errors import OidcConfigInvalid
from marque.harbour.oidc.config import RECHECK_BOUNDS, RECHECK_SECONDS

if TYPE_CHECKING:
    from marque.harbour.oidc.config import OidcConfig

F = TypeVar("F", bound=Callable[..., Any])


@click.group("oidc", no_args_is_help=True)
def oidc() -> None:
    """The identity provider approvers sign in with (OpenID Connect)."""


def oidc_options(prefix: str = "", *, required: bool = True) -> Callable[[F], F]:
    """The options that configure the identity provider, as ``harbour oidc set`` takes them
    (``prefix=""``) and ``harbour init`` does (``prefix="oidc-"``, none required): one list,
    read into one :class:`~marque.harbour.oidc.config.OidcConfig` by :func:`oidc_config`."""
    flag = f"--{prefix}"
    options = [
        click.option(f"{flag}issuer", "issuer", required=required, default=None, metavar="URL",
                     help="The provider's issuer (its discovery document is at "
                          "URL/.well-known/openid-configuration)."),
        click.option(f"{flag}client-id", "client_id", required=required, default=None,
                     help="The console's client id at the provider."),
        click.option(f"{flag}client-secret-file", "client_secret_file", required=required,
                     default=None, type=click.Path(path_type=Path),
                     help="A file (mode 600) holding the client secret; every `harbour "
                          "serve` reads it there."),
        click.option(f"{flag}subject-claim", "subject_claim", default=None, metavar="CLAIM",
                     help="The ID token claim that names the principal (default: sub; "
                          "e.g. email)."),
        click.option(f"{flag}groups-claim", "groups_claim", default=None, metavar="CLAIM",
                     help="A claim listing the user's groups; roles then come from "
                          f"{flag}group-role."),
        click.option(f"{flag}group-role", "group_roles", multiple=True, metavar="GROUP=ROLE",
                     help="A group and the role it grants (requester, approver, auditor, "
                          "admin); repeat for several."),
        click.option(f"{flag}cli-client-id", "cli_client_id", default=None,
                     help="A public client for `marque login --oidc` (device authorization "
                          "grant)."),
        click.option(f"{flag}redirect-uri", "redirect_uri", default=None, metavar="URL",
                     help="The console's callback as registered at the provider (default: "
                          "the console's own URL + /oidc/callback)."),
        click.option(f"{flag}scope", "scopes", multiple=True, metavar="SCOPE",
                     help="A scope to ask for besides openid and email (e.g. groups, "
                          "offline_access); repeat."),
        click.option(f"{flag}recheck-seconds", "recheck_seconds", default=None, type=int,
                     metavar="N", help=f"How often a sign-in is checked again at the provider "
                                       f"(default {RECHECK_SECONDS}; {RECHECK_BOUNDS[0]} to "
                                       f"{RECHECK_BOUNDS[1]})."),
        click.option(f"{flag}require", "require", is_flag=True,
                     help="Turn the console's token login off (break-glass is then `harbour "
                          "oidc set` without --require, or `harbour oidc clear`)."),
    ]

    def apply(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


def oidc_config(*, issuer: str | None, client_id: str | None,
                client_secret_file: Path | None, subject_claim: str | None,
                groups_claim: str | None, group_roles: tuple[str, ...],
                cli_client_id: str | None, redirect_uri: str | None,
                scopes: tuple[str, ...], recheck_seconds: int | None,
                require: bool, prefix: str = "") -> OidcConfig | None:
    """The settings the options give, checked; None when none was given. Some given
    without the issuer, the client id and the secret file is ``oidc_config_invalid``."""
    from marque.harbour.oidc.config import DEFAULT_SCOPES, OidcConfig, parse_group_role

    extra = (subject_claim, groups_claim, cli_client_id, redirect_uri, recheck_seconds)
    if issuer is None and client_id is None and client_secret_file is None \
            and all(v is None for v in extra) and not (group_roles or scopes or require):
        return None
    if issuer is None or client_id is None or client_secret_file is None:
        raise OidcConfigInvalid(f"--{prefix}issuer, --{prefix}client-id and "
                                f"--{prefix}client-secret-file go together: give all three",
                                detail={"setting": "issuer"})
    mapping: dict[str, tuple[str, ...]] = {}
    for text in group_roles:
        group, role = parse_group_role(text)
        mapping[group] = tuple(sorted({*mapping.get(group, ()), role.value}))
    return OidcConfig(issuer=issuer, client_id=client_id,
                      client_secret_file=str(client_secret_file.absolute()),
                      subject_claim=subject_claim or "sub", groups_claim=groups_claim,
                      group_roles=mapping, require=require, cli_client_id=cli_client_id,
                      redirect_uri=redirect_uri,
                      scopes=tuple(dict.fromkeys([*DEFAULT_SCOPES, *scopes])),
                      recheck_seconds=RECHECK_SECONDS if recheck_seconds is None
                      else recheck_seconds)


def say_oidc(result: dict[str, Any]) -> None:
    """What ``oidc set`` (and ``init`` with the OIDC options) kept, for a person."""
    out.say(f"identity provider {literal(result['issuer'])} (client "
            f"{literal(result['client_id'])}), principals named by the "
            f"{literal(result['subject_claim'])} claim, checked again every "
            f"{result['recheck_seconds']} s")
    if not result["provider"]["reachable"]:
        out.say(f"warning: {result['provider']['why']}")
    if result["require"]:
        out.say(f"token login is off; {result['token_sessions_ended']} token session(s) ended")


@oidc.command("set")
@harbour_home_option
@oidc_options()
@json_option
@guarded
def oidc_set(home: Path, as_json: bool, **options: Any) -> None:
    """Check the provider's settings (and its discovery document) and keep them."""
    from marque.harbour.oidc.admin import set_oidc

    config = oidc_config(**options)
    assert config is not None  # the issuer, client id and secret file are required here
    result = set_oidc(home, config)
    if as_json:
        emit_json(result)
        return
    say_oidc(result)


@oidc.command("show")
@harbour_home_option
@json_option
@guarded
def oidc_show(home: Path, as_json: bool) -> None:
    """Show the identity provider's settings (never the secret, only its file)."""
    from marque.harbour.oidc.admin import show_oidc

    result = show_oidc(home)
    if as_json:
        emit_json({"oidc": result})
        return
    if result is None:
        out.say("no identity provider: the console signs in with principals' tokens")
        return
    for key, value in result.items():
        if key != "version":
            out.say(f"{key}: {literal(value)}")


@oidc.command("clear")
@harbour_home_option
@json_option
@guarded
def oidc_clear(home: Path, as_json: bool) -> None:
    """Forget the identity provider: the console signs in with tokens only again."""
    from marque.harbour.oidc.admin import clear_oidc

    cleared = clear_oidc(home)
    if as_json:
        emit_json({"cleared": cleared})
        return
    out.say("identity provider forgotten" if cleared else "no identity provider was set")
