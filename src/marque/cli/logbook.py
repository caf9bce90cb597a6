"""``marque logbook``: read, verify and save the head of a logbook — over a home or a service.

Offline (``--home``) the chain is read from a Harbourmaster's store or a
Pilot's home. Over HTTP (``--harbour URL``) the entries are fetched page by
page from ``GET /v1/logbook`` and checked here, by the same chain rules: the
Harbourmaster is not trusted to say its own logbook holds. A saved head's
signature is checked against the Harbourmaster's JWKS.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from marque.cli.common import (
    emit_event_json,
    emit_json,
    err,
    fail,
    guarded,
    harbour_option,
    harbour_options,
    json_option,
    literal,
    one_line,
    out,
    read_json_file,
    token_option,
    when,
)
from marque.cli.connection import connect
from marque.errors import HarbourUnavailable, InvalidInput, LogbookBroken
from marque.logbook.remote import pages, saved_head_over_http, verify_over_http

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient

any_home_option = click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help="A Harbourmaster's home (its store's logbook) or a Pilot's home (its own logbook); "
         "not with --harbour.")
#: How often ``logbook tail --follow`` asks for new entries, in seconds.
FOLLOW_INTERVAL = 1.0
#: How many of the newest entries ``logbook tail`` prints without ``--after``.
DEFAULT_TAIL = 20


def _where(ctx: click.Context, home: Path | None, harbour_url: str | None) -> str:
    """``"home"`` or ``"harbour"``: exactly one of --home and --harbour must be given.

    A Harbourmaster named only by ``MARQUE_HARBOUR`` gives way to an explicit
    ``--home``: the variable is a default, not a second answer.
    """
    source = ctx.get_parameter_source("harbour_url")
    if home is not None and source == click.core.ParameterSource.ENVIRONMENT:
        return "home"
    if (home is None) == (harbour_url is None):
        raise InvalidInput("give exactly one of --home DIR (offline) and --harbour URL "
                           "(a Harbourmaster service)")
    return "home" if home is not None else "harbour"


@click.group("logbook", no_args_is_help=True)
def logbook() -> None:
    """The hash-chained logbook: verify it, save its head."""


@logbook.command("verify")
@any_home_option
@harbour_options
@click.option("--head", "head_file", type=click.Path(path_type=Path), default=None,
              help="A head saved earlier by `marque logbook head`: the chain must still reach "
                   "it (catches a truncated or rewritten tail).")
@json_option
@click.pass_context
@guarded
def logbook_verify(ctx: click.Context, home: Path | None, harbour_url: str | None,
                   token: str | None, head_file: Path | None, as_json: bool) -> None:
    """Walk the whole chain; exit 0 if it holds, else name the first bad entry (exit 1)."""
    saved = None if head_file is None else read_json_file(head_file, "head")
    head = None
    try:
        if _where(ctx, home, harbour_url) == "home":
            from marque.cli.logbook_homes import saved_head, verify_home

            assert home is not None
            head = None if saved is None else saved_head(home, saved)
            result = verify_home(home, head)
        else:
            client = connect(harbour_url, token)
            try:
                head = None if saved is None else saved_head_over_http(client, saved)
                result = verify_over_http(client, head)
            finally:
                client.close()
    except LogbookBroken as exc:
        fail(exc, as_json, {"intact": False, "break": exc.detail})
    result = {"intact": True, **result}
    if as_json:
        emit_json(result)
        return
    out.say(f"intact: {result['entries']} entries"
            + (f", reaching the saved head at seq {head['seq']}" if head else "")
            + (f"; {result['signed_reports']} outcome(s) signed by their Pilots"
               if result.get("signed_reports") else ""))


@logbook.command("head")
@any_home_option
@harbour_options
@click.option("--out", "out_file", type=click.Path(path_type=Path), default=None,
              help="Also write the head to this file (for a later `logbook verify --head`).")
@json_option
@click.pass_context
@guarded
def logbook_head(ctx: click.Context, home: Path | None, harbour_url: str | None,
                 token: str | None, out_file: Path | None, as_json: bool) -> None:
    """The chain's head {seq, hash, at}; a Harbourmaster's is signed by its issuer key."""
    if _where(ctx, home, harbour_url) == "home":
        from marque.cli.logbook_homes import head_of

        assert home is not None
        head = head_of(home)
    else:
        client = connect(harbour_url, token)
        try:
            head = client.logbook_head()
        finally:
            client.close()
        head = {k: head.get(k) for k in ("seq", "hash", "at", "signed")}
    if out_file is not None:
        out_file.write_text(json.dumps(head, sort_keys=True) + "\n", encoding="utf-8")
    if as_json:
        emit_json(head)
        return
    out.say(f"seq {head['seq']} hash {literal(head['hash'])}"
            + (" (signed)" if head.get("signed") else ""))


# -- tail -------------------------------------------------------------------------------


class _Stop(Exception):
    """SIGINT or SIGTERM while following: stop cleanly."""


def _print_entry(entry: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_event_json(entry)
        return
    body = json.dumps(entry.get("body"), sort_keys=True, separators=(",", ":"))
    out.say(f"{entry.get('seq'):>6} {when(entry.get('at'))} {one_line(entry.get('kind')):<24} "
            f"{one_line(entry.get('actor'))} {one_line(entry.get('subject'))} "
            f"[dim]{one_line(body)}[/]")


@logbook.command("tail")
@harbour_option
@token_option
@click.option("-n", "--lines", "lines", type=click.IntRange(min=1, max=1000),
              default=DEFAULT_TAIL, show_default=True,
              help="Without --after: how many of the newest entries to print first.")
@click.option("--after", type=click.IntRange(min=0), default=None,
              help="Instead of the newest entries, every entry after this seq (0: from the "
                   "first entry).")
@click.option("--kind", default=None, metavar="PREFIX",
              help="Only entries whose kind starts with PREFIX (e.g. `request.`, `execution.`).")
@click.option("--follow", is_flag=True,
              help="Keep printing new entries as they are appended, until interrupted.")
@json_option
@guarded
def logbook_tail(harbour_url: str | None, token: str | None, lines: int, after: int | None,
                 kind: str | None, follow: bool, as_json: bool) -> None:
    """A Harbourmaster's newest logbook entries (or those after a seq); with --follow, new
    ones as they come.

    With --json, without --follow: {entries, next_after}. With --follow each
    entry is a JSON line on stderr as it arrives, and when interrupted the
    command prints {streamed, next_after} and exits 0.
    """
    client = connect(harbour_url, token)
    try:
        if after is None:
            entries, start = newest(client, kind, lines)
        else:
            entries, start = list(pages(client, {}, kind, after)), after
        last = max([start, *(e["seq"] for e in entries if isinstance(e.get("seq"), int))])
        if not follow:
            if as_json:
                emit_json({"entries": entries, "next_after": last})
                return
            for entry in entries:
                _print_entry(entry, False)
            return
        for entry in entries:
            _print_entry(entry, as_json)
        streamed, last = _follow(client, kind, last, as_json)
        streamed += len(entries)
    finally:
        client.close()
    if as_json:
        emit_json({"streamed": streamed, "next_after": last})


def newest(client: HarbourClient, kind: str | None, count: int
           ) -> tuple[list[dict[str, Any]], int]:
    """The newest ``count`` entries (of kinds starting with ``kind``), oldest of them first,
    and the seq they were read up to (the head's, at least).

    The API pages forward from a seq, so the reading starts a window before the
    head and widens it (fourfold) until it holds ``count`` matching entries or
    reaches the first one.
    """
    head = client.logbook_head().get("seq")
    top = head if isinstance(head, int) and not isinstance(head, bool) and head >= 0 else 0
    window = count
    while True:
        start = max(0, top - window)
        entries = list(pages(client, {}, kind, start))
        if len(entries) >= count or start == 0:
            return entries[-count:], top
        window *= 4


def _follow(client: HarbourClient, kind: str | None, after: int,
            as_json: bool) -> tuple[int, int]:
    """Poll for new entries until SIGINT/SIGTERM; returns (entries printed, last seq)."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    streamed, last, lost, reached = 0, after, False, False
    try:
        while True:
            try:
                for entry in pages(client, {}, kind, last):
                    reached = True
                    _print_entry(entry, as_json)
                    streamed += 1
                    if isinstance(entry.get("seq"), int):
                        last = max(last, entry["seq"])
                reached = True
                if lost:
                    lost = False
                    _say_event({"event": "reconnected", "after": last}, as_json,
                               "the Harbourmaster answers again")
            except HarbourUnavailable as exc:
                if not reached:
                    raise  # never reached it: say so rather than wait silently
                if not lost:
                    lost = True
                    _say_event({"event": "unavailable", "error": exc.to_dict()}, as_json,
                               f"the Harbourmaster is unavailable ({exc.message}); "
                               "still trying")
            time.sleep(FOLLOW_INTERVAL)
    except _Stop:
        return streamed, last
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say_event(event: dict[str, Any], as_json: bool, text: str) -> None:
    if as_json:
        emit_event_json(event)
    else:
        err.say(f"[yellow]{literal(text)}[/]")
