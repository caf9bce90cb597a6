"""``marque harbour webhooks``: signed notifications to the people who decide."""

from __future__ import annotations

from pathlib import Path

import click

from marque.cli.common import emit_json, guarded, json_option, literal, out, when
from marque.cli.harbour import harbour_home_option
from marque.harbour.notifications.endpoints import FORMATS
from marque.harbour.notifications.events import EVENT_TYPES


@click.group("webhooks", no_args_is_help=True)
def webhooks() -> None:
    """Webhook endpoints that `harbour serve` posts signed request events to."""


@webhooks.command("add")
@harbour_home_option
@click.argument("url")
@click.option("--format", "format_", type=click.Choice(FORMATS), default="json",
              show_default=True,
              help="json: the generic event; slack: a Slack incoming-webhook message.")
@click.option("--event", "events", multiple=True, type=click.Choice(EVENT_TYPES),
              help="An event type to send; repeat for several (default: every type).")
@click.option("--principal", default=None, metavar="NAME",
              help="Send only the events addressed to this principal (an approver gets the "
                   "requests it may approve; a requester its own requests' outcomes).")
@click.option("--secret-file", type=click.Path(path_type=Path), default=None,
              help="Sign with this whsec_… secret (default: make one and print it once).")
@click.option("--allow-http", is_flag=True,
              help="Accept a plain http:// URL to another machine (events cross the network "
                   "readable).")
@json_option
@guarded
def webhooks_add(home: Path, url: str, format_: str, events: tuple[str, ...],
                 principal: str | None, secret_file: Path | None, allow_http: bool,
                 as_json: bool) -> None:
    """Add an endpoint; a secret Marque makes is printed this once (keep it: the receiver
    verifies signatures with it)."""
    from marque.harbour.notifications import admin

    result = admin.add(home, url, format=format_, events=events, principal=principal,
                       secret_file=secret_file, allow_http=allow_http)
    if as_json:
        emit_json(result)
        return
    chosen = ", ".join(result["events"]) or "every event"
    out.say(f"webhook {literal(result['id'])} → {literal(result['url'])} "
            f"({result['format']}; {chosen}"
            + (f"; for {literal(result['principal'])})" if result["principal"] else ")"))
    if "secret" in result:
        out.say(f"secret (shown once): {result['secret']}")


@webhooks.command("list")
@harbour_home_option
@click.option("--all", "include_removed", is_flag=True, help="Include removed endpoints.")
@json_option
@guarded
def webhooks_list(home: Path, include_removed: bool, as_json: bool) -> None:
    """The endpoints and their deliveries by state (never a secret)."""
    from marque.harbour.notifications import admin

    endpoints = admin.list_all(home, include_removed=include_removed)
    if as_json:
        emit_json({"webhooks": endpoints})
        return
    if not endpoints:
        out.say("no webhook endpoints")
    for item in endpoints:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(item["deliveries"].items()))
        removed = f"  removed {when(item['removed_at'])}" if item["removed_at"] else ""
        out.say(f"{literal(item['id'])}  {literal(item['url'])}  {item['format']}  "
                f"{', '.join(item['events']) or 'every event'}"
                + (f"  for {literal(item['principal'])}" if item["principal"] else "")
                + (f"  ({counts})" if counts else "") + removed)


@webhooks.command("remove")
@harbour_home_option
@click.argument("endpoint_id")
@json_option
@guarded
def webhooks_remove(home: Path, endpoint_id: str, as_json: bool) -> None:
    """Stop posting to an endpoint; what it has not yet accepted is cancelled."""
    from marque.harbour.notifications import admin

    result = admin.remove(home, endpoint_id)
    if as_json:
        emit_json(result)
        return
    out.say(f"webhook {literal(result['id'])} removed")


@webhooks.command("test")
@harbour_home_option
@click.argument("endpoint_id")
@json_option
@guarded
def webhooks_test(home: Path, endpoint_id: str, as_json: bool) -> None:
    """Post a signed webhook.test event to an endpoint now; exit 7 if it is not accepted."""
    from marque.harbour.notifications import admin

    result = admin.send_test(home, endpoint_id)
    if as_json:
        emit_json(result)
        return
    out.say(f"webhook {literal(result['id'])} accepted {literal(result['webhook_id'])} "
            f"(HTTP {result['status']})")
