"""An applied write answered before its settle (``settle_write_behind``), and the window.

The window is held open for real: another connection takes the ledger file's
write lock the moment the target has committed (``BEGIN IMMEDIATE`` from the
caller's own event sink), so the settler cannot record the outcome until the
test lets go. Everything the Pilot answers meanwhile is checked against the
target's rows and stamps, and the ledger as SQLite holds it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from support.wait import wait_until

from marque.errors import PopReplayed
from marque.outcome import Status
from marque.pilot import open_pilot

from .conftest import Env, marque_id_of

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
READ_1 = "SELECT balance FROM accounts WHERE id = 1"


class LedgerLock:
    """The ledger file's write lock, taken by another connection when the target commits."""

    def __init__(self, env: Env) -> None:
        self.path = env.home / "ledger.sqlite3"
        self.conn: sqlite3.Connection | None = None
        self.timer: threading.Timer | None = None

    def on_event(self, event: dict[str, Any]) -> None:
        if event["event"] == "committed" and self.conn is None:
            self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30,
                                        check_same_thread=False)
            self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        assert self.conn is not None, "the target never committed"
        self.conn.execute("ROLLBACK")
        self.conn.close()

    def release_after(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self.release)
        timer.start()
        return timer

    def held_for(self, seconds: float) -> Callable[[dict[str, Any]], None]:
        """An event sink that takes the lock at the target's commit and lets go after
        ``seconds``, from another thread (``self.timer``)."""
        def sink(event: dict[str, Any]) -> None:
            self.on_event(event)
            if event["event"] == "committed":
                self.timer = self.release_after(seconds)
        return sink


@contextmanager
def background(env: Env, **settings: Any) -> Iterator[None]:
    """The env's Pilot reopened as a long-running one, with ``settings`` in pilot.json."""
    env.pilot.close()
    if settings:
        config_path = env.home / "pilot.json"
        config = json.loads(config_path.read_text())
        config.setdefault("settings", {}).update(settings)
        config_path.write_text(json.dumps(config))
    env.pilot = open_pilot(env.home, background=True)
    yield


def test_an_applied_write_is_answered_then_settled_and_a_replay_meanwhile_reads_it(
        env: Env) -> None:
    """The answer comes while the ledger still says in_progress; a replay in that window
    is answered applied from what this process holds, never run again; then it settles."""
    token = env.issue([DEBIT_1], executions=2)
    mid = marque_id_of(token)
    with background(env):
        lock = LedgerLock(env)
        first = env.pilot.execute(token, env.proof(token, "n-1"), "n-1", on_event=lock.on_event)
        assert (first.status, first.rows_affected, first.replayed) == ("applied", 1, False)
        try:
            held = env.pilot.ledger.outcome(mid, "n-1")
            assert held is not None and held.status is Status.IN_PROGRESS  # the window is real
            proof = env.proof(token, "n-1")
            replay = env.pilot.execute(token, proof, "n-1")
            assert (replay.status, replay.rows_affected, replay.replayed) == ("applied", 1, True)
            with pytest.raises(PopReplayed):
                env.pilot.execute(token, proof, "n-1")  # the replay's proof, used twice
            assert env.pilot.outcome(mid, "n-1").status == "applied"
            assert env.balances()[1] == 90  # once
        finally:
            lock.release()
        wait_until(lambda: (r := env.pilot.ledger.outcome(mid, "n-1")) is not None
                  and r.status is Status.APPLIED, "the settle to land", step=0.02)
        record = env.pilot.ledger.outcome(mid, "n-1")
        assert record is not None and record.rows_affected == 1
        kinds = [e["event"] for e in env.pilot.ledger.events(mid, "n-1")]
        assert kinds[-2:] == ["settle_behind", "outcome_recorded"]
        assert env.pilot.ledger.budget(mid)["executions_left"] == 1  # one execution spent
        assert [s["nonce"] for s in env.stamps()] == ["n-1"]
        assert env.pilot.logbook is not None
        logbook = env.pilot.logbook
        wait_until(lambda: [e["body"]["nonce"] for e in logbook.entries("execution.applied")]
                  == ["n-1"], "the report of n-1", step=0.02)


def test_switched_off_the_outcome_is_recorded_before_the_answer(env: Env) -> None:
    """settle_write_behind: false — the answer waits for the ledger's write."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    with background(env, settle_write_behind=False):
        lock = LedgerLock(env)
        outcome = env.pilot.execute(token, env.proof(token, "n-1"), "n-1",
                                    on_event=lock.held_for(0.3))
        assert outcome.status == "applied"
        record = env.pilot.ledger.outcome(mid, "n-1")
        assert record is not None and record.status is Status.APPLIED
        assert lock.timer is not None
        lock.timer.join()


def test_a_read_settles_before_its_answer(env: Env) -> None:
    """A read's result exists nowhere else: it is recorded before the answer, always."""
    token = env.issue([READ_1])
    mid = marque_id_of(token)
    with background(env):
        lock = LedgerLock(env)
        outcome = env.pilot.execute(token, env.proof(token, "n-1"), "n-1",
                                    on_event=lock.held_for(0.3))
        assert outcome.status == "applied" and outcome.result is not None
        record = env.pilot.ledger.outcome(mid, "n-1")
        assert record is not None and record.status is Status.APPLIED
        assert record.result == outcome.result
        assert lock.timer is not None
        lock.timer.join()


def test_closing_records_what_is_still_held(env: Env) -> None:
    """close() while the ledger is locked by another process: once it can write, every
    answered outcome is in the ledger — closing never drops one."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    with background(env):
        lock = LedgerLock(env)
        env.pilot.execute(token, env.proof(token, "n-1"), "n-1", on_event=lock.on_event)
        timer = lock.release_after(0.3)
        env.pilot.close()
        timer.join()
    env.pilot = open_pilot(env.home)
    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and (record.status, record.rows_affected) == (Status.APPLIED, 1)
    assert "settle_behind" in [e["event"] for e in env.pilot.ledger.events(mid, "n-1")]
