"""``marque harbour``: create and administer a Harbourmaster's home (offline, on its machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from marque.cli.common import emit_json, guarded, json_option, literal, out, read_json_file
from marque.cli.harbour_home import harbour_home_option
from marque.cli.harbour_oidc import oidc_config, oidc_options, say_oidc
from marque.cli.lazy import LazyGroup
from marque.errors import InvalidInput

ROLES = ("requester", "approver", "auditor", "admin", "pilot", "agent")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InvalidInput(f"{what} {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc}") from exc


# `harbour serve` (its web stack) is imported only when it runs or `--help` lists it.
@click.group("harbour", cls=LazyGroup, no_args_is_help=True,
             lazy_subcommands={"serve": "marque.cli.harbour_serve:harbour_serve",
                               "webhooks": "marque.cli.webhooks:webhooks",
                               "oidc": "marque.cli.harbour_oidc:oidc"})
def harbour() -> None:
    """Create and administer a Harbourmaster: store, issuer key, principals, routing."""


@harbour.command("init")
@harbour_home_option
@click.option("--store", default=None, metavar="DSN",
              help="The store: postgresql://… (default: a SQLite store inside the home).")
@click.option("--routing", type=click.Path(path_type=Path), default=None,
              help="A routing config (TOML) to adopt (default: the bootstrap profile — reads "
                   "allowed, everything else delegated to one approver).")
@oidc_options("oidc-", required=False)
@json_option
@guarded
def harbour_init(home: Path, store: str | None, routing: Path | None, as_json: bool,
                 **oidc: Any) -> None:
    """Create a Harbourmaster; prints {harbour_id, issuer_kid, admin_token} once.

    The admin token is shown this once and stored only as a hash: keep it. With
    --oidc-issuer, --oidc-client-id and --oidc-client-secret-file, approvers sign in
    through that identity provider from the start (checked as `harbour oidc set` checks
    them, before anything is made).
    """
    from marque.harbour.oidc.admin import check_oidc, keep_oidc
    from marque.harbour.setup import init_harbour

    text = None if routing is None else _read_text(routing, "routing config")
    config = oidc_config(**oidc, prefix="oidc-")
    provider = None if config is None else check_oidc(config)
    result = init_harbour(home, store_dsn=store, routing_text=text)
    if config is not None and provider is not None:
        result["oidc"] = keep_oidc(home, config, provider)
    if as_json:
        emit_json(result)
        return
    out.say(f"Harbourmaster {literal(result['harbour_id'])} issuer key "
            f"{literal(result['issuer_kid'])}")
    out.say(f"routing config {literal(result['routing']['config_cid'])}"
            + (" (the bootstrap profile)" if result["routing"]["bootstrap"] else ""))
    if "oidc" in result:
        say_oidc(result["oidc"])
    out.say(f"admin token (shown once): {result['admin_token']}")


@harbour.group("principal", no_args_is_help=True)
def principal() -> None:
    """Principals: who may request, approve, audit, administer or report."""


@principal.command("add")
@harbour_home_option
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(ROLES),
              help="A role; repeat for several.")
@click.option("--key", type=click.Path(path_type=Path), default=None,
              help="The principal's public JWK (a requester needs one to receive marques).")
@json_option
@guarded
def principal_add(home: Path, name: str, roles: tuple[str, ...], key: Path | None,
                  as_json: bool) -> None:
    """Add a principal; prints its token once (it is stored only as a hash)."""
    from marque.harbour.setup import add_principal

    jwk = None if key is None else read_json_file(key, "public key")
    result = add_principal(home, name, list(roles), public_jwk=jwk)
    if as_json:
        emit_json(result)
        return
    out.say(f"principal {literal(result['name'])} ({', '.join(result['roles'])})")
    out.say(f"token (shown once): {result['token']}")


@principal.command("revoke")
@harbour_home_option
@click.argument("name")
@json_option
@guarded
def principal_revoke(home: Path, name: str, as_json: bool) -> None:
    """Revoke a principal's token at once; what it did stays in the logbook."""
    from marque.harbour.setup import revoke_principal

    result = revoke_principal(home, name)
    if as_json:
        emit_json(result)
        return
    out.say(f"principal {literal(result['name'])} revoked")


@principal.command("rotate")
@harbour_home_option
@click.argument("name")
@click.option("--key", type=click.Path(path_type=Path), default=None,
              help="A new public JWK for the principal (its old key stops counting).")
@json_option
@guarded
def principal_rotate(home: Path, name: str, key: Path | None, as_json: bool) -> None:
    """A new token for NAME, printed once; the old token and its console sessions stop
    working at once."""
    from marque.harbour.setup import rotate_principal

    jwk = None if key is None else read_json_file(key, "public key")
    result = rotate_principal(home, name, public_jwk=jwk)
    if as_json:
        emit_json(result)
        return
    out.say(f"principal {literal(result['name'])}: token rotated"
            + (", key replaced" if jwk is not None else ""))
    out.say(f"token (shown once): {result['token']}")


@principal.command("roles")
@harbour_home_option
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(ROLES),
              help="A role; repeat for several. The principal holds exactly these after.")
@json_option
@guarded
def principal_roles(home: Path, name: str, roles: tuple[str, ...], as_json: bool) -> None:
    """Set NAME's roles to exactly the --role values given (its token stays the same)."""
    from marque.harbour.setup import set_roles

    result = set_roles(home, name, list(roles))
    if as_json:
        emit_json(result)
        return
    out.say(f"principal {literal(result['name'])} ({', '.join(result['roles'])})")


@principal.command("list")
@harbour_home_option
@json_option
@guarded
def principal_list(home: Path, as_json: bool) -> None:
    """Every principal with its roles, key and whether it is revoked (never a token)."""
    from marque.harbour.setup import list_principals

    principals = list_principals(home)
    if as_json:
        emit_json({"principals": principals})
        return
    for item in principals:
        state = " revoked" if item.get("revoked_at") is not None else ""
        key = " key" if item.get("public_jwk") else ""
        out.say(f"{literal(item['name'])}  {', '.join(item['roles'])}{key}{state}")


@harbour.group("pilot", no_args_is_help=True)
def pilot() -> None:
    """The registered Pilots' report keys."""


@pilot.command("accept-key")
@harbour_home_option
@click.argument("pilot_id")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The Pilot's new public report key (the `report_key` that "
                   "`marque pilot join --json` prints on the Pilot's machine).")
@click.option("--reason", required=True,
              help="Who confirmed the new key with the Pilot's operator, and how.")
@json_option
@guarded
def pilot_accept_key(home: Path, pilot_id: str, key: Path, reason: str,
                     as_json: bool) -> None:
    """Replace PILOT_ID's report key: only reports signed with the new key are taken after.
    A Pilot cannot change its own key (a stolen Pilot token could register one)."""
    from marque.harbour.setup import accept_report_key

    result = accept_report_key(home, pilot_id, read_json_file(key, "public key"), reason)
    if as_json:
        emit_json(result)
        return
    out.say(f"Pilot {literal(result['pilot_id'])}: report key "
            f"{literal(result['report_key']['kid'])} accepted")


@harbour.group("routing", no_args_is_help=True)
def routing() -> None:
    """Account routing configs: who may do what to which target, and who must approve."""


@routing.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@json_option
@guarded
def routing_check(file: Path, as_json: bool) -> None:
    """Check a routing config (TOML) without adopting it; prints its config CID."""
    from marque.harbour.routing import parse_config

    config = parse_config(_read_text(file, "routing config"))
    result = {"config_cid": config.config_cid, "entries": len(config.entries)}
    if as_json:
        emit_json(result)
        return
    out.say(f"valid: {result['entries']} entries, config {literal(config.config_cid)}")


@routing.command("set")
@harbour_home_option
@click.argument("file", type=click.Path(path_type=Path))
@json_option
@guarded
def routing_set(home: Path, file: Path, as_json: bool) -> None:
    """Check a routing config and adopt it: new requests are routed by it from now on."""
    from marque.harbour.setup import set_routing

    result = set_routing(home, _read_text(file, "routing config"))
    if as_json:
        emit_json(result)
        return
    if result["changed"]:
        out.say(f"adopted config {literal(result['config_cid'])} ({result['entries']} entries)")
    else:
        out.say(f"config {literal(result['config_cid'])} is already the adopted one")
