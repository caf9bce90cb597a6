"""PendingJtis: a held jti is refused at once and written by a background thread, never dropped."""

from __future__ import annotations

import threading

from support.wait import wait_until

from marque.ledger.jtis import PendingJtis


def test_a_held_jti_is_refused_until_written_and_then_released() -> None:
    written: list[tuple[str, float]] = []
    pending = PendingJtis(written.extend)
    assert pending.add("a", 1.0) is True
    assert pending.add("a", 1.0) is False
    assert wait_until(lambda: written == [("a", 1.0)], timeout=10.0, step=0.005)
    assert wait_until(lambda: "a" not in pending, timeout=10.0, step=0.005)
    pending.close()


def test_a_failed_write_is_retried_and_the_jti_stays_held_meanwhile() -> None:
    attempts: list[list[tuple[str, float]]] = []
    failing = threading.Event()
    failing.set()

    def write(batch: list[tuple[str, float]]) -> None:
        attempts.append(list(batch))
        if failing.is_set():
            raise OSError("disk full")

    pending = PendingJtis(write)
    pending.add("b", 2.0)
    assert wait_until(lambda: len(attempts) >= 2, timeout=10.0, step=0.005)
    assert "b" in pending  # still refused while the ledger refuses the write
    failing.clear()
    assert wait_until(lambda: "b" not in pending, timeout=10.0, step=0.005)
    assert attempts[-1] == [("b", 2.0)]
    pending.close()


def test_close_writes_what_is_still_held() -> None:
    written: list[tuple[str, float]] = []
    gate = threading.Event()

    def slow_write(batch: list[tuple[str, float]]) -> None:
        gate.wait()
        written.extend(batch)

    pending = PendingJtis(slow_write)
    for index in range(20):
        pending.add(f"j{index}", 3.0)
    gate.set()
    pending.close()
    assert sorted(jti for jti, _ in written) == sorted(f"j{index}" for index in range(20))
    assert not any(f"j{index}" in pending for index in range(20))
