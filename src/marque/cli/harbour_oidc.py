"""``marque harbour oidc``: sign in to the console (and the command line) through the
company's identity provider (docs/console.md, "Signing in with OIDC")."""

from __future__ import annotations

from pathlib import Path

import click

from marque.cli.common import emit_json, guarded, json_option, literal, out
from marque.cli.harbour import harbour_home_option


@click.group("oidc", no_args_is_help=True)
def oidc() -> None:
    """The identity provider approvers sign in with (OpenID Connect)."""


@oidc.command("set")
@harbour_home_option
@click.option("--issuer", required=True, metavar="URL",
              help="The provider's issuer (its discovery document is at "
                   "URL/.well-known/openid-configuration).")
@click.option("--client-id", required=True, help="The console's client id at the provider.")
@click.option("--client-secret-file", required=True, type=click.Path(path_type=Path),
              help="A file (mode 600) holding the client secret; every `harbour serve` "
                   "reads it there.")
@click.option("--subject-claim", default="sub", show_default=True, metavar="CLAIM",
              help="The ID token claim that names the principal (e.g. email).")
@click.option("--groups-claim", default=None, metavar="CLAIM",
              help="A claim listing the user's groups; roles then come from --group-role.")
@click.option("--group-role", "group_roles", multiple=True, metavar="GROUP=ROLE",
              help="A group and the role it grants (requester, approver, auditor, admin); "
                   "repeat for several.")
@click.option("--cli-client-id", default=None,
              help="A public client for `marque login --oidc` (device authorization grant).")
@click.option("--redirect-uri", default=None, metavar="URL",
              help="The console's callback as registered at the provider (default: the "
                   "console's own URL + /oidc/callback).")
@click.option("--scope", "scopes", multiple=True, metavar="SCOPE",
              help="A scope to ask for besides openid and email (e.g. groups); repeat.")
@click.option("--require", is_flag=True,
              help="Turn the console's token login off (break-glass is then `harbour oidc "
                   "set` without --require, or `harbour oidc clear`).")
@json_option
@guarded
def oidc_set(home: Path, issuer: str, client_id: str, client_secret_file: Path,
             subject_claim: str, groups_claim: str | None, group_roles: tuple[str, ...],
             cli_client_id: str | None, redirect_uri: str | None, scopes: tuple[str, ...],
             require: bool, as_json: bool) -> None:
    """Check the provider's settings (and its discovery document) and keep them."""
    from marque.harbour.oidc.admin import set_oidc
    from marque.harbour.oidc.config import DEFAULT_SCOPES, OidcConfig, parse_group_role

    mapping: dict[str, tuple[str, ...]] = {}
    for text in group_roles:
        group, role = parse_group_role(text)
        mapping[group] = tuple(sorted({*mapping.get(group, ()), role.value}))
    config = OidcConfig(issuer=issuer, client_id=client_id,
                        client_secret_file=str(client_secret_file.absolute()),
                        subject_claim=subject_claim, groups_claim=groups_claim,
                        group_roles=mapping, require=require, cli_client_id=cli_client_id,
                        redirect_uri=redirect_uri,
                        scopes=tuple(dict.fromkeys([*DEFAULT_SCOPES, *scopes])))
    result = set_oidc(home, config)
    if as_json:
        emit_json(result)
        return
    out.say(f"identity provider {literal(issuer)} (client {literal(client_id)}), principals "
            f"named by the {literal(subject_claim)} claim")
    if not result["provider"]["reachable"]:
        out.say(f"warning: {result['provider']['why']}")
    if require:
        out.say(f"token login is off; {result['token_sessions_ended']} token session(s) ended")


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
