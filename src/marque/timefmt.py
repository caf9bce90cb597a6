"""How a time reads in anything an operator sees: ISO 8601, UTC, to the second.

Epoch numbers stay in JSON (scripts compute with them); messages and human
output use :func:`iso_time`, so a 3 a.m. reader never converts
``1796106426.867802`` in their head.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso_time(epoch: float | None) -> str:
    """An epoch time as ``2026-12-01T08:18:10Z``; ``-`` for None."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(value: float) -> str:
    """A duration in seconds without a spurious ``.0``: ``60 s``, ``1.5 s``."""
    return f"{value:g} s"
