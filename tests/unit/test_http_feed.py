"""The Pilot service's feed from an execution's worker thread to the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from marque.pilot.http import _Feed


def test_items_put_while_the_loop_is_busy_arrive_in_order_after_one_wake() -> None:
    """Everything a worker says while the loop is busy comes in one take, in order, for one
    wake of the loop; what it says later still arrives."""

    async def scenario() -> tuple[list[Any], int, list[Any]]:
        loop = asyncio.get_running_loop()
        wakes = 0
        schedule = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return schedule(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        feed = _Feed(loop)
        worker = threading.Thread(target=lambda: [feed.put("event", n) for n in range(100)])
        worker.start()
        worker.join()  # the loop did not run meanwhile: all 100 wait for one wake
        first = await feed.take()
        woken = wakes
        later = threading.Thread(target=lambda: feed.put("outcome", "done"))
        later.start()
        second = await feed.take()
        later.join()
        return first, woken, second

    # In a thread of its own: a test before this one may have left this thread inside a
    # running event loop (Playwright's sync API does), where asyncio.run refuses to start.
    ran: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: ran.update(result=asyncio.run(scenario())))
    runner.start()
    runner.join()
    first, woken, second = ran["result"]
    assert first == [("event", n) for n in range(100)]
    assert woken == 1
    assert second == [("outcome", "done")]
