"""Reporting: a destination that refuses a round is logged and counted, never dropped."""

from __future__ import annotations

import logging
import time

import pytest

from marque.errors import HarbourUnavailable
from marque.ledger import OutboxEntry

from .conftest import Env

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


class _RefusingSink:
    """A report sink that refuses with each of ``refusals`` in turn, then takes reports."""

    def __init__(self, refusals: list[Exception]) -> None:
        self.refusals = refusals
        self.taken: list[OutboxEntry] = []

    def deliver(self, entries: list[OutboxEntry]) -> None:
        if self.refusals:
            raise self.refusals.pop(0)
        self.taken.extend(entries)


def test_a_refused_report_round_is_logged_counted_and_delivered_later(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.pilot.options.report_inline = False
    sink = _RefusingSink([HarbourUnavailable("the Harbourmaster is away"),
                          RuntimeError("a fault in the sink")])
    env.pilot.report_sinks.append(sink)
    assert env.run(env.issue([DEBIT_1]), "n-1").status == "applied"

    with caplog.at_level(logging.WARNING, logger="marque.pilot.reporting"):
        assert env.pilot.report() is False
        assert env.pilot.report() is False
    refused = [r for r in caplog.records if r.name == "marque.pilot.reporting"]
    assert len(refused) == 2  # every refused round, not only the first of a streak
    assert "harbour_unavailable" in refused[0].getMessage()
    assert refused[0].exc_info is None  # a documented refusal needs no traceback
    assert "a fault in the sink" in refused[1].getMessage()
    assert refused[1].exc_info is not None  # anything else says where it came from
    assert env.pilot.reporting.failed_rounds == 2
    assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 1

    assert env.pilot.report() is True  # the outcome was kept, and goes now
    assert [entry.nonce for entry in sink.taken] == ["n-1"]
    assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
