"""An execution's done flag (pilot/stream.py ``Done``): what followers wait on."""

from __future__ import annotations

import threading
import time

from marque.pilot.stream import Done


def test_wait_times_out_until_set_then_every_waiter_goes_through() -> None:
    done = Done()
    began = time.monotonic()
    assert done.wait(0.05) is False
    assert time.monotonic() - began >= 0.04
    assert done.wait(-1) is False  # a negative timeout is no wait, as for an Event

    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(done.wait(5))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.05)
    assert woke == []  # all still waiting
    done.set()
    for waiter in waiters:
        waiter.join(5)
    assert woke == [True, True, True]
    assert done.wait() is True and done.wait(0) is True  # stays set
