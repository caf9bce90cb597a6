"""``marque exec``, ``outcome`` and ``reconcile``: running marques and reading their truth."""

from __future__ import annotations

import json
from collections.abc import Callable
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
    harbour_options,
    home_option,
    json_option,
    literal,
    one_line,
    one_shot,
    out,
    read_json_file,
    read_marque_file,
    when,
)
from marque.errors import InvalidInput, MarqueError, NonceReaped, Refusal

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
    "aborted_not_applied": "provably not applied; the same nonce may run again as a new attempt "
                           "while the marque's attempts per nonce allow",
    "indeterminate": "may or may not have committed; nobody can say yet — run `marque "
                     "reconcile` (never retry with a new nonce)",
    "in_progress": "claimed and running; retry the same nonce to follow it",
}
#: Where an outcome's error code changes what its status means for the next step.
_ERROR_MEANING = {
    "stale_preview": "provably not applied, and no attempt of this marque can ever apply it: "
                     "the approved Effect preview is stale. Re-request: make a new request so "
                     "a new preview is taken and approved (retrying this nonce cannot help)",
}


#: Event fields that hold an epoch time without ending in ``_at``.
_TIME_KEYS = frozenset({"marque_not_before"})


def _human_value(key: str, value: Any) -> str:
    if ((key.endswith("_at") or key in _TIME_KEYS) and isinstance(value, int | float)
            and not isinstance(value, bool)):
        return when(value)
    if key == "error" and isinstance(value, dict) and "code" in value:
        return f"{one_line(value['code'])} ({one_line(value.get('message', ''))})"
    if isinstance(value, dict):
        return " ".join(f"{k}={_human_value(k, v)}" for k, v in value.items() if v is not None)
    if isinstance(value, float):
        return f"{value:g}"  # 60, not 60.0
    return one_line(value)


def print_event(event: dict[str, Any], as_json: bool) -> None:
    """One streamed event: a JSON line with --json, else one readable line on stderr."""
    if as_json:
        emit_event_json(event)
        return
    kind = event["event"]
    details = " ".join(f"{k}={_human_value(k, v)}" for k, v in event.items()
                       if k not in ("event", "marque_id", "nonce", "at"))
    err.say(f"[{_EVENT_STYLE.get(kind, 'white')}]● {one_line(kind):<18}[/] [dim]{details}[/]")
    note = _skew_note(event)
    if note:
        err.say(f"  [yellow]{note}[/]")


def _skew_note(event: dict[str, Any]) -> str | None:
    """Say so when a marque was accepted only thanks to the clock-skew allowance."""
    if event["event"] != "claimed" or "skew_seconds" not in event:
        return None
    allowance = f"{event['skew_seconds']:g} s"
    if "marque_expired_at" in event:
        return (f"the marque expired at {when(event['marque_expired_at'])}; accepted within "
                f"this Pilot's {allowance} clock-skew allowance (settings.skew_seconds)")
    if "marque_not_before" in event:
        return (f"the marque is valid from {when(event['marque_not_before'])}; accepted within "
                f"this Pilot's {allowance} clock-skew allowance (settings.skew_seconds)")
    return None


def print_outcome(outcome: Outcome, as_json: bool, stalled: MarqueError | None = None,
                  events: frozenset[str] = frozenset()) -> None:
    """The outcome object: JSON with --json, else what an operator needs to act on it.

    ``stalled`` is why an ``in_progress`` nonce's owner can no longer finish it
    (its process died, or its lease ran out): then "running" would be untrue.
    ``events`` are the kinds of the events streamed before this outcome: they tell
    an applied write settled behind its answer (nothing to do) from one the ledger
    could not record.
    """
    if as_json:
        emit_json(outcome.to_dict())
        return
    colour = _STATUS_STYLE.get(outcome.status, "white")
    line = (f"[bold {colour}]{outcome.status}[/] marque {one_line(outcome.marque_id)} "
            f"nonce {one_line(outcome.nonce)} attempt {outcome.attempt}")
    if outcome.rows_affected is not None:
        line += f", rows_affected={outcome.rows_affected}"
    if outcome.replayed:
        line += " [dim](recorded outcome: nothing ran now)[/]"
    out.say(line)
    if not outcome.recorded:
        _say_unrecorded(outcome, events)
    if stalled is not None:
        out.say(f"  claimed, but nothing is running it ({stalled.code}): "
                f"{literal(stalled.message)}. Run `marque reconcile` (or retry the same "
                "nonce) to settle it by evidence")
    elif outcome.status in _STATUS_MEANING:
        code = str((outcome.error or {}).get("code"))
        out.say(f"  {_ERROR_MEANING.get(code, _STATUS_MEANING[outcome.status])}")
    if outcome.error:
        out.say(f"  error {one_line(outcome.error['code'])}: {literal(outcome.error['message'])}")
    summary = (outcome.result or {}).get("effect_set")
    if isinstance(summary, dict):
        out.say(f"  set receipt {one_line(summary.get('set_receipt_cid'))}: "
                f"{one_line(summary.get('status'))} (Run {one_line(summary.get('run_outcome'))}"
                f", rows {one_line(json.dumps(summary.get('rows') or {}))})")
    elif outcome.result:
        out.say("  " + " | ".join(one_line(c) for c in outcome.result["columns"]))
        for row in outcome.result["rows"]:
            out.say("  " + " | ".join(one_line(v) for v in row))


def _say_unrecorded(outcome: Outcome, events: frozenset[str]) -> None:
    """What an answer the ledger does not hold yet asks of its reader, if anything.

    An applied write settled behind its answer is the normal path of a long-running
    Pilot: its stamp in the target is the durable record and the Pilot records it
    moments later, so nothing is said. Anything else the ledger missed needs evidence
    to settle it, and the reader must not reach for a new nonce meanwhile.
    """
    if outcome.status == "applied":
        if "outcome_not_recorded" in events:
            out.say("  [dim]the ledger could not record it yet; the target's stamp is its "
                    "durable record, and reconciliation (the running Pilot, `marque "
                    "reconcile`, or a retry of the same nonce) records it once the ledger "
                    "is back[/]")
        return
    out.say("  [bold magenta]not yet recorded in the ledger[/]: the ledger could not be "
            "written after the target answered. `marque reconcile` (or a retry of the same "
            "nonce) settles it by evidence once the ledger is back. Do not retry with a new "
            "nonce")


@click.command("exec")
@click.option("--home", type=click.Path(path_type=Path), default=None,
              help="The Pilot's home directory (the embedded Pilot); not with --pilot.")
@click.option("--marque", "marque_file", type=click.Path(path_type=Path), default=None,
              help="The file holding the marque (compact JWS); not with --request.")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The holder's private JWK file (signs the proof of possession).")
@click.option("--nonce", required=True,
              help="The execution nonce: your retry key. The same nonce never applies twice; "
                   "retrying it returns the recorded outcome.")
@click.option("--pilot", "pilot_url", default=None, metavar="URL",
              help="A Pilot service (`marque pilot serve`) to execute through, instead of the "
                   "embedded Pilot of --home.")
@click.option("--request", "request_id", default=None, metavar="ID",
              help="A request at the Harbourmaster (its rq_ id or your request id): fetch its "
                   "marque and its Pilot's URL, then execute through that Pilot's service.")
@harbour_options
@json_option
@one_shot
def exec_(home: Path | None, marque_file: Path | None, key: Path, nonce: str,
          pilot_url: str | None, request_id: str | None, harbour_url: str | None,
          token: str | None, as_json: bool) -> None:
    """Execute a marque once for NONCE, streaming events; a retry returns the outcome.

    Through a Pilot service (--pilot URL, or the request's Pilot with --request
    ID), a lost connection is followed back to the same execution, never a new
    one.
    """
    from marque.outcome import refusal_object

    pilot_info: dict[str, Any] = {"id": None, "incarnation": None}
    marque = ""
    seen: set[str] = set()

    def on_event(event: dict[str, Any]) -> None:
        seen.add(event["event"])
        print_event(event, as_json)

    try:
        _check_exec_options(home, pilot_url, request_id, marque_file)
        holder = read_json_file(key, "holder key")
        if request_id is not None:
            marque, pilot_url = _marque_of_request(request_id, harbour_url, token, as_json)
        else:
            assert marque_file is not None
            marque = read_marque_file(marque_file)
        from marque.token import unverified_claims

        marque_id = (unverified_claims(marque) or {}).get("jti")
        if not as_json and isinstance(marque_id, str):
            err.say(f"[dim]exec marque {one_line(marque_id)} nonce {one_line(nonce)}[/]")
        if pilot_url is not None:
            outcome = _exec_remote(pilot_url, marque, holder, nonce, as_json, pilot_info,
                                       on_event)
        else:
            assert home is not None
            outcome = _exec_embedded(home, marque, holder, nonce, pilot_info, on_event)
    except Refusal as exc:
        from marque.token import unverified_claims

        jti = (unverified_claims(marque) or {}).get("jti") if marque else None
        fail(exc, as_json, refusal_object(jti if isinstance(jti, str) else None, nonce,
                                          pilot_info, exc.to_dict()))
    except MarqueError as exc:
        fail(exc, as_json)
    print_outcome(outcome, as_json, events=frozenset(seen))
    raise CommandExit(outcome.exit_status)


def _check_exec_options(home: Path | None, pilot_url: str | None, request_id: str | None,
                        marque_file: Path | None) -> None:
    """Refuse anything but one Pilot to execute through and one place the marque is."""
    if sum(x is not None for x in (home, pilot_url, request_id)) != 1:
        raise InvalidInput("give exactly one of --home (the embedded Pilot), --pilot URL "
                           "(a Pilot service) and --request ID (a Harbourmaster's request)")
    if (marque_file is None) == (request_id is None):
        raise InvalidInput("give exactly one of --marque FILE and --request ID (whose "
                           "marque the Harbourmaster holds)")


def _exec_embedded(home: Path, marque: str, holder: dict[str, Any], nonce: str,
                   pilot_info: dict[str, Any],
                   on_event: Callable[[dict[str, Any]], None]) -> Outcome:
    """Execute through the embedded Pilot of ``home``; ``pilot_info`` learns which it is."""
    from marque.pilot import open_pilot
    from marque.token import make_proof

    pilot = open_pilot(home)
    pilot_info.update(id=pilot.pilot_id, incarnation=pilot.incarnation)
    try:
        proof = make_proof(holder, marque, nonce=nonce, pilot_id=pilot.pilot_id)
        return pilot.execute(marque, proof, nonce, on_event=on_event)
    finally:
        pilot.close()


def _marque_of_request(request_id: str, harbour_url: str | None, token: str | None,
                       as_json: bool) -> tuple[str, str]:
    """The marque a request holds at the Harbourmaster and the URL of the Pilot that runs it."""
    from marque.cli.connection import checked_id, connect

    with connect(harbour_url, token) as client:
        found = client.marque_for(checked_id(request_id))
    pilot = found.get("pilot") or {}
    marque, url = found.get("marque"), pilot.get("url")
    if not isinstance(marque, str) or not isinstance(url, str) or not url:
        raise InvalidInput(f"the Harbourmaster's answer for request {request_id} holds no "
                           "marque and Pilot URL")
    if not as_json:
        err.say(f"[dim]request {one_line(request_id)}: marque "
                f"{one_line(found.get('marque_id'))} via Pilot {one_line(pilot.get('id'))} at "
                f"{one_line(url)}[/]")
    return marque, url


def _exec_remote(url: str, token: str, holder: dict[str, Any], nonce: str, as_json: bool,
                 pilot_info: dict[str, Any],
                 on_event: Callable[[dict[str, Any]], None]) -> Outcome:
    """Execute through a Pilot service; ``pilot_info`` is filled from its health."""
    from marque.clients.pilot import PilotClient
    from marque.token import make_proof

    client = PilotClient(url)
    try:
        health = client.health()
        pilot_info.update(id=health["pilot_id"], incarnation=health.get("incarnation"))

        def prove() -> str:
            return make_proof(holder, token, nonce=nonce, pilot_id=health["pilot_id"])

        def show(event: dict[str, Any]) -> None:
            if event["event"] == "reconnected" and not as_json:
                lost = literal(event.get("after", ""))
                if event.get("reposted"):
                    err.say(f"[bold yellow]reconnected[/]: the Pilot never received the "
                            f"execution (the connection was lost: {lost}); posted it again "
                            f"under the same nonce")
                else:
                    err.say(f"[bold yellow]reconnected[/] to the same execution (the "
                            f"connection was lost: {lost}); following it")
                return
            on_event(event)

        return client.execute(token, nonce, prove, show)
    finally:
        client.close()


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
            stalled = (pilot.stalled(marque_id, nonce)
                       if outcome.status == "in_progress" and not as_json else None)
        finally:
            pilot.close()
    except NonceReaped as exc:
        # What the ledger kept of the nonce goes with the error, for scripts.
        fail(exc, as_json, {"marque_id": marque_id, "nonce": nonce, "reaped": exc.detail})
    except MarqueError as exc:
        fail(exc, as_json)
    print_outcome(outcome, as_json, stalled)
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
        # As every Pilot start does: a ledger gone back in time rotates, and a target name
        # pointing at another database is found (its attempts are not settled there).
        pilot.check_continuity()
        replaced = [{k: v for k, v in finding.items() if k != "finding"}
                    for _, finding in sorted(pilot.targets_replaced.items())]
        changes = pilot.recover()
        left = [
            {"marque_id": r.marque_id, "nonce": r.nonce, "attempt": r.attempt,
             "status": r.status.value, "error": r.error}
            for r in pilot.unsettled()
        ]
    finally:
        pilot.close()
    if as_json:
        emit_json({"changed": changes, "still_unsettled": left, "targets_replaced": replaced})
        return
    for finding in replaced:
        err.say(f"[bold red]target_replaced[/]: target {literal(finding['target'])} points at "
                f"{literal(finding['location'])} (identity {literal(finding['found_target_id'])}"
                f"), not the database its ledger knows ({literal(finding['bound_location'])}, "
                f"identity {literal(finding['bound_target_id'])}): nothing is settled there. "
                "Point it back, or see `marque pilot target rebind`")
    for change in changes:
        out.say(f"{one_line(change['marque_id'])} nonce {one_line(change['nonce'])} attempt "
                f"{change['attempt']}: {change['from']} → {change['to']}")
    if not changes:
        out.say("nothing settled")
    for record in left:
        error: dict[str, Any] = record["error"] or {}  # type: ignore[assignment]
        reason = error.get("message", "")
        out.say(f"still {record['status']}: {one_line(record['marque_id'])} nonce "
                f"{one_line(record['nonce'])} attempt {record['attempt']} {literal(reason)}")
