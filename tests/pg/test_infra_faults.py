"""Honest answers when PostgreSQL is away (DESIGN §9), with real faults.

A ledger or target server is stopped for real (``pg_ctl stop -m immediate`` of
a private cluster) at the moment that matters: before the claim, or right
after the target's COMMIT. What the Pilot says is checked against what the
target holds (rows, ``marque.stamps``) and what the ledger holds once its
server is back. Also here: an error received at COMMIT (a deferred
constraint), and the stamp table's versioned migrations on PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.harbour import free_port
from support.pgcluster import PgCluster, create_database
from support.pgproxy import PgProxyFactory

from marque.errors import LedgerUnavailable
from marque.ledger import create_ledger, open_ledger
from marque.target.stamps import POSTGRES_MIGRATIONS, VERSION

from .pgworld import World, build_world, marque_id_of, one_json, run_cli

START = {1: 100, 2: 100, 3: 100}
DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
#: The ledger's DSN carries this password (the test cluster trusts every login, so it is
#: never checked): no message, event or output may ever show it.
PASSWORD = "s3cret-never-shown"
#: Far below the 30 s (ledger) and 10 s (target) pool waits a down server used to cost;
#: generous for a loaded machine (the CLI's own start-up is part of it).
FAST_SECONDS = 6.0


def stamp_view(world: World, marque_id: str) -> list[tuple[Any, ...]]:
    return [(s["nonce"], s["kind"], s["attempt"], s["rows_affected"])
            for s in world.stamps(marque_id)]


def exec_cli(world: World, token: str, nonce: str) -> tuple[Any, float]:
    """``marque exec --json`` in a fresh process; (completed process, seconds it took)."""
    started = time.monotonic()
    res = run_cli("exec", "--home", world.home, "--marque", world.marque_file(token),
                  "--key", world.holder_file(), "--nonce", nonce, "--json")
    return res, time.monotonic() - started


@pytest.fixture
def ledger_world(tmp_path: Path, pg_dsn: str,
                 pg_cluster: PgCluster) -> Iterator[tuple[World, PgCluster]]:
    """A world whose ledger is on a private server the test stops (the target is not)."""
    _, ledger_dsn = create_database(pg_cluster.dsn())
    ledger_dsn = ledger_dsn.replace("//postgres@", f"//postgres:{PASSWORD}@", 1)
    world = build_world(tmp_path, pg_dsn, ledger="postgres", ledger_dsn=ledger_dsn)
    try:
        yield world, pg_cluster
    finally:
        world.close()


# -- the ledger is away ------------------------------------------------------------------


def test_ledger_down_before_the_claim_is_ledger_unavailable_exit_7_and_nothing_claimed(
    ledger_world: tuple[World, PgCluster],
) -> None:
    """A stopped ledger server is exit 7 / ledger_unavailable at once, naming host:port
    and never the password; nothing is claimed, so the same nonce later runs as attempt 1."""
    world, cluster = ledger_world
    token = world.issue(DEBIT)
    cluster.stop("immediate")

    res, took = exec_cli(world, token, "n-1")

    assert res.returncode == 7, (res.stdout, res.stderr)
    error = one_json(res.stdout)["error"]
    assert error["code"] == "ledger_unavailable"
    assert f"127.0.0.1:{cluster.port}" in error["message"]
    assert PASSWORD not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "error connecting" not in res.stderr, res.stderr
    assert took < FAST_SECONDS, f"exec took {took:.1f}s to notice a stopped ledger"
    assert world.balances() == START

    cluster.start()
    outcome = world.execute(token, "n-1")
    assert (outcome.status, outcome.attempt, outcome.recorded) == ("applied", 1, True)
    assert world.balances() == {**START, 1: 90}


def test_opening_or_creating_a_ledger_on_a_closed_port_fails_at_once(tmp_path: Path) -> None:
    """No server behind the DSN: create and open raise LedgerUnavailable at once, naming
    the address and not the password (not a raw driver error, not a 30 s pool wait)."""
    port = free_port()
    dsn = (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/nothing"
           "?sslmode=disable&gssencmode=disable")
    for attempt in (lambda: create_ledger(dsn, "pilot-x"), lambda: open_ledger(dsn)):
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable) as raised:
            attempt()
        assert time.monotonic() - started < FAST_SECONDS
        assert f"127.0.0.1:{port}/nothing" in raised.value.message
        assert PASSWORD not in raised.value.message
        assert raised.value.exit_status == 7


def _run_then_lose_the_ledger(world: World, cluster: PgCluster,
                              token: str) -> tuple[Any, list[dict[str, Any]]]:
    """Execute ``token`` as n-1 and stop the ledger's server the moment the target has
    committed (before the Pilot records anything): the outcome and the events."""
    events: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        if event["event"] == "committed":
            cluster.stop("immediate")

    world.pilot  # noqa: B018 - opened (and recovered) while the ledger is up
    outcome = world.execute(token, "n-1", on_event=on_event)
    return outcome, events


def _assert_applied_not_recorded(world: World, outcome: Any, events: list[dict[str, Any]],
                                 marque_id: str) -> None:
    assert (outcome.status, outcome.attempt, outcome.rows_affected) == ("applied", 1, 1)
    assert outcome.recorded is False and outcome.error is None
    assert outcome.to_dict()["recorded"] is False
    assert outcome.exit_status == 0
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "outcome_not_recorded", kinds
    assert "committed" in kinds and "outcome_recorded" not in kinds
    missed = events[-1]
    assert missed["status"] == "applied" and missed["tries"] == 3
    assert missed["error"]["code"] == "ledger_unavailable"
    assert PASSWORD not in missed["error"]["message"]
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world, marque_id) == [("n-1", "applied", 1, 1)]


def test_ledger_lost_after_commit_answers_applied_not_recorded_then_recover_records_it(
    ledger_world: tuple[World, PgCluster],
) -> None:
    """Ledger stopped right after the target's COMMIT: the caller is told applied with
    recorded: false; the attempt stays claimed, and once the ledger is back this
    process's recovery records what it saw (no second run)."""
    world, cluster = ledger_world
    token = world.issue(DEBIT)
    mid = marque_id_of(token)

    outcome, events = _run_then_lose_the_ledger(world, cluster, token)

    _assert_applied_not_recorded(world, outcome, events, mid)
    cluster.start()
    ledger = world.pilot.ledger
    assert ledger.outcome(mid, "n-1").status.value == "in_progress"  # claimed, unrecorded

    changes = world.pilot.recover()

    assert {"marque_id": mid, "nonce": "n-1", "attempt": 1, "from": "in_progress",
            "to": "applied"} in changes
    [attempt] = ledger.attempts(mid, "n-1")
    assert (attempt.status.value, attempt.rows_affected) == ("applied", 1)
    assert [(o["status"], o["cause"]) for o in ledger.observations(mid, "n-1")] == [
        ("applied", "execution")]
    kinds = [e["event"] for e in ledger.events(mid, "n-1")]
    assert kinds[-2:] == ["outcome_not_recorded", "outcome_recorded"], kinds
    replay = world.execute(token, "n-1")
    assert (replay.status, replay.replayed, replay.recorded) == ("applied", True, True)
    assert world.balances() == {**START, 1: 90}
    assert ledger.budget(mid)["executions_left"] == 0


def test_a_retry_to_the_process_that_saw_the_commit_is_applied_once_the_ledger_is_back(
    ledger_world: tuple[World, PgCluster],
) -> None:
    """The process told its caller applied (recorded: false); asked the same nonce again
    once the ledger is back, it records what it saw and answers applied — not in_progress
    until its background reconciler's next round (soak row 3's finding)."""
    world, cluster = ledger_world
    token = world.issue(DEBIT)
    mid = marque_id_of(token)
    outcome, events = _run_then_lose_the_ledger(world, cluster, token)
    _assert_applied_not_recorded(world, outcome, events, mid)
    cluster.start()

    retried = world.execute(token, "n-1")

    assert (retried.status, retried.attempt, retried.rows_affected, retried.recorded) == (
        "applied", 1, 1, True)
    [attempt] = world.pilot.ledger.attempts(mid, "n-1")
    assert attempt.status.value == "applied"
    assert [(o["status"], o["cause"]) for o in world.pilot.ledger.observations(mid, "n-1")] == [
        ("applied", "execution")]
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world, mid) == [("n-1", "applied", 1, 1)]


def test_ledger_lost_after_commit_is_settled_from_the_stamp_by_another_process(
    ledger_world: tuple[World, PgCluster],
) -> None:
    """When the process that saw the COMMIT is gone, `marque reconcile` settles the
    unrecorded attempt applied from the target's stamp, once; `outcome` then says so."""
    world, cluster = ledger_world
    token = world.issue(DEBIT)
    mid = marque_id_of(token)
    outcome, events = _run_then_lose_the_ledger(world, cluster, token)
    _assert_applied_not_recorded(world, outcome, events, mid)
    world.close_pilot()  # its observation dies with it; the stamp remains
    cluster.start()

    res = run_cli("reconcile", "--home", world.home, "--json")

    assert res.returncode == 0, res.stderr
    body = one_json(res.stdout)
    assert [(c["nonce"], c["attempt"], c["from"], c["to"]) for c in body["changed"]] == [
        ("n-1", 1, "in_progress", "applied")]
    shown = run_cli("outcome", "--home", world.home, mid, "n-1", "--json")
    assert shown.returncode == 0, shown.stderr
    shown_body = one_json(shown.stdout)
    assert (shown_body["status"], shown_body["attempt"], shown_body["rows_affected"],
            shown_body["recorded"]) == ("applied", 1, 1, True)
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world, mid) == [("n-1", "applied", 1, 1)]


def test_ledger_connection_cut_by_a_proxy_after_commit_answers_applied_not_recorded(
    tmp_path: Path, pg_dsn: str, pg_cluster: PgCluster,
    pg_proxy: PgProxyFactory,
) -> None:
    """The network to the ledger is cut (a TCP proxy drops every connection) right after the
    target's COMMIT: applied with recorded: false; once it is back, recovery records it."""
    _, ledger_dsn = create_database(pg_cluster.dsn())
    proxy, proxied = pg_proxy(ledger_dsn)
    world = build_world(tmp_path, pg_dsn, ledger="postgres", ledger_dsn=proxied)
    try:
        token = world.issue(DEBIT)
        mid = marque_id_of(token)
        events: list[dict[str, Any]] = []

        def on_event(event: dict[str, Any]) -> None:
            events.append(event)
            if event["event"] == "committed":
                proxy.sever()

        world.pilot  # noqa: B018 - opened (and recovered) while the ledger is reachable
        outcome = world.execute(token, "n-1", on_event=on_event)

        assert (outcome.status, outcome.recorded) == ("applied", False)
        assert [e["event"] for e in events][-1] == "outcome_not_recorded"
        assert events[-1]["error"]["code"] == "ledger_unavailable"
        assert world.balances() == {**START, 1: 90}
        assert stamp_view(world, mid) == [("n-1", "applied", 1, 1)]

        proxy.restore()
        changes = world.pilot.recover()
        assert {"marque_id": mid, "nonce": "n-1", "attempt": 1, "from": "in_progress",
                "to": "applied"} in changes
        replay = world.execute(token, "n-1")
        assert (replay.status, replay.attempt, replay.replayed) == ("applied", 1, True)
        assert world.balances() == {**START, 1: 90}
    finally:
        world.close()


# -- the target is away ------------------------------------------------------------------


def test_target_refusing_connections_is_target_unavailable_at_once_then_the_nonce_reruns(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """A stopped target server: exec (a fresh process) answers aborted_not_applied with
    target_unavailable at once, naming host:port; once the server is back the same nonce
    applies as attempt 2 without spending a second execution."""
    world = cluster_world
    token = world.issue(DEBIT, executions=1)
    pg_cluster.stop("immediate")

    res, took = exec_cli(world, token, "n-1")

    assert res.returncode == 4, (res.stdout, res.stderr)
    body = one_json(res.stdout)
    assert (body["status"], body["attempt"], body["recorded"]) == (
        "aborted_not_applied", 1, True)
    assert body["error"]["code"] == "target_unavailable"
    assert f"127.0.0.1:{pg_cluster.port}" in body["error"]["message"]
    assert "error connecting" not in res.stderr, res.stderr
    assert took < FAST_SECONDS, f"exec took {took:.1f}s to notice a stopped target"

    pg_cluster.start()
    again, _ = exec_cli(world, token, "n-1")
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert (one_json(again.stdout)["status"], one_json(again.stdout)["attempt"]) == (
        "applied", 2)
    assert world.balances() == {**START, 1: 90}
    assert stamp_view(world, marque_id_of(token)) == [("n-1", "applied", 2, 1)]


def test_a_warm_pilot_whose_target_stops_answers_target_unavailable_at_once(
    cluster_world: World, pg_cluster: PgCluster,
) -> None:
    """A long-running Pilot with pooled target connections: the server stops; the next
    execution is target_unavailable within seconds (not a pool timeout) and applies later."""
    world = cluster_world
    warm = world.execute(world.issue("UPDATE accounts SET balance = balance + 1 WHERE id = 2"),
                         "warm")
    assert warm.status == "applied"
    token = world.issue(DEBIT, executions=1)
    pg_cluster.stop("immediate")

    started = time.monotonic()
    outcome = world.execute(token, "n-1")
    took = time.monotonic() - started

    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None and outcome.error["code"] == "target_unavailable"
    assert took < FAST_SECONDS, f"took {took:.1f}s to notice a stopped target"

    pg_cluster.start()
    again = world.execute(token, "n-1")
    assert (again.status, again.attempt) == ("applied", 2)
    assert world.balances() == {1: 90, 2: 101, 3: 100}


# -- an error received at COMMIT -----------------------------------------------------------


def test_a_deferred_constraint_failing_at_commit_is_aborted_not_applied(
    sqlite_world: World,
) -> None:
    """A DEFERRABLE INITIALLY DEFERRED constraint the approved statement violates fails at
    COMMIT: aborted_not_applied (the server answered), nothing applied, no stamp."""
    world = sqlite_world
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE entries (id int, "
                     "CONSTRAINT one_entry UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
        conn.execute("INSERT INTO entries VALUES (1)")
    token = world.issue("INSERT INTO entries VALUES (1)")
    mid = marque_id_of(token)

    outcome = world.execute(token, "n-1")

    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None
    assert (outcome.error["code"], outcome.error["sqlstate"]) == ("statement_error", "23505")
    kinds = [e["event"] for e in world.events]
    # The statement itself succeeded and the assertions passed: the error came at COMMIT.
    assert "statement_finished" in kinds and "asserted" in kinds
    assert "committed" not in kinds and "outcome_unknown" not in kinds
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM entries").fetchone() == (1,)
    assert stamp_view(world, mid) == []
    assert [(o["status"], o["cause"]) for o in world.pilot.ledger.observations(mid, "n-1")] == [
        ("aborted_not_applied", "execution")]


# -- the stamp table's versions on PostgreSQL ------------------------------------------------


def test_a_version_1_stamp_table_is_upgraded_and_keeps_its_stamps(sqlite_world: World) -> None:
    """A pre-versioning ``marque.stamps`` (DESIGN §3's columns, no version row) is migrated
    forward on first use, keeps its rows, and fences executions as before."""
    world = sqlite_world
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        for statement in POSTGRES_MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO marque.stamps VALUES ('mq_old', 'n-old', 1, 'applied', "
                     "'pilot-0', 'inc_old', 1, 0)")
    token = world.issue(DEBIT)

    assert world.execute(token, "n-1").status == "applied"
    assert world.execute(token, "n-1").replayed

    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT component, version FROM marque.versions").fetchall() == [
            ("stamps", VERSION)]
        oldest = conn.execute(
            "SELECT marque_id, expires_at FROM marque.stamps ORDER BY created_at").fetchone()
        assert oldest == ("mq_old", None)
        assert conn.execute("SELECT 1 FROM pg_indexes WHERE schemaname = 'marque' "
                            "AND indexname = 'stamps_live'").fetchone() == (1,)
    assert world.balances() == {**START, 1: 90}


def test_a_version_3_stamp_table_gets_the_row_stamps_live_index_and_keeps_its_row_stamps(
    sqlite_world: World,
) -> None:
    """A version-3 ``marque`` schema (row stamps without their live index) is migrated to
    the current version on first use: ``row_stamps_live`` exists, the row stamps survive."""
    world = sqlite_world
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        for statements in POSTGRES_MIGRATIONS[:3]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("CREATE TABLE marque.versions (component text PRIMARY KEY, "
                     "version int NOT NULL)")
        conn.execute("INSERT INTO marque.versions VALUES ('stamps', 3)")
        conn.execute("INSERT INTO marque.row_stamps (effect_apply_key, row_idempotency_key, "
                     "marque_id, nonce, dispatch_attempt, kind, pilot_id, incarnation, "
                     "rows_affected, created_at, expires_at) VALUES "
                     "('k', 'r', 'mq_old', 'n-old', 1, 'applied', 'p0', 'inc_old', 1, 0, 1e12)")
    token = world.issue(DEBIT)

    assert world.execute(token, "n-1").status == "applied"

    assert VERSION == 5
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT component, version FROM marque.versions").fetchall() == [
            ("stamps", VERSION)]
        assert conn.execute("SELECT 1 FROM pg_indexes WHERE schemaname = 'marque' "
                            "AND indexname = 'row_stamps_live'").fetchone() == (1,)
        assert conn.execute("SELECT marque_id, kind FROM marque.row_stamps").fetchall() == [
            ("mq_old", "applied")]
        [(target_id,)] = conn.execute("SELECT target_id FROM marque.target_identity").fetchall()
    assert target_id.startswith("tgt_")
    assert world.balances() == {**START, 1: 90}


def test_a_stamp_table_newer_than_the_pilot_is_target_unavailable(sqlite_world: World) -> None:
    """A stamp table a newer Marque upgraded is refused before anything is sent."""
    world = sqlite_world
    with psycopg.connect(world.target_dsn, autocommit=True) as conn:
        for statements in POSTGRES_MIGRATIONS:
            for statement in statements:
                conn.execute(statement)
        conn.execute("CREATE TABLE marque.versions (component text PRIMARY KEY, "
                     "version int NOT NULL)")
        conn.execute("INSERT INTO marque.versions VALUES ('stamps', %s)", (VERSION + 1,))
    token = world.issue(DEBIT)

    outcome = world.execute(token, "n-1")

    assert (outcome.status, outcome.attempt) == ("aborted_not_applied", 1)
    assert outcome.error is not None and outcome.error["code"] == "target_unavailable"
    assert f"version {VERSION + 1}" in outcome.error["message"]
    assert world.balances() == START
    assert stamp_view(world, marque_id_of(token)) == []
