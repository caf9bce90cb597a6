"""``marque undo rq_…``: file the undo of a verified request (docs/harbour.md "Undo").

The Harbourmaster derives it from the rows the original's preview sealed and
files it as a new request with ``rolls_back`` set; it is routed, previewed and
approved like any other, and prints as any request does, with the rows it puts
back. A row changed since the original execution is ``undo_conflict`` (exit 4),
named by key; a preview that imaged no rows (or only some) is
``undo_unavailable`` (exit 3). Nothing is filed twice: asking again answers the
same undo while it is active.

``--per-row`` files it as an Effect Set of fenced one-row members instead
(:mod:`marque.harbour.row_undo`): a row changed since fails alone, with its own
receipt, and the others are put back.
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
@click.option("--per-row", is_flag=True, default=False,
              help="Put back each row on its own (an Effect Set with a receipt per row): a "
                   "row changed since fails alone as undo_conflict and the others apply. "
                   "Default: all or nothing.")
@harbour_options
@json_option
@guarded
def undo(id_: str, reason: str | None, request_id: str | None, per_row: bool,
         harbour_url: str | None, token: str | None, as_json: bool) -> None:
    """File the undo of request ID: each row it changed put back, fenced on what it wrote."""
    if not id_.startswith("rq_"):
        raise InvalidInput("give the request's rq_ id (as `marque requests` lists it)")
    if request_id is not None:
        checked_id(request_id)
    request, created = ask_harbour(
        harbour_url, token,
        lambda client: client.undo(checked_id(id_), reason, request_id, per_row=per_row),
        as_json, {"rolls_back": id_})
    if as_json:
        emit_json(request)
        return
    if not created:
        out.say(f"[dim](the undo of {one_line(id_)} was already filed: nothing new was made)[/]")
    print_request(request)
