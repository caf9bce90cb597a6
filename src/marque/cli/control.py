"""The control-plane commands (DESIGN §9): requests, approvals and expiry over a Harbourmaster.

``marque request`` asks for a change; ``marque requests`` lists and shows
requests and (for an admin) expires one; ``marque approve`` and ``marque
reject`` resolve a request's Checkpoint. All of them talk to a Harbourmaster
service (``--harbour URL``, ``--token T``, or ``MARQUE_HARBOUR`` and
``MARQUE_TOKEN``) through :class:`marque.clients.harbour.HarbourClient`.

The one subtle part is ``marque request``'s retry. A POST whose answer was
lost may still have created the request, so the command never sends a second,
different request: it fixes the caller request id *before* the first attempt
(generating and printing one when none was given) and retries only with that
same id — the Harbourmaster answers a retried intent with the request it
already holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from marque.cli.common import (
    emit_event_json,
    emit_json,
    err,
    fail,
    guarded,
    harbour_options,
    json_option,
    literal,
    one_line,
    out,
    parse_duration,
    when,
)
from marque.cli.connection import ask_harbour, checked_id, connect
from marque.cli.issue import ISOLATION_LEVELS, statements_of
from marque.cli.row_diff import print_row_images, print_undo
from marque.errors import HarbourUnavailable, InvalidInput, MarqueError
from marque.harbour.lifecycle import RequestState

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient

F = Callable[..., Any]

#: Pauses between retries of a ``POST /v1/requests`` whose answer did not arrive (≈ 16 s).
SUBMIT_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

# -- printing a request ---------------------------------------------------------------


_STATE_STYLE = {"awaiting_approval": "yellow", "prepared": "green", "executing": "cyan",
                "verified": "bold green", "reconciliation": "magenta", "failed": "red",
                "rejected": "red", "expired": "dim"}


def print_request(request: dict[str, Any]) -> None:
    """One request as an operator reads it: where it stands and what it waits for."""
    state = str(request.get("state"))
    out.say(f"request {one_line(request.get('id'))} [{_STATE_STYLE.get(state, 'white')}]"
            f"{one_line(state)}[/] (request id {one_line(request.get('request_id'))}, "
            f"by {one_line(request.get('principal'))})")
    out.say(f"  pilot {one_line(request.get('pilot_id'))} target "
            f"{one_line(request.get('target'))}, change {one_line(request.get('change_cid'))}")
    _print_change(request.get("change") or {})
    _print_terms(request)
    print_undo(request.get("undo"))
    _print_routing(request.get("routing"))
    _print_preview(request.get("preview"))
    _print_decisions(request)
    _print_executions(request)
    failure = request.get("failure")
    if failure:
        # While preparing it is why the request has not moved yet, not how it ended.
        colour = "yellow" if request.get("state") == "preparing" else "red"
        out.say(f"  [{colour}]{one_line(failure.get('code'))}[/]: "
                f"{literal(failure.get('message'))}")
    _print_next_step(request)


def _print_change(change: dict[str, Any]) -> None:
    """What the request asks to change: its Effect Set members, or its statements."""
    effect_set = change.get("effect_set") or {}
    for member in (effect_set.get("declaration") or {}).get("members") or []:
        rows = len(((effect_set.get("inputs") or {}).get(member.get("effect_id")) or {})
                   .get("rows") or [])
        out.say(f"  effect {one_line(member.get('effect_id'))}: {one_line(member.get('kind'))} "
                f"{one_line(member.get('table'))} ({rows} input row(s), "
                f"{one_line(member.get('failure_policy'))})")
    for statement in change.get("statements", []):
        params = statement.get("params") or []
        out.say(f"  sql: {one_line(statement.get('sql'))}"
                + (f"  params {one_line(json.dumps(params))}" if params else ""))


def _print_terms(request: dict[str, Any]) -> None:
    """The budget and lifetime asked for, why, and the request it compensates, if any."""
    budget = request.get("budget") or {}
    if budget:
        out.say(f"  budget: {budget.get('executions')} execution(s), max {budget.get('max_rows')}"
                f" rows, {budget.get('attempts_per_nonce')} attempt(s) per nonce; ttl "
                f"{request.get('ttl_seconds')} s")
    if request.get("reason"):
        out.say(f"  reason: {literal(request['reason'])}")
    if request.get("rolls_back"):
        out.say(f"  compensates {one_line(request['rolls_back'])}: approving it rolls that "
                "request back")


def _print_routing(routing: dict[str, Any] | None) -> None:
    if routing:
        out.say(f"  routing: {one_line(routing.get('outcome'))}"
                + (f", {routing.get('approvals')} approval(s) needed"
                   if routing.get("approvals") else "")
                + (", at least two when the preview has caveats"
                   if routing.get("caveats") == "two_approvers" else ""))


def _print_decisions(request: dict[str, Any]) -> None:
    """The Checkpoint, its resolutions, and the marque they issued."""
    checkpoint = request.get("checkpoint")
    if checkpoint:
        out.say(f"  checkpoint {one_line(checkpoint.get('cid'))}, open until "
                f"{when(checkpoint.get('expires_at'))}")
    for resolution in request.get("resolutions") or []:
        out.say(f"  {one_line(resolution.get('decision'))} by "
                f"{one_line(resolution.get('approver'))} at {when(resolution.get('at'))}"
                + (f": {literal(resolution['reason'])}" if resolution.get("reason") else ""))
    marque = request.get("marque")
    if marque:
        out.say(f"  marque {one_line(marque.get('marque_id'))}, valid until "
                f"{when(marque.get('expires_at'))}")


def _print_executions(request: dict[str, Any]) -> None:
    """Each execution attempt the Pilot reported, and an Effect Set's receipt."""
    for execution in request.get("executions") or []:
        error = execution.get("error") or {}
        out.say(f"  execution nonce {one_line(execution.get('nonce'))} attempt "
                f"{execution.get('attempt')}: {one_line(execution.get('status'))}"
                + (f", rows_affected={execution['rows_affected']}"
                   if execution.get("rows_affected") is not None else "")
                + (f" ({one_line(error.get('code'))})" if error else ""))
    receipt = request.get("receipt")
    if receipt:
        out.say(f"  set receipt {one_line(receipt.get('set_receipt_cid'))}: "
                f"{one_line(receipt.get('status'))} (Run {one_line(receipt.get('run_outcome'))})")
        for effect_id, states in (receipt.get("row_states") or {}).items():
            out.say(f"    {one_line(effect_id)}: " + ", ".join(
                "unknown (needs reconciliation)" if s == "unknown" else one_line(s)
                for s in states))


def _print_preview(preview: dict[str, Any] | None) -> None:
    if not preview:
        return
    if "effect_preview_cid" in preview:
        out.say(f"  effect preview {one_line(preview['effect_preview_cid'])}")
        for member in preview.get("members") or []:
            out.say(f"    {one_line(member.get('effect_id'))}: {member.get('item_count')} row(s),"
                    f" {one_line(member.get('strength'))}")
            for row in member.get("changes") or []:
                before, after = row.get("before") or {}, row.get("after") or {}
                out.say(f"      {literal(row.get('row_or_item_key'))}: "
                        f"{literal(before.get('value', before.get('state')))} → "
                        f"{literal(after.get('value', after.get('state')))}")
        return
    within = "within" if preview.get("within_max_rows") else "OVER"
    out.say(f"  preview ({one_line(preview.get('mode'))}): {preview.get('total_rows')} row(s), "
            f"{within} max_rows {preview.get('max_rows')}")
    if preview.get("within_max_rows") is False:
        out.say("  [red]not approvable[/]: executing it would claim an attempt and abort with "
                "max_rows_exceeded (preview_over_budget)")
    if preview.get("diff_cid"):
        out.say(f"  diff {one_line(preview['diff_cid'])}")
    if preview.get("caveats"):
        out.say("  [yellow]This preview may not show everything:[/] "
                + ", ".join(one_line(c) for c in preview["caveats"]))
    for statement in preview.get("statements") or []:
        out.say(f"    {statement.get('rows')} row(s): {one_line(statement.get('sql'))}")
        for caveat in statement.get("preview_caveats") or []:
            out.say(f"      [yellow]caveat {one_line(caveat.get('code'))}[/]: "
                    f"{literal(caveat.get('message'))}")
        print_row_images(statement.get("row_images"))
        sample = statement.get("sample") or {}
        if sample.get("columns"):
            out.say("      " + " | ".join(one_line(c) for c in sample["columns"]))
            for row in sample.get("rows") or []:
                out.say("      " + " | ".join(one_line(v) for v in row))


def _print_next_step(request: dict[str, Any]) -> None:
    rid = one_line(request.get("id"))
    state = request.get("state")
    if state == "awaiting_approval":
        out.say(f"  waiting for approval: an approver runs `marque approve {rid}` "
                f"(or `marque reject {rid} --reason …`)")
    elif state == "prepared":
        out.say(f"  ready: `marque exec --request {rid} --key YOUR_KEY --nonce N`")
    elif state == "preparing":
        out.say("  still preparing (the Pilot's preview did not complete): the Harbourmaster "
                "tries again by itself; sending the same request again with the same "
                "--request-id tries at once")


# -- marque request ----------------------------------------------------------------------


def change_body(sql: tuple[str, ...], param: tuple[str, ...], isolation: str,
                statement_timeout: str | None) -> dict[str, Any]:
    """The ``change`` of a request body, checked locally as the Pilot will check it."""
    from marque.change import Change

    statements = statements_of(sql, param)
    timeout_ms = None if statement_timeout is None else parse_duration(statement_timeout) * 1000
    change = Change(tuple(statements), isolation=isolation, statement_timeout_ms=timeout_ms)
    body: dict[str, Any] = {"statements": [s.to_claim() for s in change.statements],
                            "isolation": change.isolation}
    if timeout_ms is not None:
        body["statement_timeout_ms"] = timeout_ms
    return body


def effects_body(declaration_file: Path, targeted: tuple[str, ...]) -> dict[str, Any]:
    """The ``change`` of an Effect Set request: ``{effect_set: {declaration, inputs,
    strength}}``, every member's input read (relative to the declaration) and captured,
    and the whole set bound locally first, as the Harbourmaster will bind it."""
    from marque.cli.effects import read_declared
    from marque.effects.preview import Strength
    from marque.effects.request import EffectSetSubmission

    bound = read_declared(declaration_file, targeted)
    declaration = bound.declaration
    submission = EffectSetSubmission(
        declaration, {m.declaration.effect_id: m.input for m in bound.members},
        {effect_id: Strength.TARGETED for effect_id in targeted})
    return {"effect_set": submission.to_json()}


def submit_with_retry(client: HarbourClient, body: dict[str, Any], request_id: str,
                      on_retry: Callable[[HarbourUnavailable, float], None],
                      delays: tuple[float, ...] = SUBMIT_RETRY_DELAYS
                      ) -> tuple[dict[str, Any], bool]:
    """``POST /v1/requests``, retried under the SAME request id while no answer arrives.

    Only a lost answer is retried (:class:`HarbourUnavailable` after the POST may
    have left): a second POST with the same id and intent is answered with the
    request the first created, if it did, so no retry can make a second request.
    Everything the Harbourmaster *answered* is final, and so is a connection
    refused before anything was ever sent (``detail["sent"]`` false on every try so
    far): then no request exists, and waiting would only hide that the
    Harbourmaster is down.
    """
    maybe_sent = False
    for delay in (*delays, None):
        try:
            return client.submit(body, request_id)
        except HarbourUnavailable as exc:
            maybe_sent = maybe_sent or exc.detail.get("sent") is not False
            if delay is None or not maybe_sent:
                raise
            on_retry(exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


@click.command("request")
@click.option("--pilot", "pilot_id", required=True,
              help="The Pilot (its pilot_id, as registered with the Harbourmaster) that runs "
                   "the change.")
@click.option("--target", required=True, help="The target's name as that Pilot knows it.")
@click.option("--sql", "sql", multiple=True,
              help="One statement; repeat for more (run in order, in one transaction). SQLite "
                   "uses ? placeholders, PostgreSQL %s. Not with --effects.")
@click.option("--effects", "effects_file", type=click.Path(path_type=Path), default=None,
              help="An Effect Set declaration (JSON, marque-effect-set/0.1) instead of --sql; "
                   "each member's input file is read relative to it and sent as its captured "
                   "relation.")
@click.option("--targeted", "targeted", multiple=True, metavar="EFFECT_ID",
              help="With --effects: preview this member targeted (before/after unavailable) "
                   "instead of full_diff; repeat for more.")
@click.option("--param", "param", multiple=True,
              help="A JSON array of parameters for the n-th --sql (in order).")
@click.option("--executions", type=int, required=True,
              help="How many distinct nonces may run the marque (its budget).")
@click.option("--max-rows", type=int, required=True,
              help="The most rows all statements together may affect (or return, for a read).")
@click.option("--attempts", type=int, default=3, show_default=True,
              help="Attempts per nonce after attempts that were provably not applied.")
@click.option("--isolation", type=click.Choice(ISOLATION_LEVELS), default="read_committed",
              show_default=True, help="The target transaction's isolation level.")
@click.option("--statement-timeout", default=None,
              help="The statement timeout for this change (e.g. 30s); default: the Pilot's.")
@click.option("--ttl", default="15m", show_default=True,
              help="How long the marque lives once issued: 90s, 15m, 2h, 1d (routing may cap "
                   "it).")
@click.option("--reason", default=None, help="Why: shown to approvers and kept in the logbook.")
@click.option("--request-id", default=None,
              help="Your id for this request, your retry key: the same id and intent answers "
                   "the same request, never a second one. Default: a new one, printed.")
@harbour_options
@json_option
@guarded
def request_(pilot_id: str, target: str, sql: tuple[str, ...], effects_file: Path | None,
             targeted: tuple[str, ...], param: tuple[str, ...],
             executions: int, max_rows: int, attempts: int, isolation: str,
             statement_timeout: str | None, ttl: str, reason: str | None,
             request_id: str | None, harbour_url: str | None, token: str | None,
             as_json: bool) -> None:
    """Ask the Harbourmaster for a change; prints the request object.

    Routing decides at once: a read the config allows gets its marque now; a
    change that needs approval gets an exact preview from the Pilot and waits
    for an approver. A lost answer is retried with the same request id.
    """
    from marque.change import Budget
    from marque.request_ids import new_request_id

    if request_id is not None:
        checked_id(request_id)
    budget = Budget(executions, max_rows, attempts)
    change = _requested_change(sql, param, effects_file, targeted, isolation,
                               statement_timeout)
    body: dict[str, Any] = {
        "pilot_id": pilot_id, "target": target, "change": change,
        "budget": budget.to_claim(), "ttl_seconds": parse_duration(ttl),
    }
    if reason is not None:
        body["reason"] = reason
    client = connect(harbour_url, token)
    generated = request_id is None
    rid = new_request_id() if request_id is None else request_id
    if generated:
        # Said before the first attempt: whatever happens next, the caller can retry it.
        if as_json:
            emit_event_json({"event": "request_id", "request_id": rid, "generated": True})
        else:
            err.say(f"request id {one_line(rid)} (generated: to retry this request, pass "
                    f"--request-id {one_line(rid)})")
    try:
        request, created = _submit_saying_retries(client, body, rid, as_json)
    finally:
        client.close()
    if as_json:
        emit_json(request)
        return
    if not created:
        out.say("[dim](this request id already names this request: nothing new was made)[/]")
    print_request(request)


def _requested_change(sql: tuple[str, ...], param: tuple[str, ...], effects_file: Path | None,
                      targeted: tuple[str, ...], isolation: str,
                      statement_timeout: str | None) -> dict[str, Any]:
    """The request's ``change``: an Effect Set (``--effects``) or statements (``--sql``)."""
    if effects_file is not None:
        if sql or param or statement_timeout is not None:
            raise InvalidInput("--effects asks for an Effect Set: give no --sql, --param or "
                               "--statement-timeout with it")
        return effects_body(effects_file, targeted)
    if not sql:
        raise InvalidInput("give the change: --sql (repeatable) or --effects FILE")
    if targeted:
        raise InvalidInput("--targeted is for an Effect Set (--effects)")
    return change_body(sql, param, isolation, statement_timeout)


def _submit_saying_retries(client: HarbourClient, body: dict[str, Any], rid: str,
                           as_json: bool) -> tuple[dict[str, Any], bool]:
    """:func:`submit_with_retry`, saying each retry; a failure ends the command, telling
    the caller to retry with the same request id when the request may exist."""
    retried = False

    def on_retry(exc: HarbourUnavailable, delay: float) -> None:
        nonlocal retried
        retried = True
        if as_json:
            emit_event_json({"event": "retrying", "request_id": rid, "after": exc.message,
                             "delay_seconds": delay})
        else:
            err.say(f"[yellow]no answer[/] ({literal(exc.message)}); retrying with the same "
                    f"request id in {delay:g} s")

    try:
        return submit_with_retry(client, body, rid, on_retry)
    except MarqueError as exc:
        extra = {"request_id": rid}
        if isinstance(exc.detail.get("id"), str):
            extra["id"] = exc.detail["id"]
        if not as_json and isinstance(exc, HarbourUnavailable) and (
                exc.detail.get("sent") is not False or retried):
            err.say(f"gave up; the request may or may not exist: retry with --request-id "
                    f"{one_line(rid)} (never without it)")
        fail(exc, as_json, extra)


# -- marque requests ---------------------------------------------------------------------


_STATES = tuple(state.value for state in RequestState)
state_option = click.option("--state", type=click.Choice(_STATES), default=None,
                            help="Only requests in this state.")


limit_option = click.option(
    "--limit", type=click.IntRange(min=1), default=None, metavar="N",
    help="Only the newest N requests (by default every one, fetched a page at a time).")


def _list(state: str | None, harbour_url: str | None, token: str | None,
          as_json: bool, limit: int | None = None) -> None:
    from marque.harbour.views import REQUESTS_PAGE_MAX

    client = connect(harbour_url, token)
    more = False
    try:
        if limit is None:
            requests = client.list_requests(state)
        else:
            requests = []
            for item in client.iter_requests(state, page=min(limit + 1, REQUESTS_PAGE_MAX)):
                if len(requests) == limit:
                    more = True
                    break
                requests.append(item)
    finally:
        client.close()
    if as_json:
        emit_json({"requests": requests, **({"more": more} if limit is not None else {})})
        return
    if more:
        out.say(f"[dim](the newest {limit}; more are older)[/]")
    if not requests:
        out.say("no requests" + (f" in state {state}" if state else ""))
    for item in requests:
        failure = item.get("failure") or {}
        out.say(f"{one_line(item.get('id'))}  {one_line(item.get('state')):<18} "
                f"{one_line(item.get('principal'))} → {one_line(item.get('pilot_id'))}/"
                f"{one_line(item.get('target'))}  {when(item.get('created_at'))}"
                f"  {one_line(item.get('request_id'))}"
                + (f"  ({one_line(failure.get('code'))})" if failure else ""))


@click.group("requests", invoke_without_command=True)
@state_option
@limit_option
@harbour_options
@json_option
@click.pass_context
def requests(ctx: click.Context, state: str | None, limit: int | None,
             harbour_url: str | None, token: str | None, as_json: bool) -> None:
    """List requests (`marque requests [--state S] [--limit N]`), show one, or expire one
    (admin)."""
    if ctx.invoked_subcommand is None:
        guarded(_list)(state=state, harbour_url=harbour_url, token=token, as_json=as_json,
                       limit=limit)


@requests.command("list")
@state_option
@limit_option
@harbour_options
@json_option
@guarded
def requests_list(state: str | None, limit: int | None, harbour_url: str | None,
                  token: str | None, as_json: bool) -> None:
    """The requests you may see, newest first (a requester sees their own); every one, or
    the newest N with --limit."""
    _list(state, harbour_url, token, as_json, limit)


@requests.command("show")
@click.argument("id_", metavar="ID")
@harbour_options
@json_option
@guarded
def requests_show(id_: str, harbour_url: str | None, token: str | None,
                  as_json: bool) -> None:
    """One request by its rq_ id or by your own request id: preview, checkpoint, approvals,
    executions."""
    client = connect(harbour_url, token)
    try:
        request = client.get_request(checked_id(id_))
    finally:
        client.close()
    if as_json:
        emit_json(request)
        return
    print_request(request)


@requests.command("expire")
@click.argument("id_", metavar="ID")
@click.option("--reason", required=True, help="Why it is expired (kept in the logbook).")
@harbour_options
@json_option
@guarded
def requests_expire(id_: str, reason: str, harbour_url: str | None, token: str | None,
                    as_json: bool) -> None:
    """Admin: expire a request (a prepared one only once the Pilot's evidence shows it can no
    longer run)."""
    _resolve(lambda client, rid: client.expire(rid, reason), id_, harbour_url, token, as_json)


# -- marque approve / reject -------------------------------------------------------------


def _resolve(call: Callable[[HarbourClient, str], dict[str, Any]], id_: str,
             harbour_url: str | None, token: str | None, as_json: bool) -> None:
    request = ask_harbour(harbour_url, token, lambda client: call(client, checked_id(id_)),
                          as_json, {"id": id_})
    if as_json:
        emit_json(request)
        return
    print_request(request)


@click.command("approve")
@click.argument("id_", metavar="ID")
@click.option("--reason", default=None, help="Why you approve (kept with the Resolution).")
@harbour_options
@json_option
@guarded
def approve(id_: str, reason: str | None, harbour_url: str | None, token: str | None,
            as_json: bool) -> None:
    """Approve a request's Checkpoint; the last approval needed issues its marque."""
    _resolve(lambda client, rid: client.approve(rid, reason), id_, harbour_url, token, as_json)


@click.command("reject")
@click.argument("id_", metavar="ID")
@click.option("--reason", required=True, help="Why you reject it (required; the requester "
                                              "sees it).")
@harbour_options
@json_option
@guarded
def reject(id_: str, reason: str, harbour_url: str | None, token: str | None,
           as_json: bool) -> None:
    """Reject a request's Checkpoint: the request ends `rejected`, no marque."""
    if not reason.strip():
        raise InvalidInput("--reason must say why (it is shown to the requester)")
    _resolve(lambda client, rid: client.reject(rid, reason), id_, harbour_url, token, as_json)
