"""Seed 000's guarantees on a real PostgreSQL target, under faults that actually happen.

Every fault is real: a TCP proxy that loses COMMIT or its answer, a Pilot
process killed with SIGKILL mid-statement, SERIALIZABLE conflicts between two
overlapping transactions, a statement timeout, ``pg_ctl stop -m immediate``
during execution, a stopped server during reconciliation. Outcomes are checked
against what the target itself holds (rows and ``marque.stamps``), the ledger,
and the logbook.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.pgcluster import PgCluster, create_database
from support.pgproxy import PgProxy, PgProxyFactory
from support.wait import wait_until

from marque.outcome import Status
from marque.pilot.setup import add_target
from marque.token import Guard

from .pgworld import (
    LATTICE,
    TARGET,
    StreamingCli,
    World,
    backends_running,
    backends_waiting_on_lock,
    build_world,
    marque_id_of,
    one_json,
    run_cli,
)

START = {1: 100, 2: 100, 3: 100}
SLOW_UPDATE = (
    "UPDATE accounts SET balance = balance - 10 + 0 * (SELECT count(*) FROM pg_sleep(30)) "
    "WHERE id = 1"
)
PLAIN_UPDATE = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def stamp_view(stamps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(s["nonce"], s["kind"], s["attempt"], s["rows_affected"]) for s in stamps]


def reconciliations(world: World, marque_id: str) -> list[dict[str, Any]]:
    return [e["body"] for e in world.pilot.logbook.entries("execution.reconciliation")
            if e["body"]["marque_id"] == marque_id]


def assert_never_failed(world: World, marque_id: str, nonce: str) -> None:
    """No observation, report or logbook entry of this nonce says failed/refused."""
    ledger = world.pilot.ledger
    for obs in ledger.observations(marque_id, nonce):
        assert obs["status"] in LATTICE, obs
    for attempt in ledger.attempts(marque_id, nonce):
        assert attempt.status.value in LATTICE
    kinds = {e["kind"] for e in world.pilot.logbook.entries("execution.")
             if e["body"].get("marque_id") == marque_id}
    assert kinds <= {"execution.reconciliation", "execution.applied",
                     "execution.aborted_not_applied", "execution.indeterminate"}, kinds


# -- lost COMMIT response (a real TCP proxy) ----------------------------------------------


@pytest.fixture
def proxied(world: World, pg_proxy: PgProxyFactory) -> Iterator[tuple[World, PgProxy]]:
    """``world`` with its Pilot reaching the target through a COMMIT-losing proxy."""
    proxy, proxied_dsn = pg_proxy(world.target_dsn)
    add_target(world.home, TARGET, proxied_dsn)
    try:
        yield world, proxy
    finally:
        world.close_pilot()


def test_lost_commit_reply_is_reconciled_to_applied_once(
    proxied: tuple[World, PgProxy],
) -> None:
    """A COMMIT whose reply is lost is first indeterminate, then reconciled to applied once."""
    world, proxy = proxied
    token = world.issue(PLAIN_UPDATE)
    mid = marque_id_of(token)
    proxy.arm("drop_after_commit")

    outcome = world.execute(token, "lost-reply")

    assert proxy.fired.is_set()
    assert (outcome.status, outcome.attempt, outcome.rows_affected, outcome.replayed) == (
        "applied", 1, 1, False)
    assert outcome.error is None
    observations = world.pilot.ledger.observations(mid, "lost-reply")
    assert [(o["status"], o["cause"]) for o in observations] == [
        ("indeterminate", "execution"), ("applied", "reconciliation")]
    assert observations[0]["detail"]["error"]["code"] == "commit_unknown"
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world.stamps(mid)) == [("lost-reply", "applied", 1, 1)]

    [entry] = reconciliations(world, mid)
    assert (entry["cause"], entry["status"]) == ("commit_unknown", "applied")
    fence = next(e for e in world.events if e["event"] == "fence_checked")
    assert entry["corroboration"] == {"txid": fence["txid"], "txid_status": "committed"}

    replay = world.execute(token, "lost-reply")
    assert (replay.status, replay.attempt, replay.replayed) == ("applied", 1, True)
    assert world.balances() == {**START, 1: 90}
    assert len(world.stamps(mid)) == 1
    assert len(world.pilot.ledger.attempts(mid, "lost-reply")) == 1
    assert world.pilot.ledger.budget(mid)["executions_left"] == 0
    assert_never_failed(world, mid, "lost-reply")


def test_commit_lost_before_server_is_reconciled_to_not_applied(
    proxied: tuple[World, PgProxy],
) -> None:
    """A COMMIT that never reached the server is reconciled to aborted_not_applied by tombstone."""
    world, proxy = proxied
    token = world.issue(PLAIN_UPDATE)
    mid = marque_id_of(token)
    proxy.arm("drop_before_commit")

    outcome = world.execute(token, "lost-commit")

    assert proxy.fired.is_set()
    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None and outcome.error["code"] == "commit_unknown"
    observations = world.pilot.ledger.observations(mid, "lost-commit")
    assert [(o["status"], o["cause"]) for o in observations] == [
        ("indeterminate", "execution"), ("aborted_not_applied", "reconciliation")]
    assert world.balances() == START
    assert stamp_view(world.stamps(mid)) == [("lost-commit", "tombstone", 1, None)]

    [entry] = reconciliations(world, mid)
    assert (entry["cause"], entry["status"]) == ("commit_unknown", "aborted_not_applied")
    fence = next(e for e in world.events if e["event"] == "fence_checked")
    assert entry["corroboration"] == {"txid": fence["txid"], "txid_status": "aborted"}
    assert_never_failed(world, mid, "lost-commit")

    # The nonce may run again as attempt 2, with no second budget decrement
    # (executions=1: a second decrement would be budget_exhausted).
    again = world.execute(token, "lost-commit")
    assert (again.status, again.attempt, again.replayed) == ("applied", 2, False)
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world.stamps(mid)) == [("lost-commit", "applied", 2, 1)]
    assert world.pilot.ledger.budget(mid)["executions_left"] == 0


# -- kill -9 of the Pilot process mid-statement (the real CLI) ----------------------------


def test_sigkill_mid_statement_keeps_nonce_claimed_and_reconciles_not_applied(
    sqlite_world: World,
) -> None:
    """A Pilot SIGKILLed mid-statement leaves the nonce claimed; reconcile proves not applied."""
    world = sqlite_world
    # Let the server notice a vanished client while a query runs (PostgreSQL >= 14);
    # without it the orphan only rolls back when its pg_sleep ends.
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        dbname = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(f'ALTER DATABASE "{dbname}" SET client_connection_check_interval = 200')
    token = world.issue(SLOW_UPDATE, statement_timeout_ms=60_000)
    mid = marque_id_of(token)
    home, marque_file, key = world.home, world.marque_file(token), world.holder_file()

    cli = StreamingCli("exec", "--home", home, "--marque", marque_file, "--key", key,
                       "--nonce", "kill-me", "--json")
    try:
        cli.wait_for("statement_started")
        wait_until(lambda: backends_running(world.target_dsn, "%pg_sleep(30)%") == 1,
                   "the slow statement to run on the server")
        os.kill(cli.proc.pid, signal.SIGKILL)
        assert cli.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
            cli.proc.wait()
    kinds = cli.drain()
    assert "statement_started" in kinds
    assert "committed" not in kinds and "outcome_recorded" not in kinds

    # On restart the nonce is still claimed: in progress, exit status 6.
    shown = run_cli("outcome", "--home", home, mid, "kill-me", "--json")
    assert shown.returncode == 6, shown.stderr
    assert (one_json(shown.stdout)["status"], one_json(shown.stdout)["attempt"]) == (
        "in_progress", 1)

    # Reconcile until settled (bounded): the tombstone may wait behind the orphan backend.
    changed: list[dict[str, Any]] = []
    for _ in range(20):
        result = run_cli("reconcile", "--home", home, "--json")
        assert result.returncode == 0, result.stderr
        body = one_json(result.stdout)
        changed += body["changed"]
        if not body["still_unsettled"]:
            break
        time.sleep(0.5)
    assert body["still_unsettled"] == []
    assert changed[0]["from"] == "in_progress"
    assert changed[-1]["to"] == "aborted_not_applied"
    assert all(c["to"] != "applied" for c in changed)

    final = run_cli("outcome", "--home", home, mid, "kill-me", "--json")
    assert final.returncode == 4
    assert (one_json(final.stdout)["status"], one_json(final.stdout)["attempt"]) == (
        "aborted_not_applied", 1)
    assert world.balances() == START
    assert stamp_view(world.stamps(mid)) == [("kill-me", "tombstone", 1, None)]
    assert backends_running(world.target_dsn, "%pg_sleep(30)%") == 0

    pilot = world.open_pilot(recover=False)
    assert len(pilot.ledger.attempts(mid, "kill-me")) == 1  # nothing ran twice
    assert pilot.ledger.budget(mid)["executions_left"] == 0
    observations = pilot.ledger.observations(mid, "kill-me")
    assert observations[0]["status"] == "indeterminate"
    # Killed seconds ago, lease still valid: a dead owner, not an expired lease.
    assert observations[0]["detail"]["error"]["code"] == "owner_gone"
    assert observations[-1]["status"] == "aborted_not_applied"
    assert observations[-1]["cause"] == "reconciliation"
    assert all(o["status"] != "applied" for o in observations)


# -- serialization failures (SERIALIZABLE, two overlapping marques) -----------------------


def test_serializable_concurrent_update_aborts_then_same_nonce_applies(world: World) -> None:
    """Under SERIALIZABLE a marque blocked behind a conflicting commit gets 40001, then retries."""
    token_a = world.issue(PLAIN_UPDATE, isolation="serializable", executions=2)
    token_b = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 1",
                          isolation="serializable")
    mid_a, mid_b = marque_id_of(token_a), marque_id_of(token_b)
    pilot = world.pilot
    b_holds_lock = threading.Event()
    b_result: dict[str, Any] = {}

    def b_events(event: dict[str, Any]) -> None:
        if event["event"] == "asserted":
            # B updated row 1 and is about to COMMIT: hold it there until A is
            # really waiting on B's row lock, then let B commit.
            b_holds_lock.set()
            wait_until(
                lambda: backends_waiting_on_lock(world.target_dsn, "%balance - 10 %") == 1,
                "marque A to block on marque B's row lock",
            )

    def run_b() -> None:
        try:
            b_result["outcome"] = world.execute(token_b, "b-1", on_event=b_events)
        except BaseException as exc:  # reported by the main thread
            b_result["error"] = exc

    thread = threading.Thread(target=run_b)
    thread.start()
    assert b_holds_lock.wait(30)
    outcome_a = world.execute(token_a, "a-1")
    thread.join(60)
    assert "error" not in b_result, b_result

    assert b_result["outcome"].status == "applied"
    assert (outcome_a.status, outcome_a.attempt) == ("aborted_not_applied", 1)
    assert outcome_a.error is not None
    assert (outcome_a.error["code"], outcome_a.error["sqlstate"]) == (
        "serialization_failure", "40001")
    assert world.balances() == {**START, 1: 99}
    assert world.stamps(mid_a) == []

    retry = world.execute(token_a, "a-1")
    assert (retry.status, retry.attempt, retry.replayed) == ("applied", 2, False)
    assert world.balances() == {**START, 1: 89}
    assert stamp_view(world.stamps(mid_a)) == [("a-1", "applied", 2, 1)]
    assert stamp_view(world.stamps(mid_b)) == [("b-1", "applied", 1, 1)]
    ledger = pilot.ledger
    assert [a.status for a in ledger.attempts(mid_a, "a-1")] == [
        Status.ABORTED_NOT_APPLIED, Status.APPLIED]
    assert ledger.budget(mid_a)["executions_left"] == 1  # decremented once, for 2 attempts


def test_serializable_write_skew_aborts_one_marque_then_same_nonce_applies(
    sqlite_world: World,
) -> None:
    """Write skew between two SERIALIZABLE marques aborts one with 40001; its retry applies."""
    world = sqlite_world
    check = "AND (SELECT sum(balance) FROM accounts) >= 200"
    # A guard checked before the statements keeps A's stamp in a message of its
    # own, so B can slip in between A's snapshot and A's statement.
    token_a = world.issue(f"UPDATE accounts SET balance = balance - 10 WHERE id = 1 {check}",
                          isolation="serializable", guards=(Guard("SELECT true"),))
    token_b = world.issue(f"UPDATE accounts SET balance = balance - 10 WHERE id = 2 {check}",
                          isolation="serializable")
    mid_a = marque_id_of(token_a)
    b_outcomes = []

    def a_events(event: dict[str, Any]) -> None:
        # A's snapshot is taken and its stamp inserted; before A reads or writes
        # accounts, B reads the same rows, writes the other one and commits.
        if event["event"] == "statement_started" and not b_outcomes:
            b_outcomes.append(world.execute(token_b, "b-1"))

    outcome_a = world.execute(token_a, "a-1", on_event=a_events)

    assert [o.status for o in b_outcomes] == ["applied"]
    assert (outcome_a.status, outcome_a.attempt) == ("aborted_not_applied", 1)
    assert outcome_a.error is not None
    assert (outcome_a.error["code"], outcome_a.error["sqlstate"]) == (
        "serialization_failure", "40001")
    assert world.balances() == {**START, 2: 90}
    assert world.stamps(mid_a) == []

    retry = world.execute(token_a, "a-1")
    assert (retry.status, retry.attempt, retry.rows_affected) == ("applied", 2, 1)
    assert world.balances() == {1: 90, 2: 90, 3: 100}
    assert world.pilot.ledger.budget(mid_a)["executions_left"] == 0


# -- statement timeout and isolation levels ----------------------------------------------


def test_statement_timeout_is_aborted_not_applied_and_target_unchanged(
    sqlite_world: World,
) -> None:
    """A statement over the marque's statement_timeout is aborted_not_applied (57014)."""
    world = sqlite_world
    token = world.issue(
        "UPDATE accounts SET balance = balance - 10 + 0 * (SELECT count(*) FROM pg_sleep(5)) "
        "WHERE id = 1",
        statement_timeout_ms=200,
    )
    mid = marque_id_of(token)

    outcome = world.execute(token, "slow")

    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None
    assert (outcome.error["code"], outcome.error["sqlstate"]) == ("statement_timeout", "57014")
    assert world.balances() == START
    assert world.stamps(mid) == []
    assert backends_running(world.target_dsn, "%pg_sleep(5)%") == 0


@pytest.mark.parametrize(
    ("isolation", "shown"),
    [("read_committed", "read committed"), ("repeatable_read", "repeatable read"),
     ("serializable", "serializable")],
)
def test_marque_runs_at_its_isolation_level(sqlite_world: World, isolation: str,
                                            shown: str) -> None:
    """A marque's transaction runs at its isolation level; the next default one is back at
    READ COMMITTED."""
    world = sqlite_world
    read = "SELECT current_setting('transaction_isolation')"
    token = world.issue(read, isolation=isolation)
    default = world.issue(read)

    outcome = world.execute(token, "iso")
    after = world.execute(default, "iso")

    assert outcome.status == "applied"
    assert outcome.result == {"columns": ["current_setting"], "rows": [[shown]]}
    assert outcome.rows_affected == 1
    assert after.result == {"columns": ["current_setting"], "rows": [["read committed"]]}


# -- the server crashes, stops, restarts ---------------------------------------------------


def test_server_crash_mid_execution_settles_consistent_with_target(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """A server crash (stop -m immediate) mid-statement is aborted_not_applied, no stamp."""
    world = cluster_world
    token = world.issue(SLOW_UPDATE, statement_timeout_ms=60_000)
    mid = marque_id_of(token)
    pilot = world.pilot
    started = threading.Event()
    box: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        world.events.append(event)
        if event["event"] == "statement_started":
            started.set()

    def run() -> None:
        try:
            box["outcome"] = world.execute(token, "crash", on_event=on_event, pilot=pilot)
        except BaseException as exc:  # reported by the main thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30)
    wait_until(lambda: backends_running(world.target_dsn, "%pg_sleep(30)%") == 1,
               "the slow statement to run on the server")
    pg_cluster.crash()
    thread.join(90)
    assert not thread.is_alive()
    assert "error" not in box, box
    pg_cluster.start()

    # The statement was still running when the server died: COMMIT was never sent, so
    # the attempt is provably not applied — the one outcome this crash can have.
    outcome = box["outcome"]
    assert (outcome.status, outcome.attempt, outcome.rows_affected) == (
        "aborted_not_applied", 1, None)
    assert outcome.error is not None
    assert "committed" not in [e["event"] for e in world.events]

    assert pilot.recover() == []  # nothing in progress or indeterminate is left
    record = pilot.ledger.outcome(mid, "crash")
    assert record is not None
    assert (record.status, record.attempt) == (Status.ABORTED_NOT_APPLIED, 1)
    assert world.balances() == START
    assert world.stamps(mid) == []  # the stamp rolled back with the transaction
    assert_never_failed(world, mid, "crash")


def test_a_retry_after_a_crash_inside_commit_is_answered_by_evidence_at_once(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """The server crashed inside COMMIT (a deferred trigger was sleeping), so the attempt is
    indeterminate; once it is back, a retry of the same nonce reconciles there and then
    (tombstone: aborted_not_applied), and the next retry applies as attempt 2 — no waiting
    for a background round or an operator (soak row 3's finding)."""
    world = cluster_world
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pause (on_commit boolean)")
        conn.execute("INSERT INTO pause VALUES (true)")
        conn.execute("CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ "
                     "BEGIN IF EXISTS (SELECT 1 FROM pause) THEN PERFORM pg_sleep(30); END IF; "
                     "RETURN NULL; END $$")
        conn.execute("CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON accounts "
                     "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()")
    token = world.issue(PLAIN_UPDATE)
    mid = marque_id_of(token)
    pilot = world.pilot
    box: dict[str, Any] = {}

    def run() -> None:
        box["outcome"] = world.execute(token, "n-1", pilot=pilot)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: backends_running(world.target_dsn, "%COMMIT%") == 1,
               "COMMIT to run the sleeping deferred trigger")
    pg_cluster.crash()
    thread.join(90)
    assert box["outcome"].status == "indeterminate"
    pg_cluster.start()
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM pause")

    retried = world.execute(token, "n-1", pilot=pilot)

    assert (retried.status, retried.attempt, retried.replayed) == (
        "aborted_not_applied", 1, True)
    assert [(o["status"], o["cause"]) for o in pilot.ledger.observations(mid, "n-1")] == [
        ("indeterminate", "execution"), ("aborted_not_applied", "reconciliation")]
    assert reconciliations(world, mid)[-1]["cause"] == "retry"
    assert stamp_view(world.stamps(mid)) == [("n-1", "tombstone", 1, None)]
    again = world.execute(token, "n-1", pilot=pilot)
    assert (again.status, again.attempt) == ("applied", 2)
    assert world.balances() == {**START, 1: 90}


def test_unreachable_target_keeps_attempt_indeterminate_until_it_returns(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """Reconciling against a stopped target stays indeterminate; after restart it settles."""
    world = cluster_world
    token = world.issue(PLAIN_UPDATE)
    mid = marque_id_of(token)
    home = world.home
    crashed = run_cli("exec", "--home", home, "--marque", world.marque_file(token),
                      "--key", world.holder_file(), "--nonce", "orphan", "--json",
                      env={"MARQUE_CRASH_AT": "after_claim"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    pg_cluster.stop("fast")
    pilot = world.open_pilot(recover=False)
    changes = pilot.recover()  # the target cannot be asked: nothing is known
    record = pilot.ledger.outcome(mid, "orphan")
    assert record is not None and record.status is Status.INDETERMINATE
    assert record.error is not None and record.error["code"] == "owner_gone"  # killed, lease valid
    assert [(c["from"], c["to"]) for c in changes] == [("in_progress", "indeterminate")]
    entries = reconciliations(world, mid)
    assert entries and all(e["status"] == "indeterminate" for e in entries)
    assert [o["status"] for o in pilot.ledger.observations(mid, "orphan")] == ["indeterminate"]
    world.close_pilot()

    pg_cluster.start()
    result = run_cli("reconcile", "--home", home, "--json")
    assert result.returncode == 0, result.stderr
    body = one_json(result.stdout)
    assert [(c["nonce"], c["from"], c["to"]) for c in body["changed"]] == [
        ("orphan", "indeterminate", "aborted_not_applied")]
    assert body["still_unsettled"] == []
    shown = run_cli("outcome", "--home", home, mid, "orphan", "--json")
    assert shown.returncode == 4
    assert one_json(shown.stdout)["status"] == "aborted_not_applied"
    assert world.balances() == START
    assert stamp_view(world.stamps(mid)) == [("orphan", "tombstone", 1, None)]
    assert_never_failed(world, mid, "orphan")


def test_first_execution_after_target_restart_applies(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """After the target server restarts, the next execution applies (no stale pooled link)."""
    world = cluster_world
    first = world.execute(world.issue(PLAIN_UPDATE), "before")
    assert first.status == "applied"
    pg_cluster.stop("fast")
    pg_cluster.start()

    token = world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 2")
    after = world.execute(token, "after")

    assert (after.status, after.attempt, after.error) == ("applied", 1, None)
    assert world.balances() == {1: 90, 2: 99, 3: 100}


def test_first_execution_after_ledger_restart_applies(
    tmp_path: Path, pg_cluster: PgCluster, pg_dsn: str,
) -> None:
    """After the PostgreSQL ledger's server restarts, the next execution applies."""
    _, ledger_dsn = create_database(pg_cluster.dsn())
    world = build_world(tmp_path, pg_dsn, ledger="postgres", ledger_dsn=ledger_dsn)
    try:
        first = world.execute(world.issue(PLAIN_UPDATE), "before")
        assert first.status == "applied"
        pg_cluster.stop("fast")
        pg_cluster.start()

        after = world.execute(world.issue("UPDATE accounts SET balance = balance - 1 "
                                          "WHERE id = 2"), "after")

        assert (after.status, after.attempt) == ("applied", 1)
        assert world.balances() == {1: 90, 2: 99, 3: 100}
    finally:
        world.close()


def test_execution_after_every_pooled_connection_died_applies(
    cluster_world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash kills every idle pooled connection, not one: the first message is resent
    (COMMIT was never sent) on a connection the pool has checked, not on the next dead one."""
    world = cluster_world
    # Never ping on checkout, as for a connection back less than the idle-check time ago
    # (the soak met this: a crash, a restart and the next call within half a second).
    monkeypatch.setattr("marque.storage.pgpool.IDLE_CHECK_SECONDS", 3600.0)
    slow = ("UPDATE accounts SET balance = balance - 1 + 0 * (SELECT count(*) FROM "
            "pg_sleep(0.5)) WHERE id = 3")
    pilot = world.pilot  # opened once, before the threads share it
    tokens = [world.issue(slow) for _ in range(3)]
    outcomes: list[Any] = []
    workers = [threading.Thread(target=lambda t=t, i=i: outcomes.append(
        world.execute(t, f"grow-{i}", pilot=pilot))) for i, t in enumerate(tokens)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [o.status for o in outcomes] == ["applied"] * 3  # three connections now idle
    with psycopg.connect(world.target_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend') AS k").fetchone()
    assert killed is not None and killed[0] >= 3

    after = world.execute(world.issue("UPDATE accounts SET balance = balance - 1 WHERE id = 2"),
                          "after")

    assert (after.status, after.attempt, after.error) == ("applied", 1, None)
    assert world.balances() == {1: 100, 2: 99, 3: 97}
