"""MARQUE_CRASH_AT names a point and, optionally, which pass through it kills."""

from __future__ import annotations

from marque.crash import POINTS, _armed


def test_a_point_alone_arms_its_first_pass() -> None:
    """`after_claim` arms the first pass through after_claim."""
    assert _armed("after_claim") == ("after_claim", 1)


def test_a_pass_number_arms_that_pass() -> None:
    """`before_report_ack@3` arms the third pass."""
    assert _armed("before_report_ack@3") == ("before_report_ack", 3)


def test_anything_else_arms_nothing() -> None:
    """Unknown points, bad or non-positive counts and an empty value arm nothing."""
    for spec in ("", None, "no_such_point", "after_claim@x", "after_claim@0", "after_claim@-1"):
        assert _armed(spec) == (None, 0), spec


def test_there_are_thirteen_points() -> None:
    """Every step boundary of DESIGN §3 (the settle behind the answer included), the
    reporter, reconciliation and the stream."""
    assert len(POINTS) == 13
