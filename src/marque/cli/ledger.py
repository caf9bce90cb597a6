"""``marque ledger``: inspect and reap the execution ledger.

``stats`` and ``reap`` use one rule for "expired": a marque's expiry plus the
Pilot's clock-skew allowance (``settings.skew_seconds``), since until then the
Pilot could still accept it. What stats calls reapable is what reap deletes,
and both say when the next marque's window closes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from marque.cli.common import emit_json, guarded, home_option, json_option, literal, out, when

#: How ``ledger stats`` reads for a person: label, and the stats key.
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
    ("expired_waiting_marques", "expired, not reapable"),
    ("reaped_marques", "reaped so far"),
    ("pop_jtis", "proof ids held"),
    ("size_bytes", "size on disk (bytes)"),
)

#: How ``ledger reap`` names what it deleted (the JSON keeps the table names).
_REAPED_NAMES = (
    ("claims", "nonce", "nonces"),
    ("attempts", "attempt", "attempts"),
    ("observations", "observation", "observations"),
    ("events", "event batch", "event batches"),
    ("outbox", "delivered report", "delivered reports"),
)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _window(stats: dict[str, Any]) -> str:
    """When the next marque's window closes, in words."""
    allowance = f"{stats['skew_seconds']:g} s"
    if stats.get("next_reapable_at") is None:
        return "no live marques"
    return (f"the next marque's window closes at {when(stats['next_reapable_at'])} (its expiry "
            f"plus the {allowance} clock-skew allowance)")


@click.group("ledger", no_args_is_help=True)
def ledger() -> None:
    """Inspect and reap the execution ledger."""


@ledger.command("stats")
@home_option
@json_option
@guarded
def ledger_stats(home: Path, as_json: bool) -> None:
    """Ledger size, live marques, unsettled and unreported outcomes, what reap would delete."""
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
    out.say(f"{'attempts by status':<22} " + ", ".join(f"{literal(k)} {literal(v)}"
                                                      for k, v in by_status.items()))
    out.say(f"{'clock-skew allowance':<22} {stats['skew_seconds']:g} s "
            "(a marque is live until its expiry plus this)")
    out.say(f"{'next reapable at':<22} {when(stats.get('next_reapable_at'))}")


@ledger.command("reap")
@home_option
@json_option
@guarded
def ledger_reap(home: Path, as_json: bool) -> None:
    """Delete settled, reported entries of expired marques (past the clock-skew allowance).

    Each reaped nonce leaves a small record, so `marque outcome` answers
    nonce_reaped (when, and how it ended) rather than not_found.
    """
    from marque.pilot import open_pilot

    pilot = open_pilot(home, recover=False)
    try:
        counts = pilot.reap()
        stats = pilot.stats()
    finally:
        pilot.close()
    if as_json:
        emit_json({"reaped": counts, "skew_seconds": stats["skew_seconds"],
                   "next_reapable_at": stats["next_reapable_at"],
                   "expired_waiting_marques": stats["expired_waiting_marques"]})
        return
    if counts["marques"]:
        parts = ", ".join(_plural(counts[key], one, many) for key, one, many in _REAPED_NAMES)
        out.say(f"reaped {_plural(counts['marques'], 'marque', 'marques')}: {parts}")
    else:
        out.say("nothing to reap: no marque is past its expiry plus the "
                f"{stats['skew_seconds']:g} s clock-skew allowance with every outcome settled "
                "and reported")
    if counts["pop_jtis"]:
        out.say(f"forgot {_plural(counts['pop_jtis'], 'proof id', 'proof ids')} past their "
                "replay window")
    if stats["expired_waiting_marques"]:
        waiting = _plural(stats["expired_waiting_marques"], "expired marque waits",
                          "expired marques wait")
        out.say(f"{waiting} for an unsettled or unreported outcome: run `marque reconcile`")
    out.say(_window(stats))
