"""The Pilot's background work: the reporter and the reconciler with backoff."""

from __future__ import annotations

import os
import threading
import time

from support.wait import wait_until

from marque.ledger import ClaimTicket
from marque.logbook.embedded import Logbook
from marque.outcome import Status
from marque.pilot import open_pilot
from marque.pilot.background import Reconciler, Reporter

from .conftest import Env, marque_id_of

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def _orphan(env: Env, token: str, nonce: str) -> str:
    """Claim ``nonce`` as a run that died long ago: in progress, lease already expired."""
    mid = marque_id_of(token)
    now = time.time()
    claim = env.pilot.ledger.claim(ClaimTicket(
        marque_id=mid, nonce=nonce, target="bank", executions=1, max_rows=1,
        attempts_per_nonce=3, expires_at=now + 600, owner_process="proc_gone", lease_seconds=0.0,
        now=now - 1,
    ))
    assert claim.fresh
    return mid


def test_reporter_delivers_outside_the_execution_path(env: Env) -> None:
    """With inline reporting off, execute returns before the logbook; the reporter catches up."""
    env.pilot.options.report_inline = False
    outcome = env.run(env.issue([DEBIT_1]), "n-1")
    assert outcome.status == "applied"
    assert "reported" not in [e["event"] for e in env.events]
    assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 1

    reporter = Reporter(env.pilot, idle_interval=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while env.pilot.ledger.stats(time.time())["unreported_outcomes"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
    finally:
        reporter.stop()

    assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
    assert env.pilot.logbook is not None
    [entry] = env.pilot.logbook.entries("execution.applied")
    assert entry["body"]["nonce"] == "n-1"


def test_reporter_gathers_longer_under_load_and_delivers_every_outcome(env: Env) -> None:
    """Outcomes that keep coming are reported in fewer, bigger rounds (the gather grows to
    its ceiling); every one is still delivered, and after a quiet spell the next outcome
    is reported after the short gather again."""
    env.pilot.options.report_inline = False
    token = env.issue(["UPDATE accounts SET balance = balance - 1 WHERE id = 1"],
                      executions=100)
    logbook = env.pilot.logbook
    assert logbook is not None
    rounds: list[int] = []
    append_all = logbook.append_all

    def counted(entries: list[tuple[str, str, dict[str, object]]]) -> int:
        rounds.append(len(entries))
        return append_all(entries)

    logbook.append_all = counted  # type: ignore[method-assign]
    # The outcomes are recorded before the reporter starts, and the news that "more keep
    # coming" is signalled by a thread of the test's own every millisecond: what the
    # reporter sees does not depend on how fast this machine executes (a loaded machine
    # made each execution outlast the gather, so nothing ever looked like load).
    for index in range(60):
        env.run(token, f"n-{index}")
    busy = threading.Event()
    busy.set()

    def news() -> None:
        while busy.is_set():
            env.pilot.report_wanted.set()
            time.sleep(0.001)

    reporter = Reporter(env.pilot, idle_interval=0.05, gather_seconds=0.02,
                        max_gather_seconds=0.16).start()
    signaller = threading.Thread(target=news, daemon=True)
    signaller.start()
    grown = 0.0
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                grown < 0.16 or env.pilot.ledger.stats(time.time())["unreported_outcomes"]):
            grown = max(grown, reporter.gather)
            time.sleep(0.005)
        assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
        busy.clear()
        signaller.join(10)
        time.sleep(0.3)  # quiet
        env.run(token, "n-quiet")
        env.pilot.report_wanted.set()
        deadline = time.monotonic() + 10
        while env.pilot.ledger.stats(time.time())["unreported_outcomes"] and (
                time.monotonic() < deadline):
            time.sleep(0.005)
        assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
        assert reporter.gather == 0.02
    finally:
        busy.clear()
        reporter.stop()
    assert grown == 0.16  # doubled up to its ceiling while news kept coming
    assert sum(rounds) == 61 and len(rounds) < 30
    assert len(logbook.entries("execution.applied")) == 61


def test_reconciler_backs_off_while_the_target_is_away_then_settles(env: Env) -> None:
    """An unreachable target: indeterminate, the wait doubles; once back, it settles."""
    token = env.issue([DEBIT_1])
    mid = _orphan(env, token, "n-1")
    hidden = env.bank_path.with_suffix(".away")
    os.rename(env.bank_path, hidden)
    reconciler = Reconciler(env.pilot, interval=1.0, max_backoff=4.0)
    try:
        delays = [reconciler.run_once() for _ in range(4)]
        record = env.pilot.ledger.outcome(mid, "n-1")
        assert record is not None and record.status is Status.INDETERMINATE
        assert delays == [2.0, 4.0, 4.0, 4.0]
    finally:
        os.rename(hidden, env.bank_path)

    assert reconciler.run_once() == 1.0
    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and record.status is Status.ABORTED_NOT_APPLIED
    assert env.balances()[1] == 100
    assert [c["to"] for c in reconciler.changes][-1] == "aborted_not_applied"


def test_reconciler_thread_settles_an_orphan(env: Env) -> None:
    """Started as a thread, the reconciler settles a dead run's claim without being asked."""
    mid = _orphan(env, env.issue([DEBIT_1]), "n-1")
    reconciler = Reconciler(env.pilot, interval=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            record = env.pilot.ledger.outcome(mid, "n-1")
            if record is not None and record.status.settled:
                break
            time.sleep(0.02)
    finally:
        reconciler.stop()
    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and record.status is Status.ABORTED_NOT_APPLIED


def test_open_pilot_background_reports_reconciles_and_closes_cleanly(env: Env) -> None:
    """open_pilot(background=True) reports and reconciles by itself, and closes cleanly."""
    token = env.issue([DEBIT_1], executions=3)
    env.pilot.close()
    before = {t.ident for t in threading.enumerate()}
    pilot = env.pilot = open_pilot(env.home, background=True)

    outcome = env.run(token, "n-1")
    assert outcome.status == "applied"
    assert "reported" not in [e["event"] for e in env.events]  # not on the caller's path
    assert pilot.logbook is not None
    logbook = pilot.logbook
    # Recorded (just behind the answer: settle_write_behind), delivered to the logbook,
    # then acknowledged in the ledger's outbox.
    wait_until(lambda: [e["body"]["nonce"] for e in logbook.entries("execution.applied")]
              == ["n-1"], "the reporter to deliver n-1", step=0.02)
    wait_until(lambda: pilot.ledger.stats(time.time())["unreported_outcomes"] == 0,
               "the outbox to acknowledge n-1", step=0.02)

    # A run that died after claiming, while this Pilot is up: settled with no one asking.
    mid = _orphan(env, token, "n-orphan")
    wait_until(lambda: (r := pilot.ledger.outcome(mid, "n-orphan")) is not None
              and r.status.settled, "the reconciler to settle the orphan", step=0.02)
    record = pilot.ledger.outcome(mid, "n-orphan")
    assert record is not None and record.status is Status.ABORTED_NOT_APPLIED
    assert env.balances()[1] == 90

    # Whether or not the reporter got to this one yet, close() leaves nothing unreported.
    last = env.run(token, "n-2")
    assert last.status == "applied"
    pilot.close()
    workers = [t for t in threading.enumerate()
               if t.ident not in before and t.name.startswith("marque-")]
    assert workers == []
    assert not (env.home / "ledger.sqlite3-wal").exists()  # the ledger was closed
    reopened = Logbook(str(env.home / "logbook.sqlite3"))
    try:
        nonces = [(e["kind"], e["body"]["nonce"]) for e in reopened.entries("execution.")
                  if e["kind"] != "execution.reconciliation"]
        assert sorted(nonces) == [("execution.aborted_not_applied", "n-orphan"),
                                  ("execution.applied", "n-1"), ("execution.applied", "n-2")]
        assert reopened.verify() is True
    finally:
        reopened.close()
    env.pilot = open_pilot(env.home)  # for the fixture's teardown
