"""The schedule on which a preparation that could not reach its Pilot is tried again."""

from __future__ import annotations

import pytest

from marque.errors import InvalidInput
from marque.harbour.preparation import DEFAULT_RETRY, RetrySchedule


def test_the_default_is_a_few_tries_over_about_two_minutes() -> None:
    """Four attempts in all, the retries 15 s, 30 s and 60 s after each failure."""
    assert DEFAULT_RETRY.delays == (15.0, 30.0, 60.0) and DEFAULT_RETRY.attempts == 4
    assert sum(DEFAULT_RETRY.delays) <= 120


def test_the_lease_outlasts_every_delay() -> None:
    """An attempt is never taken over before the longest delay (nor before a minute)."""
    assert RetrySchedule.of((1, 2)).lease == 60.0
    assert RetrySchedule.of((90,)).lease == 90.0
    assert RetrySchedule.of((), lease=5).attempts == 1


@pytest.mark.parametrize("delays", [(0,), (5, -1)])
def test_a_delay_that_is_not_positive_is_refused(delays: tuple[float, ...]) -> None:
    """A schedule that would retry at once, or in the past, is input_invalid."""
    with pytest.raises(InvalidInput):
        RetrySchedule.of(delays)
