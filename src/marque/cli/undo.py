"""``marque undo rq_…``: file the undo of a verified request (docs/harbour.md "Undo").

The Harbourmaster derives it from the rows the original's preview sealed and
files it as a new request with ``rolls_back`` set; it is routed, previewed and
approved like any other, and prints as any request does, with the rows it puts
back. A row changed since the original execution is ``undo_conflict`` (exit 4),
named by key; a preview that imaged no rows (or only some) is
``undo_unavailable`` (exit 3). Nothing is filed twice: asking again answers the
same undo while it is active.
"""

from __future__ import annotations

import click

from marque.cli.common import emit_json, guarded, harbour_options, json_option, one_line, out
from marque.cli.connection import ask_harbour, checked_id
from marque.cli.control import print_request
from marque.errors import InvalidInput

__all__ = ["undo"]


@click.command("undo")
@click.argument("id_", metavar="ID")
@click.option("--reason", default=None,
              help="Why it is undone: shown to approvers and kept in the logbook.")
@click.option("--request-id", default=None,
              help="The undo's own request id (default: undo-<ID>, so asking again answers "
                   "the same undo).")
@harbour_options
@json_option
@guarded
def undo(id_: str, reason: str | None, request_id: str | None, harbour_url: str | None,
         token: str | None, as_json: bool) -> None:
    """File the undo of request ID: each row it changed put back, fenced on what it wrote."""
    if not id_.startswith("rq_"):
        raise InvalidInput("give the request's rq_ id (as `marque requests` lists it)")
    if request_id is not None:
        checked_id(request_id)
    request, created = ask_harbour(
        harbour_url, token, lambda client: client.undo(checked_id(id_), reason, request_id),
        as_json, {"rolls_back": id_})
    if as_json:
        emit_json(request)
        return
    if not created:
        out.say(f"[dim](the undo of {one_line(id_)} was already filed: nothing new was made)[/]")
    print_request(request)
