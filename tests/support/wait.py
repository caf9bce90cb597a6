"""The one poll-until-true loop the tests use.

A deadline here only bounds how long a slow machine is waited for; it never
decides an outcome by itself: with ``what`` it fails the test naming what never
came, without it the last answer goes back to the caller, whose own assertion
then says what was missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str | None = None, *, timeout: float = 30.0,
               step: float = 0.05) -> T:
    """Call ``check`` every ``step`` seconds until it answers something true; that answer.

    When ``timeout`` seconds pass first: with ``what``, an :class:`AssertionError`
    "timed out waiting for WHAT"; without, the last (false) answer.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            if what is not None:
                raise AssertionError(f"timed out waiting for {what}")
            return found
        time.sleep(step)
