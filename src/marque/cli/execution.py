"""``marque exec``, ``outcome`` and ``reconcile``: running marques and reading their truth."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from marque.cli.common import (
    CommandExit,
    emit_event_json,
    emit_json,
    err,
    fail,
    guarded,
    home_option,
    json_option,
    literal,
    out,
    read_json_file,
    when,
)
from marque.errors import InvalidInput, MarqueError, NotFound, Refusal

if TYPE_CHECKING:
    from marque.outcome import Outcome

_EVENT_STYLE = {
    "claimed": "cyan",
    "fence_checked": "cyan",
    "statement_started": "blue",
    "statement_finished": "blue",
    "guard_checked": "blue",
    "asserted": "green",
    "committed": "bold green",
    "outcome_recorded": "green",
    "reported": "dim",
    "rolled_back": "bold yellow",
    "outcome_unknown": "bold magenta",
    "outcome_not_recorded": "bold magenta",
}
_STATUS_STYLE = {"applied": "green", "aborted_not_applied": "yellow",
                 "indeterminate": "magenta", "in_progress": "cyan"}
#: What an operator should know about each status, printed under it.
_STATUS_MEANING = {
    "aborted_not_applied": "provably not applied; the same nonce may run again as a new attempt",
    "indeterminate": "may or may not have committed; nobody can say yet — run `marque "
                     "reconcile` (never retry with a new nonce)",
    "in_progress": "claimed and running; retry the same nonce to follow it",
}


def _human_value(key: str, value: Any) -> str:
    if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return when(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={_human_value(k, v)}" for k, v in value.items() if v is not None)
    return literal(value)


def print_event(event: dict[str, Any], as_json: bool) -> None:
    """One streamed event: a JSON line with --json, else one readable line on stderr."""
    if as_json:
        emit_event_json(event)
        return
    kind = event["event"]
    details = " ".join(f"{k}={_human_value(k, v)}" for k, v in event.items()
                       if k not in ("event", "marque_id", "nonce", "at"))
    err.say(f"[{_EVENT_STYLE.get(kind, 'white')}]● {literal(kind):<18}[/] [dim]{details}[/]")


def print_outcome(outcome: Outcome, as_json: bool) -> None:
    """The outcome object: JSON with --json, else what an operator needs to act on it."""
    if as_json:
        emit_json(outcome.to_dict())
        return
    colour = _STATUS_STYLE.get(outcome.status, "white")
    line = (f"[bold {colour}]{outcome.status}[/] marque {literal(outcome.marque_id)} "
            f"nonce {literal(outcome.nonce)} attempt {outcome.attempt}")
    if outcome.rows_affected is not None:
        line += f", rows_affected={outcome.rows_affected}"
    if outcome.replayed:
        line += " [dim](recorded outcome: nothing ran now)[/]"
    out.say(line)
    if outcome.status in _STATUS_MEANING:
        out.say(f"  {_STATUS_MEANING[outcome.status]}")
    if outcome.error:
        out.say(f"  error {literal(outcome.error['code'])}: {literal(outcome.error['message'])}")
    if outcome.result:
        out.say("  " + " | ".join(literal(c) for c in outcome.result["columns"]))
        for row in outcome.result["rows"]:
            out.say("  " + " | ".join(literal(v) for v in row))


def _read_marque_file(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise InvalidInput(f"marque file {path} does not exist") from exc
    except OSError as exc:
        raise InvalidInput(f"cannot read marque file {path}: {exc.strerror}") from exc
    # Whatever is in the file is the marque the caller means; the Pilot says if it is one.
    return raw.decode("ascii", errors="replace").strip()


@click.command("exec")
@home_option
@click.option("--marque", "marque_file", type=click.Path(path_type=Path), required=True,
              help="The file holding the marque (compact JWS).")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The holder's private JWK file (signs the proof of possession).")
@click.option("--nonce", required=True,
              help="The execution nonce: your retry key. The same nonce never applies twice; "
                   "retrying it returns the recorded outcome.")
@click.option("--pilot", "pilot_url", default=None, metavar="URL",
              help="A Pilot service's URL instead of the embedded Pilot (not available yet).")
@json_option
def exec_(home: Path, marque_file: Path, key: Path, nonce: str, pilot_url: str | None,
          as_json: bool) -> None:
    """Execute a marque once for NONCE, streaming events; a retry returns the outcome."""
    from marque.outcome import refusal_object

    pilot_info: dict[str, Any] = {"id": None, "incarnation": None}
    token = ""
    try:
        if pilot_url is not None:
            raise InvalidInput("the Pilot HTTP service is not available yet; omit --pilot")
        token = _read_marque_file(marque_file)
        holder = read_json_file(key, "holder key")
        from marque.pilot import open_pilot
        from marque.token import make_proof, unverified_claims

        marque_id = (unverified_claims(token) or {}).get("jti")
        if not as_json and isinstance(marque_id, str):
            err.say(f"[dim]exec marque {literal(marque_id)} nonce {literal(nonce)}[/]")
        pilot = open_pilot(home)
        pilot_info = {"id": pilot.pilot_id, "incarnation": pilot.incarnation}
        try:
            proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot.pilot_id)
            outcome = pilot.execute(token, proof, nonce,
                                    on_event=lambda e: print_event(e, as_json))
        finally:
            pilot.close()
    except Refusal as exc:
        from marque.token import unverified_claims

        jti = (unverified_claims(token) or {}).get("jti") if token else None
        fail(exc, as_json, refusal_object(jti if isinstance(jti, str) else None, nonce,
                                          pilot_info, exc.to_dict()))
    except MarqueError as exc:
        fail(exc, as_json)
    print_outcome(outcome, as_json)
    raise CommandExit(outcome.exit_status)


@click.command("outcome")
@home_option
@click.argument("marque_id")
@click.argument("nonce")
@json_option
def outcome_(home: Path, marque_id: str, nonce: str, as_json: bool) -> None:
    """The recorded outcome of NONCE under MARQUE_ID (read-only)."""
    from marque.pilot import open_pilot

    try:
        pilot = open_pilot(home, recover=False)
        try:
            outcome = pilot.outcome(marque_id, nonce)
        finally:
            pilot.close()
        if outcome is None:
            raise NotFound(f"nonce {nonce!r} of marque {marque_id} was never claimed by this "
                           "Pilot's ledger")
    except MarqueError as exc:
        fail(exc, as_json)
    print_outcome(outcome, as_json)
    raise CommandExit(outcome.exit_status)


@click.command("reconcile")
@home_option
@json_option
@guarded
def reconcile(home: Path, as_json: bool) -> None:
    """Settle what evidence can settle; print what changed and what is still open."""
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        changes = pilot.recover()
        left = [
            {"marque_id": r.marque_id, "nonce": r.nonce, "attempt": r.attempt,
             "status": r.status.value, "error": r.error}
            for r in pilot.unsettled()
        ]
    finally:
        pilot.close()
    if as_json:
        emit_json({"changed": changes, "still_unsettled": left})
        return
    for change in changes:
        out.say(f"{literal(change['marque_id'])} nonce {literal(change['nonce'])} attempt "
                f"{change['attempt']}: {change['from']} → {change['to']}")
    if not changes:
        out.say("nothing settled")
    for record in left:
        error: dict[str, Any] = record["error"] or {}  # type: ignore[assignment]
        reason = error.get("message", "")
        out.say(f"still {record['status']}: {literal(record['marque_id'])} nonce "
                f"{literal(record['nonce'])} attempt {record['attempt']} {literal(reason)}")
