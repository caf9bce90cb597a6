"""The two shapes a delivery's body takes: the generic event, and a Slack message.

``json`` is the event as the outbox holds it, in the Standard Webhooks
payload shape ``{type, timestamp, data}`` plus the event's ``id``, with the
request's console page added as ``data.console_url`` when the serving process
knows its public address. ``slack`` is an incoming-webhook message (``text``,
Slack's mrkdwn): what happened to which request, its statements, the stored
preview's rows, and a link to the console page — the approver decides there,
on the full change, never on the message.
"""

from __future__ import annotations

import json
from typing import Any

from marque.harbour.notifications.events import (
    APPROVED,
    AWAITING_APPROVAL,
    EXECUTED,
    RECONCILIATION,
    REJECTED,
    TEST,
)
from marque.harbour.store.outbox import OutboxEvent
from marque.timefmt import iso_time

#: How a Slack message opens, per event type.
_HEADLINES = {
    AWAITING_APPROVAL: ":hourglass_flowing_sand: *Approval needed*",
    APPROVED: ":white_check_mark: *Approved* (marque issued)",
    REJECTED: ":no_entry: *Rejected*",
    EXECUTED: ":anchor: *Executed*",
    RECONCILIATION: ":warning: *Reconciliation needed* (a human must look)",
    TEST: ":bell: *Test notification*",
}
#: Statements a Slack message quotes, and characters of each; the console shows them all.
_SLACK_STATEMENTS = 3
_SLACK_SQL_CHARS = 300


def console_link(console_url: str | None, id: str | None) -> str | None:
    """The console page of a request, when the public address is known."""
    if not console_url or not id:
        return None
    return f"{console_url.rstrip('/')}/requests/{id}"


def generic_body(event: OutboxEvent, console_url: str | None) -> dict[str, Any]:
    """The generic JSON event."""
    data = dict(event.data)
    link = console_link(console_url, event.request)
    if link is not None:
        data["console_url"] = link
    return {"type": event.type, "id": event.id, "timestamp": iso_time(event.created_at),
            "data": data}


def _escape(text: object) -> str:
    """Text as Slack shows it literally (its three control characters escaped)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _quoted_sql(statements: list[Any]) -> list[str]:
    lines = []
    for sql in statements[:_SLACK_STATEMENTS]:
        text = " ".join(str(sql).split())
        if len(text) > _SLACK_SQL_CHARS:
            text = text[:_SLACK_SQL_CHARS] + " … (shortened; the console shows it whole)"
        lines.append(f"```{_escape(text)}```")
    if len(statements) > _SLACK_STATEMENTS:
        lines.append(f"_and {len(statements) - _SLACK_STATEMENTS} more statement(s)_")
    return lines


def _diff_line(diff: dict[str, Any] | None) -> str | None:
    if not diff:
        return None
    rows = ", ".join(f"{s.get('rows')}" for s in diff.get("statements") or [])
    line = (f"Preview ({_escape(diff.get('mode'))}): {diff.get('total_rows')} row(s) in total"
            f" (budget max_rows {diff.get('max_rows')})"
            + (f"; per statement: {rows}" if rows else ""))
    if diff.get("within_max_rows") is False:
        line += " — *over budget*"
    if diff.get("caveats"):
        line += f"; caveats: {_escape(', '.join(diff['caveats']))}"
    return line


def slack_text(event: OutboxEvent, console_url: str | None) -> str:
    """The mrkdwn text of an event's Slack message."""
    data = event.data
    if event.type == TEST:
        return f"{_HEADLINES[TEST]} — {_escape(data.get('message'))}"
    request = data.get("request") or {}
    lines = [f"{_HEADLINES.get(event.type, event.type)} — request `{_escape(request.get('id'))}`"
             f" by *{_escape(request.get('principal'))}* on "
             f"`{_escape(request.get('pilot_id'))}/{_escape(request.get('target'))}`"
             f" (now {_escape(request.get('state'))})"]
    if request.get("reason"):
        lines.append(f"> {_escape(request['reason'])}")
    lines += _quoted_sql(request.get("statements") or [])
    if request.get("effect_set"):
        lines.append("_an Effect Set: the console shows its rows_")
    diff = _diff_line(request.get("diff"))
    if diff:
        lines.append(diff)
    if event.type == AWAITING_APPROVAL:
        lines.append(f"Needs {data.get('approvals_needed')} approval(s); may approve: "
                     f"{_escape(', '.join(data.get('approvers') or [])) or 'nobody yet'}")
    elif data.get("reason"):
        lines.append(f"Why: {_escape(data['reason'])}")
    failure = request.get("failure")
    if isinstance(failure, dict) and failure.get("code"):
        lines.append(f"Outcome: `{_escape(failure['code'])}` {_escape(failure.get('message'))}")
    link = console_link(console_url, event.request)
    if link is not None:
        lines.append(f"<{link}|Open request {_escape(request.get('id'))} in the console>")
    return "\n".join(lines)


def render(event: OutboxEvent, format: str, console_url: str | None) -> bytes:
    """The body of a delivery of ``event`` in ``format`` (``json`` or ``slack``), as sent
    and signed: compact JSON, UTF-8."""
    if format == "slack":
        body: dict[str, Any] = {"text": slack_text(event, console_url), "mrkdwn": True,
                                "unfurl_links": False}
    else:
        body = generic_body(event, console_url)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                      sort_keys=True).encode("utf-8")
