"""``marque logbook``: verify a logbook and save its head, offline over a home."""

from __future__ import annotations

import json
from pathlib import Path

import click

from marque.cli.common import emit_json, fail, guarded, json_option, literal, out, read_json_file
from marque.errors import LogbookBroken

any_home_option = click.option(
    "--home", type=click.Path(path_type=Path), required=True,
    help="A Harbourmaster's home (its store's logbook) or a Pilot's home (its own logbook).")


@click.group("logbook", no_args_is_help=True)
def logbook() -> None:
    """The hash-chained logbook: verify it, save its head."""


@logbook.command("verify")
@any_home_option
@click.option("--head", "head_file", type=click.Path(path_type=Path), default=None,
              help="A head saved earlier by `marque logbook head`: the chain must still reach "
                   "it (catches a truncated or rewritten tail).")
@json_option
@guarded
def logbook_verify(home: Path, head_file: Path | None, as_json: bool) -> None:
    """Walk the whole chain; exit 0 if it holds, else name the first bad entry (exit 1)."""
    from marque.harbour.audit import saved_head, verify_home

    head = None if head_file is None else saved_head(home, read_json_file(head_file, "head"))
    try:
        result = verify_home(home, head)
    except LogbookBroken as exc:
        fail(exc, as_json, {"intact": False, "break": exc.detail})
    result = {"intact": True, **result}
    if as_json:
        emit_json(result)
        return
    out.say(f"intact: {result['entries']} entries"
            + (f", reaching the saved head at seq {head['seq']}" if head else ""))


@logbook.command("head")
@any_home_option
@click.option("--out", "out_file", type=click.Path(path_type=Path), default=None,
              help="Also write the head to this file (for a later `logbook verify --head`).")
@json_option
@guarded
def logbook_head(home: Path, out_file: Path | None, as_json: bool) -> None:
    """The chain's head {seq, hash, at}; a Harbourmaster's is signed by its issuer key."""
    from marque.harbour.audit import head_of

    head = head_of(home)
    if out_file is not None:
        out_file.write_text(json.dumps(head, sort_keys=True) + "\n", encoding="utf-8")
    if as_json:
        emit_json(head)
        return
    out.say(f"seq {head['seq']} hash {literal(head['hash'])}"
            + (" (signed)" if head.get("signed") else ""))
