"""``marque ledger``: inspect and reap the execution ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from marque.cli.common import emit_json, guarded, home_option, json_option, literal, out, when

#: How ``ledger stats`` reads for a person: label, and how to show the value.
_STATS_LINES = (
    ("pilot_id", "pilot"),
    ("incarnation", "incarnation"),
    ("schema_version", "schema version"),
    ("marques", "marques"),
    ("live_marques", "live marques"),
    ("claims", "nonces claimed"),
    ("attempts", "attempts"),
    ("unreported_outcomes", "unreported outcomes"),
    ("reapable_marques", "reapable now"),
    ("pop_jtis", "proof ids held"),
    ("size_bytes", "size on disk (bytes)"),
)


@click.group("ledger", no_args_is_help=True)
def ledger() -> None:
    """Inspect and reap the execution ledger."""


@ledger.command("stats")
@home_option
@json_option
@guarded
def ledger_stats(home: Path, as_json: bool) -> None:
    """Ledger size, live marques, unsettled and unreported outcomes."""
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        stats = pilot.stats()
    finally:
        pilot.close()
    if as_json:
        emit_json(stats)
        return
    for key, label in _STATS_LINES:
        if key in stats:
            out.say(f"{label:<22} {literal(stats[key])}")
    by_status: dict[str, Any] = stats.get("attempts_by_status", {})
    out.say("attempts by status     " + ", ".join(f"{k} {v}" for k, v in by_status.items()))
    if stats.get("reapable_after") is not None:
        out.say(f"{'reapable after':<22} {when(stats['reapable_after'])}")


@ledger.command("reap")
@home_option
@json_option
@guarded
def ledger_reap(home: Path, as_json: bool) -> None:
    """Delete settled, reported entries of expired marques (past the clock-skew allowance)."""
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        counts = pilot.reap()
    finally:
        pilot.close()
    if as_json:
        emit_json({"reaped": counts})
    else:
        out.say("reaped " + ", ".join(f"{v} {k}" for k, v in counts.items()))
