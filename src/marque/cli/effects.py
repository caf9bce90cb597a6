"""``marque effects …``: Effect Sets on the embedded Pilot (DESIGN §7).

``preview`` reads the rows a declaration changes from a target and stores the
preview in the Pilot's ledger by its ``effect_preview_cid`` (what ``marque
issue --effects-preview`` then names); ``show`` prints a stored preview;
``apply`` executes an Effect Set marque like ``exec`` and prints its set
receipt; ``receipt`` prints every receipt of one execution; ``reconcile``
settles one execution's unknown rows from their row stamps.

Exit statuses follow DESIGN §9 from the latest attempt's set receipt: 0 applied
(or accepted), 4 failed, partial_failure or not applied, 5 unknown; an attempt that
sealed no receipt (refused before any row was sent) exits by its error's class — a
failed resume revalidation 3, a stale preview 4 —, never by an earlier attempt's
receipt; refusals before the claim as any command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from marque.cli.common import (
    CommandExit,
    emit_json,
    err,
    fail,
    guarded,
    home_option,
    json_option,
    literal,
    one_line,
    out,
    read_json_file,
    read_marque_file,
)
from marque.errors import EffectDeclarationInvalid, InvalidInput, MarqueError, Refusal

#: Exit status by set receipt status (DESIGN §9: 0 applied, 4 not (all) applied, 5 unknown).
SET_EXIT = {"applied": 0, "accepted": 0, "partial_failure": 4, "failed": 4,
            "unknown_outcome": 5}
#: Exit status by the Run's outcome, once reconciliation has spoken.
RUN_EXIT = {"succeeded": 0, "failed": 4, "needs_reconciliation": 5}


@click.group("effects", no_args_is_help=True)
def effects() -> None:
    """Effect Sets: preview rows, apply them row by row, read receipts, reconcile."""


def read_declared(declaration_file: Path, targeted: tuple[str, ...],
                  overrides: tuple[str, ...] = ()) -> Any:
    """The declaration in ``declaration_file`` bound to its members' inputs (a
    :class:`~marque.effects.declare.BoundEffectSet`); every ``--targeted`` member must be
    one it declares."""
    from marque.effects.declare import bind_files, parse_declaration_bytes

    try:
        raw = declaration_file.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"declaration {declaration_file}: {exc.strerror}") from exc
    declaration = parse_declaration_bytes(raw)
    unknown = sorted(set(targeted) - {m.effect_id for m in declaration.members})
    if unknown:
        raise EffectDeclarationInvalid(f"--targeted names no member {unknown[0]!r}",
                                       detail={"rule": "targeted", "path": "--targeted"})
    return bind_files(declaration, read_inputs(declaration_file, declaration, overrides))


def read_inputs(declaration_file: Path, declaration: Any,
            overrides: tuple[str, ...]) -> dict[str, tuple[bytes, str]]:
    """Each member's input file (its ``input``, relative to the declaration, or an
    ``--input EFFECT_ID=FILE``), read, with its format from the extension."""
    paths: dict[str, Path] = {}
    for member in declaration.members:
        if member.input is not None:
            paths[member.effect_id] = declaration_file.parent / member.input
    for item in overrides:
        effect_id, sep, given = item.partition("=")
        if not sep or not effect_id or not given:
            raise InvalidInput(f"--input must be EFFECT_ID=FILE, got {item!r}")
        paths[effect_id] = Path(given)
    files = {}
    for effect_id, path in paths.items():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidInput(f"input of {effect_id}: cannot read {path}: {exc.strerror}") from exc
        files[effect_id] = (data, "csv" if path.suffix.lower() == ".csv" else "json")
    return files


@effects.command("preview")
@home_option
@click.option("--declaration", "declaration_file", type=click.Path(path_type=Path),
              required=True, help="The Effect Set declaration (JSON, marque-effect-set/0.1).")
@click.option("--target", required=True, help="The target's name as this Pilot knows it.")
@click.option("--input", "inputs", multiple=True, metavar="EFFECT_ID=FILE",
              help="A member's input relation (JSON or CSV), instead of its declared input.")
@click.option("--request-id", default=None,
              help="Your request id: the keys bind it (default: a new one, printed).")
@click.option("--targeted", "targeted", multiple=True, metavar="EFFECT_ID",
              help="Preview this member targeted (before/after unavailable) instead of "
                   "full_diff.")
@json_option
@guarded
def preview(home: Path, declaration_file: Path, target: str, inputs: tuple[str, ...],
            request_id: str | None, targeted: tuple[str, ...], as_json: bool) -> None:
    """Preview an Effect Set on TARGET; store it in the ledger by its effect_preview_cid.

    Nothing is claimed, stamped or spent. Prints the preview object.
    """
    from marque.effects.preview import Strength
    from marque.effects.request import EffectPreviewRequest, run_identity_cid
    from marque.harbour.identity import authority_scope_cid, logical_request_scope
    from marque.pilot import open_pilot
    from marque.request_ids import check_request_id, new_request_id

    bound = read_declared(declaration_file, targeted, inputs)
    declaration = bound.declaration
    request_id = check_request_id(request_id) if request_id else new_request_id()
    pilot = open_pilot(home, recover=False)
    try:
        # A local request's authority: this Pilot's home, as the local principal.
        scope = logical_request_scope(authority_scope_cid(f"local:{pilot.pilot_id}", "local"),
                                      request_id)
        request = EffectPreviewRequest(
            declaration, {m.declaration.effect_id: m.input for m in bound.members}, scope,
            run_identity_cid(scope, bound), {eid: Strength.TARGETED for eid in targeted})
        made = pilot.preview_effects(request, target)
    finally:
        pilot.close()
    body = made.to_json()
    if as_json:
        emit_json({**body, "request_id": request_id})
        return
    _print_preview(body)
    out.say(f"request id {one_line(request_id)}")


def _print_preview(body: dict[str, Any]) -> None:
    out.say(f"[bold]effect_preview_cid[/] {one_line(body['effect_preview_cid'])}")
    for member in body["members"]:
        out.say(f"{one_line(member['effect_id'])}: {member['kind']} {one_line(member['table'])} "
                f"({member['item_count']} row{'s' * (member['item_count'] != 1)}, "
                f"{member['failure_policy']}, {member['strength']})")
        for change in member["changes"]:
            before, after = change["before"], change["after"]
            out.say(f"  {literal(change['row_or_item_key'])}: "
                    f"{literal(before.get('value', before['state']))} → "
                    f"{literal(after.get('value', after['state']))}")


@effects.command("show")
@home_option
@click.argument("effect_preview_cid")
@json_option
@guarded
def show(home: Path, effect_preview_cid: str, as_json: bool) -> None:
    """The stored preview EFFECT_PREVIEW_CID (read-only)."""
    from marque.errors import NotFound
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        body = pilot.ledger.effect_preview(effect_preview_cid)
    finally:
        pilot.close()
    if body is None:
        raise NotFound(f"this Pilot's ledger holds no Effect preview {effect_preview_cid}")
    if as_json:
        emit_json(body)
    else:
        _print_preview(body)


def _exit_status(outcome: dict[str, Any] | None, summary: dict[str, Any],
                 sealed: dict[str, Any] | None) -> int:
    """The exit status of the latest attempt (``outcome``), from its own result: its set
    receipt (``summary``), or — when it sealed none, refused before any row was sent — its
    error's class (a refusal such as ``resume_revalidation_failed`` is 3). An earlier
    attempt's receipt never speaks for it; ``sealed`` is used only when no attempt is
    recorded at all."""
    from marque.errors import NotApplied, lookup
    from marque.outcome import EXIT_STATUS

    if outcome is not None:
        if outcome["status"] in ("indeterminate", "in_progress"):
            return EXIT_STATUS[outcome["status"]]
        if not summary:
            code = (outcome.get("error") or {}).get("code")
            try:
                cls = lookup(code) if isinstance(code, str) else None
            except KeyError:
                cls = None
            if cls is not None and issubclass(cls, (Refusal, NotApplied)):
                return cls.exit_status
            return EXIT_STATUS.get(outcome["status"], 4)
    status = summary.get("status") or (None if outcome is not None else
                                       (sealed or {}).get("status"))
    if status is None:
        return 4
    if summary.get("run_outcome") in RUN_EXIT:
        # After reconciliation the sealed receipt still says what apply saw; the Run's
        # outcome from every row's latest validated state is what holds now.
        return RUN_EXIT[summary["run_outcome"]]
    return SET_EXIT[status]


def _finish(receipts: dict[str, Any], outcome: dict[str, Any] | None, as_json: bool) -> None:
    """Print ``{outcome, set_receipt, …}`` and exit by the latest attempt's outcome."""
    sealed = receipts.get("set_receipt")
    summary = ((outcome or {}).get("result") or {}).get("effect_set") or {}
    code = _exit_status(outcome, summary, sealed)
    if as_json:
        emit_json({"outcome": outcome, **receipts})
    else:
        if outcome is not None:
            out.say(f"[bold]{outcome['status']}[/] marque {one_line(outcome['marque_id'])} "
                    f"nonce {one_line(outcome['nonce'])} attempt {outcome['attempt']}"
                    + (" [dim](recorded outcome: nothing ran now)[/]"
                       if outcome.get("replayed") else ""))
            if outcome.get("error"):
                out.say(f"  error {one_line(outcome['error']['code'])}: "
                        f"{literal(outcome['error']['message'])}")
        if sealed is not None:
            of = receipts.get("set_receipt_attempt")
            earlier = outcome is not None and of is not None and of != outcome["attempt"]
            out.say(f"set receipt {one_line(sealed['receipt_cid'])}"
                    + (f" of attempt {of} (attempt {outcome['attempt']} sealed none)"
                       if earlier and outcome is not None else "")
                    + f": [bold]{sealed['status']}[/]"
                    + (f" (now {summary['run_outcome']})" if summary.get("run_outcome") else ""))
            for entry in sealed["members"]:
                out.say(f"  {one_line(entry['effect_id'])}: {entry['state']}")
        for receipt in receipts.get("reconciliation_receipts", []):
            out.say(f"  reconciled {one_line(receipt['row_preview_cid'])} attempt "
                    f"{receipt['attempt_sequence']}: {receipt['outcome']['state']}")
        _print_run(receipts.get("run"))
    raise CommandExit(code)


def _print_run(run: dict[str, Any] | None) -> None:
    """The Run's state, what it waits for, and why it ended (if it failed)."""
    if run is None:
        return
    action = (run.get("next_action") or {}).get("kind", "none")
    error = run.get("terminal_error") or {}
    out.say(f"run [bold]{run['state']}[/] (revision {run['revision']})"
            + (f", next: {one_line(action)}" if action != "none" else "")
            + (f", ended by {one_line(error['code'])} in {one_line(error['phase'])}"
               if error.get("code") else ""))


@effects.command("apply")
@home_option
@click.option("--marque", "marque_file", type=click.Path(path_type=Path), required=True,
              help="The file holding the Effect Set marque (compact JWS).")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The holder's private JWK file (signs the proof of possession).")
@click.option("--nonce", required=True,
              help="The execution nonce: your retry key; the same nonce never applies twice.")
@json_option
def apply(home: Path, marque_file: Path, key: Path, nonce: str, as_json: bool) -> None:
    """Apply an Effect Set marque once for NONCE, row by row; print its set receipt."""
    from marque.cli.execution import print_event
    from marque.outcome import refusal_object
    from marque.pilot import open_pilot
    from marque.token import make_proof, unverified_claims

    token = ""
    pilot_info: dict[str, Any] = {"id": None, "incarnation": None}
    try:
        holder = read_json_file(key, "holder key")
        token = read_marque_file(marque_file)
        pilot = open_pilot(home)
        pilot_info.update(id=pilot.pilot_id, incarnation=pilot.incarnation)
        try:
            proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot.pilot_id)
            outcome = pilot.execute(token, proof, nonce, on_event=lambda e: print_event(e, as_json))
            receipts = _receipts(pilot, outcome.marque_id, nonce)
        finally:
            pilot.close()
    except Refusal as exc:
        jti = (unverified_claims(token) or {}).get("jti") if token else None
        fail(exc, as_json, refusal_object(jti if isinstance(jti, str) else None, nonce,
                                          pilot_info, exc.to_dict()))
    except MarqueError as exc:
        fail(exc, as_json)
    _finish(receipts, outcome.to_dict(), as_json)


def _receipts(pilot: Any, marque_id: str, nonce: str) -> dict[str, Any]:
    """The execution's receipts; none for one refused at admission (no row reserved)."""
    from marque.errors import NotFound

    try:
        found: dict[str, Any] = pilot.effect_receipts(marque_id, nonce)
    except NotFound:
        return {"marque_id": marque_id, "nonce": nonce, "set_receipt": None,
                "set_receipt_attempt": None, "member_receipts": [],
                "reconciliation_receipts": [], "rows": []}
    return found


@effects.command("receipt")
@home_option
@click.argument("marque_id")
@click.argument("nonce")
@json_option
@guarded
def receipt(home: Path, marque_id: str, nonce: str, as_json: bool) -> None:
    """Every receipt and dispatch row of one Effect Set execution (read-only)."""
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        receipts = _receipts(pilot, marque_id, nonce)
        record = pilot.ledger.outcome(marque_id, nonce)
        outcome = pilot.outcome(marque_id, nonce).to_dict() if record is not None else None
    finally:
        pilot.close()
    _finish(receipts, outcome, as_json)


@effects.command("reconcile")
@home_option
@click.argument("marque_id")
@click.argument("nonce")
@json_option
@guarded
def reconcile(home: Path, marque_id: str, nonce: str, as_json: bool) -> None:
    """Settle one execution's unknown rows from their row stamps (observe, never resend)."""
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        pilot.settle(marque_id, nonce)
        receipts = _receipts(pilot, marque_id, nonce)
        outcome = pilot.outcome(marque_id, nonce).to_dict()
    finally:
        pilot.close()
    if not as_json:
        err.say(f"[dim]reconciled marque {one_line(marque_id)} nonce {one_line(nonce)}[/]")
    _finish(receipts, outcome, as_json)
