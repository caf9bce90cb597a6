"""``marque pilot``: set up a Pilot's home — ledger, trusted issuers, targets."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marque.cli.common import (
    emit_json,
    err,
    fail,
    guarded,
    home_option,
    json_option,
    literal,
    out,
    read_json_file,
)
from marque.cli.lazy import LazyGroup


# `pilot serve` (its web stack) is imported only when it runs or `--help` lists it.
@click.group("pilot", cls=LazyGroup, no_args_is_help=True,
             lazy_subcommands={"serve": "marque.cli.serve:pilot_serve"})
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
        return
    out.say(f"Pilot {literal(result['pilot_id'])} "
            f"incarnation {literal(result['incarnation'])}")
    if result["adopted"]:
        out.say("re-adopted the existing ledger (same incarnation, nothing spent is lost); "
                "pilot.json was recreated without targets or trusted issuers: add them again "
                "with `marque pilot target add` and `marque pilot trust`")


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
@click.option("--no-check", is_flag=True,
              help="Do not check that the target answers (for a target down on purpose).")
@json_option
@guarded
def target_add(home: Path, name: str, dsn: str, no_check: bool, as_json: bool) -> None:
    """Add (or repoint) target NAME at DSN: sqlite:///path or postgresql://…

    The target must answer first (a SQLite file that exists and is a database,
    or a PostgreSQL server that accepts the connection) unless --no-check. A
    relative SQLite path is resolved against the current directory and stored
    absolute.
    """
    from marque.pilot.setup import add_target

    result = add_target(home, name, dsn, check=not no_check)
    if as_json:
        emit_json(result)
        return
    out.say(f"target {literal(name)} → {literal(result['dsn'])}")
    if result["resolved_from"] is not None:
        out.say(f"  (the relative path {literal(result['resolved_from'])} was resolved against "
                "the current directory)")
    if not result["checked"]:
        out.say("  (not checked: the target was not contacted)")


@target.command("row-key")
@home_option
@click.argument("name")
@click.argument("table")
@click.argument("columns", required=False, metavar="COLUMNS")
@click.option("--remove", is_flag=True, help="Withdraw the row key declared for TABLE.")
@click.option("--no-check", is_flag=True,
              help="Do not ask the target whether TABLE and its columns exist.")
@json_option
@guarded
def target_row_key(home: Path, name: str, table: str, columns: str | None, remove: bool,
                   no_check: bool, as_json: bool) -> None:
    """Declare the COLUMNS (COL[,COL…]) that name the rows of TABLE on target NAME.

    A rollback preview keys its row images by a table's primary key, else by a
    unique index over NOT NULL columns; a table with neither is previewed by
    count only — unless a row key is declared for it here. TABLE is
    [schema.]table. The target is asked first (unless --no-check): the table and
    every column must exist (row_key_invalid otherwise; nothing is written). A
    running `pilot serve` uses the key from its next start.
    """
    from marque.errors import InvalidInput
    from marque.pilot.setup import set_row_key

    if remove == (columns is not None):
        raise InvalidInput("give COLUMNS (COL[,COL…]) to declare a row key, or --remove to "
                           "withdraw one")
    names = None if columns is None else [c.strip() for c in columns.split(",")]
    result = set_row_key(home, name, table, names, check=not no_check)
    if as_json:
        emit_json(result)
        return
    if result["columns"] is None:
        out.say(f"target {literal(name)}: no row key declared for {literal(table)} any more")
        return
    out.say(f"target {literal(name)}: rows of {literal(result['table'])} are named by "
            f"{literal(', '.join(result['columns']))} (declared)")
    if result["own_key"]:
        out.say(f"  (the table has a key of its own, {literal(', '.join(result['own_key']))} "
                f"({result['own_key_source'].replace('_', ' ')}), which previews keep "
                "using; the declared one is used only if that key goes)")
    if not result["checked"]:
        out.say("  (not checked: the target was not asked)")


@target.command("list")
@home_option
@json_option
@guarded
def target_list(home: Path, as_json: bool) -> None:
    """The targets this Pilot serves (passwords redacted)."""
    from marque.pilot.setup import list_targets

    targets = list_targets(home)
    if as_json:
        emit_json({"targets": targets})
        return
    for name, dsn in targets.items():
        out.say(f"{literal(name)} → {literal(dsn)}")
    if not targets:
        out.say("no targets; add one with `marque pilot target add`")


@target.command("remove")
@home_option
@click.argument("name")
@json_option
@guarded
def target_remove(home: Path, name: str, as_json: bool) -> None:
    """Stop serving target NAME; marques for it are refused from now on."""
    from marque.pilot.setup import remove_target

    result = remove_target(home, name)
    if as_json:
        emit_json(result)
    else:
        out.say(f"removed target {literal(name)} ({literal(result['dsn'])})")


@target.command("rebind")
@home_option
@click.argument("name")
@click.option("--pin-unsettled", is_flag=True,
              help="Rebind even with attempts unsettled on NAME: each stays bound to the "
                   "database it was sent to and is never settled by a tombstone elsewhere.")
@json_option
@guarded
def target_rebind(home: Path, name: str, pin_unsettled: bool, as_json: bool) -> None:
    """Accept that target NAME now points at another database.

    The Pilot refuses a name that points at another database than its ledger
    bound it to (target_replaced). Run this once the move is meant; a running
    Pilot picks it up within a second. Refused (target_unsettled) while attempts
    on NAME are unsettled in the database it left, unless --pin-unsettled.
    """
    from marque.errors import TargetUnsettled
    from marque.pilot.setup import rebind_target

    try:
        result = rebind_target(home, name, pin_unsettled=pin_unsettled)
    except TargetUnsettled as exc:
        unsettled = exc.detail.get("unsettled", [])
        if not as_json:
            for left in unsettled:
                err.say(f"unsettled: {literal(left['marque_id'])} {literal(left['nonce'])} "
                        f"attempt {left['attempt']}")
        fail(exc, as_json, {"target": name, "unsettled": unsettled})
    if as_json:
        emit_json(result)
        return
    if not result["rebound"]:
        out.say(f"target {literal(name)} already is the database its ledger knows "
                f"({literal(result['target_id'])}); nothing to rebind")
        return
    out.say(f"target {literal(name)} rebound from {literal(result['rebound_from'])} to "
            f"{literal(result['target_id'])} at {literal(result['location'])}")
    for pin in result["pinned"]:
        out.say(f"  left bound to {literal(result['rebound_from'])}: "
                f"{literal(pin['marque_id'])} {literal(pin['nonce'])} attempt {pin['attempt']}")


@pilot.command("untrust")
@home_option
@click.argument("kid")
@json_option
@guarded
def pilot_untrust(home: Path, kid: str, as_json: bool) -> None:
    """Stop trusting issuer key KID; marques it signed are refused from now on."""
    from marque.pilot.setup import untrust_issuer

    result = untrust_issuer(home, kid)
    if as_json:
        emit_json(result)
    else:
        out.say(f"no longer trusting issuer key {literal(kid)}")


@pilot.command("show")
@home_option
@json_option
@guarded
def pilot_show(home: Path, as_json: bool) -> None:
    """This Pilot's id, incarnation, ledger, targets, trusted issuers and settings."""
    from marque.pilot.setup import show_pilot

    shown = show_pilot(home)
    if as_json:
        emit_json(shown)
        return
    for key in ("pilot_id", "incarnation", "home", "ledger"):
        out.say(f"{key:<12} {literal(shown[key])}")
    out.say("targets")
    for name, dsn in shown["targets"].items():
        bound = shown["target_bindings"].get(name)
        out.say(f"  {literal(name)} → {literal(dsn)}"
                + (f"  (identity {literal(bound['target_id'])})" if bound else ""))
        for table, columns in shown["row_keys"].get(name, {}).items():
            out.say(f"    row key of {literal(table)}: {literal(', '.join(columns))} (declared)")
    out.say("issuers      " + (literal(", ".join(shown["issuers"])) or "none"))
    harbour = shown.get("harbour")
    out.say("harbour      " + (f"{literal(harbour['url'])} (reaching this Pilot at "
                               f"{literal(harbour['pilot_url'])})" if harbour else "none"))
    out.say("settings")
    for key, value in shown["settings"].items():
        out.say(f"  {key:<24} {literal(json.dumps(value))}")


@pilot.command("move")
@home_option
@json_option
@guarded
def pilot_move(home: Path, as_json: bool) -> None:
    """Acknowledge that this home was moved to --home: its ledger follows it.

    Refused while the old home still exists with this Pilot in it (a copy):
    two homes never run on one ledger.
    """
    from marque.pilot.setup import move_home

    result = move_home(home)
    if as_json:
        emit_json(result)
    elif result["moved_from"] is None:
        out.say(f"{literal(result['home'])} is already this Pilot's home; nothing to move")
    else:
        out.say(f"Pilot {literal(result['pilot_id'])} moved from "
                f"{literal(result['moved_from'])} to {literal(result['home'])}")


@pilot.command("join")
@home_option
@click.option("--harbour", "harbour_url", required=True, metavar="URL",
              help="The Harbourmaster's URL (https://…).")
@click.option("--token", required=True, envvar="MARQUE_PILOT_TOKEN", show_envvar=True,
              help="This Pilot's bearer token there (a `pilot` principal named as the Pilot).")
@click.option("--url", "pilot_url", required=True, metavar="PILOT_URL",
              help="Where the Harbourmaster reaches this Pilot's service (`pilot serve`).")
@json_option
@guarded
def pilot_join(home: Path, harbour_url: str, token: str, pilot_url: str, as_json: bool) -> None:
    """Join a Harbourmaster: pin its issuer keys, register, remember it in pilot.json.

    Fetches its JWKS and trusts those keys, registers this Pilot (id, --url,
    incarnation, targets) and stores {url, token, pilot_url} in pilot.json,
    which is kept readable by its owner only. From then on `pilot serve`
    registers at start and every minute and delivers outcome reports there,
    signed with the home's report key (made here if missing), whose public
    half the registration carries.
    Nothing is written unless every step succeeded.
    """
    from marque.pilot.join import join

    result = join(home, harbour_url, token, pilot_url)
    if as_json:
        emit_json(result)
        return
    out.say(f"Pilot {literal(result['pilot_id'])} ({literal(result['incarnation'])}) joined "
            f"the Harbourmaster at {literal(result['harbour'])}, which reaches it at "
            f"{literal(result['pilot_url'])}")
    out.say("trusting its issuer key" + ("s " if len(result["trusted"]) != 1 else " ")
            + literal(", ".join(result["trusted"])))
    out.say(f"reports are signed with the report key {literal(result['report_key'])} "
            "(report-key.jwk in the home), registered there")
    previous = result["previous_incarnation"]
    if previous is not None and previous != result["incarnation"]:
        out.say(f"it knew this Pilot as incarnation {literal(previous)}: marques pinned to it "
                "can no longer run here, and the Harbourmaster reconciles their requests")
