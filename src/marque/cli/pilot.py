"""``marque pilot``: set up a Pilot's home — ledger, trusted issuers, targets."""

from __future__ import annotations

from pathlib import Path

import click

from marque.cli.common import (
    emit_json,
    guarded,
    home_option,
    json_option,
    literal,
    out,
    read_json_file,
    redact,
)


@click.group("pilot", no_args_is_help=True)
def pilot() -> None:
    """Set up and inspect a Pilot: ledger, trusted issuers, targets."""


@pilot.group("target", no_args_is_help=True)
def target() -> None:
    """Targets a Pilot serves (credentials stay in pilot.json)."""


@pilot.command("init")
@home_option
@click.option("--pilot-id", required=True,
              help="This Pilot's id, as marques name it (1..64 of A-Z a-z 0-9 _ . -).")
@click.option("--ledger", default=None, metavar="DSN",
              help="Ledger DSN: postgresql://… (default: a SQLite ledger inside the home).")
@json_option
@guarded
def pilot_init(home: Path, pilot_id: str, ledger: str | None, as_json: bool) -> None:
    """Create the ledger (a new incarnation); prints {pilot_id, incarnation}.

    Never overwrites an existing ledger.
    """
    from marque.pilot.setup import init_home

    result = init_home(home, pilot_id, ledger)
    if as_json:
        emit_json(result)
    else:
        out.say(f"Pilot {literal(result['pilot_id'])} "
                f"incarnation {literal(result['incarnation'])}")


@pilot.command("trust")
@home_option
@click.argument("issuer_jwk", type=click.Path(path_type=Path))
@json_option
@guarded
def pilot_trust(home: Path, issuer_jwk: Path, as_json: bool) -> None:
    """Trust an issuer's public key (only its public part is stored)."""
    from marque.pilot.setup import trust_issuer

    kid = trust_issuer(home, read_json_file(issuer_jwk, "issuer key"))
    if as_json:
        emit_json({"kid": kid})
    else:
        out.say(f"trusting issuer key {literal(kid)}")


@target.command("add")
@home_option
@click.argument("name")
@click.argument("dsn")
@json_option
@guarded
def target_add(home: Path, name: str, dsn: str, as_json: bool) -> None:
    """Add (or repoint) target NAME at DSN: sqlite:///path or postgresql://…"""
    from marque.pilot.setup import add_target

    add_target(home, name, dsn)
    if as_json:
        emit_json({"target": name, "dsn": redact(dsn)})
    else:
        out.say(f"target {literal(name)} → {literal(redact(dsn))}")
