"""The Pilot's background work: the reporter and the reconciler with backoff."""

from __future__ import annotations

import os
import time

from marque.ledger import ClaimTicket
from marque.outcome import Status
from marque.pilot.background import Reconciler, Reporter

from .conftest import Env, marque_id_of

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def _orphan(env: Env, token: str, nonce: str) -> str:
    """Claim ``nonce`` as a run that died long ago: in progress, lease already expired."""
    mid = marque_id_of(token)
    now = time.time()
    claim = env.pilot.ledger.claim(ClaimTicket(
        marque_id=mid, nonce=nonce, target="bank", executions=1, max_rows=1,
        attempts_per_nonce=3, expires_at=now + 600, owner_run="run_gone", lease_seconds=0.0,
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
