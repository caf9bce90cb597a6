"""``marque issue``: sign a marque locally (the Harbourmaster issues the same tokens)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from marque.cli.common import (
    emit_json,
    guarded,
    json_option,
    parse_duration,
    read_json_file,
    read_marque_file,
)
from marque.errors import InvalidInput

if TYPE_CHECKING:
    from marque.change import AnyChange, Statement

#: What ``pilot init`` prints: ``inc_`` and 32 hex digits.
_INCARNATION = re.compile(r"inc_[0-9a-f]{32}")
ISOLATION_LEVELS = ("read_committed", "repeatable_read", "serializable")


@click.command("issue")
@click.option("--issuer-key", type=click.Path(path_type=Path), required=True,
              help="The issuer's private JWK file (from `marque keys new`).")
@click.option("--pilot-id", required=True,
              help="The Pilot that may run it, as `marque pilot show` prints it.")
@click.option("--incarnation", required=True,
              help="That Pilot's ledger incarnation (inc_ and 32 hex digits, printed by "
                   "`marque pilot init` and `marque pilot show`): the marque is refused by any "
                   "other ledger.")
@click.option("--target", required=True, help="The target's name as the Pilot knows it.")
@click.option("--holder-key", type=click.Path(path_type=Path), required=True,
              help="The holder's public JWK file: only that key can execute the marque.")
@click.option("--sql", "sql", multiple=True,
              help="One approved statement; repeat for more (run in order, in one "
                   "transaction). SQLite uses ? placeholders, PostgreSQL %s. Not with "
                   "--effects-preview.")
@click.option("--effects-preview", "effects_preview", default=None, metavar="CID",
              help="Approve an Effect Set instead of statements: the effect_preview_cid "
                   "`marque effects preview` printed (the Pilot holds the preview).")
@click.option("--param", "param", multiple=True,
              help="A JSON array of parameters for the n-th --sql (in order).")
@click.option("--executions", type=int, required=True,
              help="How many distinct nonces may run it (the budget; spent by claiming).")
@click.option("--max-rows", type=int, required=True,
              help="The most rows all statements together may affect (or return, for a read); "
                   "more rolls the attempt back — nothing is truncated.")
@click.option("--attempts", type=int, default=3, show_default=True,
              help="Attempts per nonce: how often one nonce may run again after an attempt "
                   "that was provably not applied (no second budget decrement).")
@click.option("--ttl", default="15m", show_default=True,
              help="Lifetime from now: 90s, 15m, 2h, 1d.")
@click.option("--sub", "subject", default="local", show_default=True,
              help="Who asked for the change (recorded, never checked as a credential).")
@click.option("--isolation", type=click.Choice(ISOLATION_LEVELS), default="read_committed",
              show_default=True, help="The target transaction's isolation level.")
@click.option("--statement-timeout", default=None,
              help="The statement timeout for this change (e.g. 30s); default: the Pilot's.")
@json_option
@guarded
def issue(issuer_key: Path, pilot_id: str, incarnation: str, target: str, holder_key: Path,
          sql: tuple[str, ...], effects_preview: str | None, param: tuple[str, ...],
          executions: int, max_rows: int, attempts: int, ttl: str, subject: str,
          isolation: str, statement_timeout: str | None, as_json: bool) -> None:
    """Issue a marque (compact JWS) for the given statements, or for an Effect Set preview.

    Prints the token on stdout; with --json, {marque, marque_id, change_cid,
    expires_at, not_before, pilot, target}.
    """
    from marque.change import Budget
    from marque.token import issue_marque, unverified_claims

    _check_issue_options(incarnation, sql, effects_preview, param, isolation,
                         statement_timeout)
    change = _issued_change(sql, param, effects_preview, isolation, statement_timeout)
    budget = Budget(executions, max_rows, attempts)
    Budget.from_claim(budget.to_claim())
    token = issue_marque(
        read_json_file(issuer_key, "issuer key"),
        pilot_id=pilot_id,
        incarnation=incarnation,
        target=target,
        holder_jwk=read_json_file(holder_key, "holder key"),
        change=change,
        budget=budget,
        ttl_seconds=parse_duration(ttl),
        subject=subject,
    )
    if as_json:
        claims = unverified_claims(token) or {}
        emit_json({"marque": token, "marque_id": claims.get("jti"),
                   "change_cid": change.change_cid, "expires_at": claims.get("exp"),
                   "not_before": claims.get("nbf"), "pilot": claims.get("pilot"),
                   "target": target})
    else:
        sys.stdout.write(token + "\n")


def _check_issue_options(incarnation: str, sql: tuple[str, ...], effects_preview: str | None,
                         param: tuple[str, ...], isolation: str,
                         statement_timeout: str | None) -> None:
    """Refuse options that cannot make one marque: a malformed incarnation, statements and
    an Effect Set preview together (or neither), statement options on an Effect Set."""
    if not _INCARNATION.fullmatch(incarnation):
        raise InvalidInput(
            "--incarnation must be the Pilot's ledger incarnation exactly as `marque pilot "
            "init` or `marque pilot show` prints it (inc_ followed by 32 hex digits)")
    if bool(sql) == (effects_preview is not None):
        raise InvalidInput("give --sql (one or more statements) or --effects-preview CID, "
                           "not both and not neither")
    if effects_preview is not None and (param or statement_timeout is not None
                                        or isolation != "read_committed"):
        raise InvalidInput("--param, --isolation and --statement-timeout are for --sql; an "
                           "Effect Set runs each row in its own transaction")


def statements_of(sql: tuple[str, ...], param: tuple[str, ...]) -> list[Statement]:
    """The statements ``--sql`` names, each with its ``--param`` JSON array (in order)."""
    from marque.change import Statement

    if len(param) > len(sql):
        raise InvalidInput(f"{len(param)} --param given for {len(sql)} --sql")
    statements = []
    for index, text in enumerate(sql):
        values: Any = []
        if index < len(param):
            try:
                values = json.loads(param[index])
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"--param {index + 1} is not JSON: {exc.msg}") from exc
            if not isinstance(values, list):
                raise InvalidInput(f"--param {index + 1} must be a JSON array")
        statements.append(Statement(text, tuple(values)))
    return statements


def _issued_change(sql: tuple[str, ...], param: tuple[str, ...], effects_preview: str | None,
                   isolation: str, statement_timeout: str | None) -> AnyChange:
    """The change the marque carries, validated as the Pilot will validate it."""
    from marque.change import Change, EffectSetChange

    statements = statements_of(sql, param)
    timeout_ms = None if statement_timeout is None else parse_duration(statement_timeout) * 1000
    if effects_preview is not None:
        effect_set = EffectSetChange(effects_preview)
        EffectSetChange.from_claim(effect_set.to_claim())
        return effect_set
    change = Change(tuple(statements), isolation=isolation, statement_timeout_ms=timeout_ms)
    Change.from_claim(change.to_claim())  # the Pilot's own validation, before signing
    return change


@click.command("proof")
@click.option("--marque", "marque_file", type=click.Path(path_type=Path), required=True,
              help="The file holding the marque (compact JWS).")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The holder's private JWK file: the key the marque is bound to.")
@click.option("--nonce", required=True, help="The execution nonce the proof is for.")
@click.option("--pilot-id", required=True, help="The Pilot the proof is for.")
@json_option
@guarded
def proof(marque_file: Path, key: Path, nonce: str, pilot_id: str, as_json: bool) -> None:
    """Make a proof of possession for one execution (for callers of the HTTP API).

    `marque exec` makes its own; this is for a program that posts to
    `POST /v1/executions` itself, e.g. with curl. A proof is good for one
    request, for a short while (the Pilot's proof window).
    """
    from marque.token import make_proof

    token = read_marque_file(marque_file)
    made = make_proof(read_json_file(key, "holder key"), token, nonce=nonce, pilot_id=pilot_id)
    if as_json:
        emit_json({"proof": made, "nonce": nonce, "pilot_id": pilot_id})
    else:
        sys.stdout.write(made + "\n")
