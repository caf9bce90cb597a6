"""The CLI contract of DESIGN §9, end to end: real subprocesses, real SQLite files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import EXIT, OUTCOME_KEYS, World, claims_of, cli_env

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
APPLIED_EVENTS = [
    "claimed", "fence_checked", "statement_started", "statement_finished", "asserted",
    "committed", "outcome_recorded",
]


def assert_outcome_shape(body: dict, world: World) -> None:
    assert OUTCOME_KEYS <= set(body), body
    assert body["pilot"] == {"id": world.pilot_id, "incarnation": world.incarnation}


def in_order(kinds: list[str], expected: list[str]) -> bool:
    """Whether ``expected`` occurs in ``kinds`` as a subsequence, in that order."""
    it = iter(kinds)
    return all(any(k == e for k in it) for e in expected)


# -- exec -----------------------------------------------------------------------


def test_exec_applied(world: World) -> None:
    """exec of a fresh nonce applies once: exit 0, §9 outcome, §3 events in order, balance 90."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["applied"], res
    body = res.json
    assert_outcome_shape(body, world)
    assert body["marque_id"] == world.marque_id(marque)
    assert body["nonce"] == "n-1"
    assert body["status"] == "applied"
    assert body["attempt"] == 1
    assert body["rows_affected"] == 1
    assert body["replayed"] is False
    assert body["error"] is None

    events = res.events
    kinds = [e["event"] for e in events]
    assert in_order(kinds, APPLIED_EVENTS), kinds
    assert "rolled_back" not in kinds and "outcome_unknown" not in kinds
    # The report to the (local) logbook is acknowledged after the outcome is recorded.
    assert kinds.index("reported") > kinds.index("outcome_recorded")
    for event in events:
        assert event["marque_id"] == body["marque_id"] and event["nonce"] == "n-1"
    assert events[kinds.index("outcome_recorded")]["status"] == "applied"
    assert events[kinds.index("statement_started")]["sql"] == DEBIT

    assert world.balances() == {1: 90, 2: 100}
    [stamp] = world.stamps()
    assert (stamp["marque_id"], stamp["nonce"], stamp["kind"], stamp["attempt"],
            stamp["rows_affected"], stamp["pilot_id"], stamp["incarnation"]) == (
        body["marque_id"], "n-1", "applied", 1, 1, world.pilot_id, world.incarnation)


def test_same_nonce_replays(world: World) -> None:
    """The same nonce again returns the recorded outcome (replayed) and runs nothing."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    first = world.exec(marque, "n-1")
    assert first.returncode == 0, first
    again = world.exec(marque, "n-1")
    assert again.returncode == 0, again
    body = again.json
    assert_outcome_shape(body, world)
    assert body["status"] == "applied"
    assert body["replayed"] is True
    assert (body["attempt"], body["rows_affected"]) == (first.json["attempt"],
                                                       first.json["rows_affected"])
    assert "statement_started" not in again.kinds()
    assert world.balances() == {1: 90, 2: 100}
    assert world.ledger_count("attempts") == 1


def test_new_nonce_on_spent_budget_is_refused(world: World) -> None:
    """A new nonce on an executions=1 marque already spent → exit 3 refused budget_exhausted."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    assert world.exec(marque, "n-1").returncode == 0
    res = world.exec(marque, "n-2")
    assert res.returncode == EXIT["refused"], res
    body = res.json
    assert OUTCOME_KEYS <= set(body), body
    assert body["status"] == "refused"
    assert body["nonce"] == "n-2"
    assert body["marque_id"] == world.marque_id(marque)
    assert body["error"]["code"] == "budget_exhausted"
    assert "claimed" not in res.kinds()
    assert world.ledger_rows("SELECT nonce FROM claims") == [("n-1",)]  # n-2 not claimed
    assert world.balances() == {1: 90, 2: 100}


def test_max_rows_exceeded_aborts(world: World) -> None:
    """An UPDATE touching 2 rows under max-rows 1 → exit 4 max_rows_exceeded, nothing changed."""
    marque = world.issue(["UPDATE accounts SET balance = balance + 5"], executions=1,
                         max_rows=1)
    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    body = res.json
    assert_outcome_shape(body, world)
    assert body["status"] == "aborted_not_applied"
    assert body["replayed"] is False
    assert body["error"]["code"] == "max_rows_exceeded"
    kinds = res.kinds()
    assert in_order(kinds, ["claimed", "fence_checked", "statement_started",
                            "statement_finished", "rolled_back", "outcome_recorded"]), kinds
    assert "committed" not in kinds and "asserted" not in kinds
    assert world.balances() == {1: 100, 2: 100}
    assert world.stamps() == []  # the stamp rolled back with the change


def test_params_and_multiple_statements(world: World) -> None:
    """Parameters bind to their statement and several statements commit together."""
    marque = world.issue(
        ["UPDATE accounts SET balance = balance - ? WHERE id = ?",
         "UPDATE accounts SET balance = balance + ? WHERE id = ?"],
        ["[25, 1]", "[25, 2]"], executions=1, max_rows=2,
    )
    res = world.exec(marque, "transfer")
    assert res.returncode == 0, res
    assert res.json["rows_affected"] == 2
    assert res.kinds().count("statement_started") == 2
    assert world.balances() == {1: 75, 2: 125}


def test_read_is_fenced_and_bounded(world: World) -> None:
    """A SELECT is stamped and returns rows; one row past max_rows aborts it, never truncates."""
    marque = world.issue(["SELECT id, balance FROM accounts ORDER BY id"], executions=2,
                         max_rows=2)
    res = world.exec(marque, "read-1")
    assert res.returncode == 0, res
    assert res.json["rows_affected"] == 2
    assert res.json["result"] == {"columns": ["id", "balance"], "rows": [[1, 100], [2, 100]]}
    [stamp] = [s for s in world.stamps() if s["nonce"] == "read-1"]
    assert (stamp["kind"], stamp["rows_affected"]) == ("applied", 2)

    narrow = world.issue(["SELECT id FROM accounts"], executions=1, max_rows=1)
    res = world.exec(narrow, "read-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    assert res.json["error"]["code"] == "max_rows_exceeded"
    assert res.json["result"] is None


def test_wrong_holder_key_is_refused_without_claim(world: World) -> None:
    """A proof signed by a key other than cnf.jkt → exit 3 pop_key_mismatch, nothing claimed."""
    marque = world.issue([DEBIT])
    res = world.run("exec", "--home", world.home, "--marque", marque, "--key",
                    world.issuer_key, "--nonce", "n-1", "--json")
    assert res.returncode == EXIT["refused"], res
    assert res.json["status"] == "refused"
    assert res.json["error"]["code"] == "pop_key_mismatch"
    assert world.ledger_count("claims") == 0
    assert world.balances() == {1: 100, 2: 100}


# -- outcome ------------------------------------------------------------------------


def test_outcome_is_read_only(world: World) -> None:
    """`marque outcome` returns the recorded outcome with its exit status and writes nothing."""
    status = "aborted_not_applied"  # exit 4; test_crash covers exit 0, 4 and 6 as well
    marque = world.issue(["UPDATE accounts SET balance = 0"], executions=1, max_rows=1)
    executed = world.exec(marque, "n-1")
    assert executed.returncode == EXIT[status]
    stats_before, dump_before = world.stats(), world.ledger_dump()

    res = world.outcome(world.marque_id(marque), "n-1")
    assert res.returncode == EXIT[status], res
    body = res.json
    assert_outcome_shape(body, world)
    assert body["status"] == status
    assert body["replayed"] is True
    for key in ("marque_id", "nonce", "attempt", "rows_affected", "error", "pilot"):
        assert body[key] == executed.json[key], key
    assert res.stderr.strip() == ""  # nothing executed, nothing streamed

    assert world.stats() == stats_before
    assert world.ledger_dump() == dump_before


def test_outcome_of_unclaimed_nonce_is_not_found(world: World) -> None:
    """`marque outcome` of a nonce never claimed here → not_found (exit 2), not a usage error."""
    res = world.outcome("mq_nosuchmarque", "nope")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "not_found"
    assert set(res.json["error"]) == {"code", "message", "sqlstate"}  # no detail to give


# -- ledger ---------------------------------------------------------------------------


def test_ledger_stats_fields(world: World) -> None:
    """`marque ledger stats` reports identity, size, live marques, claims and unreported."""
    world.exec(world.issue([DEBIT], executions=2, max_rows=1), "n-1")
    world.exec(world.issue(["UPDATE accounts SET balance = 1"], max_rows=1), "n-1")
    stats = world.stats()
    assert (stats["pilot_id"], stats["incarnation"]) == (world.pilot_id, world.incarnation)
    for key in ("size_bytes", "live_marques", "unreported_outcomes", "claims", "attempts",
                "attempts_by_status", "marques", "reapable_marques", "schema_version"):
        assert key in stats, key
    assert stats["size_bytes"] > 0
    assert stats["marques"] == stats["live_marques"] == 2
    assert stats["claims"] == stats["attempts"] == 2
    assert stats["attempts_by_status"] == {"in_progress": 0, "indeterminate": 0,
                                           "aborted_not_applied": 1, "applied": 1}
    assert stats["unreported_outcomes"] == 0  # delivered to the local logbook
    assert stats["reapable_marques"] == 0  # nothing has expired


def test_ledger_reap_returns_counts(world: World) -> None:
    """`marque ledger reap` prints counts and keeps live marques."""
    world.exec(world.issue([DEBIT]), "n-1")
    res = world.run("ledger", "reap", "--home", world.home, "--json")
    assert res.returncode == 0, res
    counts = res.json["reaped"]
    assert counts["marques"] == 0
    assert all(isinstance(v, int) and v >= 0 for v in counts.values())
    assert world.ledger_count("claims") == 1


def test_ledger_reap_removes_expired_settled_marques(world: World) -> None:
    """Reaping deletes a settled, reported marque once it expired, and keeps the live one."""
    short = world.issue([DEBIT], ttl="1s")
    assert world.exec(short, "n-1").returncode == 0  # within the default 60 s skew
    long = world.issue(["UPDATE accounts SET balance = balance + 1 WHERE id = 2"])
    assert world.exec(long, "n-1").returncode == 0

    config_path = world.home / "pilot.json"
    config = json.loads(config_path.read_text())
    config["settings"]["skew_seconds"] = 0  # so "expired" needs no 60 s wait
    config_path.write_text(json.dumps(config))
    time.sleep(max(0.0, claims_of(short)["exp"] - time.time()) + 0.2)

    res = world.run("ledger", "reap", "--home", world.home, "--json")
    assert res.returncode == 0, res
    counts = res.json["reaped"]
    assert counts["marques"] == 1
    assert counts["claims"] == counts["attempts"] == counts["budgets"] == 1
    assert world.ledger_rows("SELECT marque_id FROM budgets") == [(world.marque_id(long),)]
    assert world.ledger_rows("SELECT marque_id, nonce FROM claims") == [
        (world.marque_id(long), "n-1")]


# -- usage errors ---------------------------------------------------------------------


def test_missing_required_option_exits_2(world: World) -> None:
    """A missing required option is a usage error: exit 2, nothing claimed."""
    res = world.run("exec", "--home", world.home, "--key", world.holder_key, "--nonce", "n",
                    "--json")
    assert res.returncode == EXIT["usage"], res
    assert "--marque" in res.json["error"]["message"]
    assert res.json["error"]["code"] == "input_invalid"


def test_missing_required_option_json_body(world: World) -> None:
    """With --json, even a click-level usage error prints one JSON error object on stdout."""
    res = world.run("exec", "--home", world.home, "--key", world.holder_key, "--nonce", "n",
                    "--json")
    assert res.returncode == EXIT["usage"]
    assert "error" in res.json


def test_pilot_init_twice_refuses(world: World) -> None:
    """`pilot init` on an initialised home → exit 2 ledger_exists; identity is kept."""
    res = world.run("pilot", "init", "--home", world.home, "--pilot-id", world.pilot_id,
                    "--json")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "ledger_exists"
    other = world.run("pilot", "init", "--home", world.home, "--pilot-id", "p2", "--json")
    assert other.returncode == EXIT["usage"], other
    assert other.json["error"]["code"] == "ledger_exists"
    stats = world.stats()
    assert (stats["pilot_id"], stats["incarnation"]) == (world.pilot_id, world.incarnation)
    # Marques pinned to the original incarnation still run.
    assert world.exec(world.issue([DEBIT]), "n-1").returncode == 0


@pytest.mark.parametrize("which", ["missing", "garbage"])
def test_unreadable_key_file_is_input_invalid(world: World, which: str) -> None:
    """An unreadable holder key (missing or not JSON) → exit 2 input_invalid, no claim."""
    marque = world.issue([DEBIT])
    key = world.root / "bad.jwk"
    if which == "garbage":
        key.write_text("this is not a JWK {")
    res = world.run("exec", "--home", world.home, "--marque", marque, "--key", key,
                    "--nonce", "n-1", "--json")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "input_invalid"
    assert world.ledger_count("claims") == 0
    assert world.balances() == {1: 100, 2: 100}


def test_unreadable_issuer_key_is_input_invalid(world: World) -> None:
    """`marque issue` with a missing issuer key file → exit 2 input_invalid, no token."""
    res = world.run("issue", "--issuer-key", world.root / "nope.jwk", "--pilot-id", "p1",
                    "--incarnation", world.incarnation, "--target", "bank", "--holder-key",
                    world.holder_pub, "--sql", DEBIT, "--executions", "1", "--max-rows", "1",
                    "--json")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "input_invalid"


@pytest.mark.parametrize("param", ["[1, 2", "{\"a\": 1}"])
def test_bad_param_json_exits_2(world: World, param: str) -> None:
    """A --param that is not a JSON array → exit 2 input_invalid, no token printed."""
    res = world.run("issue", "--issuer-key", world.issuer_key, "--pilot-id", "p1",
                    "--incarnation", world.incarnation, "--target", "bank", "--holder-key",
                    world.holder_pub, "--sql", "UPDATE accounts SET balance = ? WHERE id = 1",
                    "--param", param, "--executions", "1", "--max-rows", "1", "--json")
    assert res.returncode == EXIT["usage"], res
    body = res.json
    assert body["error"]["code"] == "input_invalid"
    assert "marque" not in body


# -- incarnations and tampering ----------------------------------------------------------


def test_lost_ledger_is_a_new_incarnation(world: World) -> None:
    """A lost ledger is never recreated silently; re-init refuses the old incarnation."""
    marque = world.issue([DEBIT])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{world.home / 'ledger.sqlite3'}{suffix}").unlink(missing_ok=True)

    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "ledger_missing"
    assert not (world.home / "ledger.sqlite3").exists()
    assert world.balances() == {1: 100, 2: 100}

    init = world.run("pilot", "init", "--home", world.home, "--pilot-id", world.pilot_id,
                     "--json")
    assert init.returncode == 0, init
    new_incarnation = init.json["incarnation"]
    assert new_incarnation != world.incarnation
    assert init.json["pilot_id"] == world.pilot_id

    old = world.exec(marque, "n-1")
    assert old.returncode == EXIT["refused"], old
    body = old.json
    assert body["status"] == "refused"
    assert body["error"]["code"] == "wrong_incarnation"
    assert body["pilot"] == {"id": world.pilot_id, "incarnation": new_incarnation}
    assert world.balances() == {1: 100, 2: 100}

    # Trust and targets survived; a marque for the new incarnation runs.
    fresh = world.issue([DEBIT], incarnation=new_incarnation)
    ok = world.exec(fresh, "n-1")
    assert ok.returncode == 0, ok
    assert ok.json["pilot"]["incarnation"] == new_incarnation
    assert world.balances() == {1: 90, 2: 100}


def test_tampered_marque_is_refused(world: World) -> None:
    """A marque whose signature was altered → exit 3 marque_invalid; no claim, no change."""
    marque = world.issue([DEBIT])
    header, payload, signature = marque.read_text().strip().split(".")
    middle = len(signature) // 2
    flipped = "A" if signature[middle] != "A" else "B"
    tampered = world.root / "tampered.jws"
    tampered.write_text(".".join(
        [header, payload, signature[:middle] + flipped + signature[middle + 1:]]) + "\n")

    res = world.exec(tampered, "n-1")
    assert res.returncode == EXIT["refused"], res
    body = res.json
    assert body["status"] == "refused"
    assert body["error"]["code"] == "marque_invalid"
    stats = world.stats()
    assert (stats["claims"], stats["attempts"], stats["pop_jtis"]) == (0, 0, 0)
    assert world.balances() == {1: 100, 2: 100}


#: A child that runs ``marque exec`` through the console script's own ``main`` and then
#: writes, to the file named by argv[1], what the command left behind in its process.
_EXEC_PROBE = """
import gc, json, sys
from marque.cli import main
report, args = sys.argv[1], sys.argv[2:]
gc.enable()
try:
    main(args)
except SystemExit as done:
    status = done.code
heavy = ('rich', 'tempfile', 'shutil', 'signal', 'sqlglot', 'psycopg', 'httpx')
with open(report, 'w') as f:
    json.dump({'status': status, 'loaded': [m for m in heavy if m in sys.modules],
               'frozen': gc.get_freeze_count(), 'gc_enabled': gc.isenabled()}, f)
"""


def test_an_exec_process_loads_only_what_it_runs_and_ends_frozen(world: World) -> None:
    """A `marque exec` that applies loads no rich, tempfile, shutil or signal (nor a SQL
    parser or a network client), ends with its objects frozen for a short exit, and turns
    the collector back on after the command body ran with it off."""
    marque = world.issue([DEBIT], executions=1, max_rows=1)
    report = world.root / "probe.json"
    args = [str(a) for a in world.exec_args(marque, "n-probe")]
    done = subprocess.run([sys.executable, "-c", _EXEC_PROBE, str(report), *args],
                          env=cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "applied"
    probe = json.loads(report.read_text())
    assert probe["status"] == EXIT["applied"]
    assert probe["loaded"] == []
    assert probe["frozen"] > 10_000
    assert probe["gc_enabled"] is True
    assert world.balances() == {1: 90, 2: 100}
