"""What the CLI tells an operator (issue 8, findings 4, 7 and 8), through the real ``marque``.

Reaped nonces are said to be reaped; the clock-skew window is visible and
``ledger stats`` agrees with ``ledger reap``; a file that holds no marque is
one answer; a dead owner is not an expired lease; and human output is plain,
escaped, unwrapped text with ISO times — no Python reprs, epoch floats or
table names.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from e2e_support import EXIT, OUTCOME_KEYS, World, claims_of

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
#: An epoch time as Python prints it (a float or a 10-digit int): never in human output.
EPOCH = re.compile(r"\b1\d{9}(\.\d+)?\b")
REPR = re.compile(r"\{'|'\}|': |<[a-z_.]+ object at|Traceback")


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_settings(world: World, **settings: Any) -> None:
    """Change the Pilot's settings in its pilot.json, as an operator would."""
    path = world.home / "pilot.json"
    config = json.loads(path.read_text())
    config["settings"].update(settings)
    path.write_text(json.dumps(config, indent=2))


def wait_past_expiry(marque: Path, margin: float = 0.3) -> int:
    """Sleep until the marque's ``exp`` has passed; returns ``exp``."""
    exp = int(claims_of(marque)["exp"])
    time.sleep(max(0.0, exp - time.time()) + margin)
    return exp


def human_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_plain(text: str) -> None:
    """Human output: no colour codes, no Python reprs, no epoch numbers."""
    assert "\x1b" not in text, text
    assert not REPR.search(text), text
    assert not EPOCH.search(text), text


# -- finding 4: a reaped nonce is reaped, not unknown --------------------------------------


def test_outcome_of_a_reaped_nonce_says_reaped(world: World) -> None:
    """After `ledger reap`, `outcome` answers nonce_reaped (exit 2) with how and when; others
    stay not_found."""
    marque = world.issue([DEBIT], ttl="1s")
    mid = world.marque_id(marque)
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]  # inside the 60 s skew
    set_settings(world, skew_seconds=0)  # so "expired" needs no 60 s wait
    exp = wait_past_expiry(marque)
    before = time.time()
    reaped = world.run("ledger", "reap", "--home", world.home, "--json")
    after = time.time()
    assert reaped.returncode == 0, reaped
    assert reaped.json["reaped"]["marques"] == 1

    res = world.outcome(mid, "n-1")
    assert res.returncode == EXIT["usage"], res
    body = res.json
    assert body["error"]["code"] == "nonce_reaped"
    assert (body["marque_id"], body["nonce"]) == (mid, "n-1")
    kept = body["reaped"]
    assert (kept["status"], kept["attempt"], kept["rows_affected"]) == ("applied", 1, 1)
    assert kept["expires_at"] == exp
    assert before - 1 <= kept["reaped_at"] <= after + 1
    # What the message says was reported before reaping is in the logbook.
    assert [e["body"]["nonce"] for e in world.logbook("execution.applied")] == ["n-1"]

    human = world.run("outcome", "--home", world.home, mid, "n-1")
    assert human.returncode == EXIT["usage"], human
    assert human.stdout == ""
    [line] = human_lines(human.stderr)
    assert "nonce_reaped" in line and "applied" in line
    assert iso(exp) in line and "logbook" in line
    assert_plain(line)

    unknown = world.outcome(mid, "never-claimed")
    assert unknown.returncode == EXIT["usage"], unknown
    assert unknown.json["error"]["code"] == "not_found"


def test_a_reaped_marque_never_runs_again_even_with_a_wider_allowance(world: World) -> None:
    """Raising skew_seconds after a reap does not renew the marque's budget: marque_expired,
    naming the reap, for the old nonce and a new one; the target changed once."""
    marque = world.issue([DEBIT], executions=3, ttl="1s")
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]
    set_settings(world, skew_seconds=0)
    wait_past_expiry(marque)
    assert world.run("ledger", "reap", "--home", world.home, "--json").json[
        "reaped"]["marques"] == 1

    set_settings(world, skew_seconds=3600)
    for nonce in ("n-1", "n-2"):
        res = world.exec(marque, nonce)
        assert res.returncode == EXIT["refused"], res
        assert res.json["error"]["code"] == "marque_expired"
        assert "reaped" in res.json["error"]["message"]
    assert world.balances() == {1: 90, 2: 100}
    assert world.ledger_count("claims") == 0


# -- finding 7: the clock-skew window is visible; stats and reap agree -----------------


def test_a_marque_run_inside_the_skew_allowance_says_so(world: World) -> None:
    """A marque run after its exp (inside the 60 s allowance) names exp and the allowance in
    its claimed event, as JSON and as a human line."""
    marque = world.issue([DEBIT], executions=2, ttl="1s")
    exp = wait_past_expiry(marque)

    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["applied"], res
    [claimed] = [e for e in res.events if e["event"] == "claimed"]
    assert (claimed["marque_expired_at"], claimed["skew_seconds"]) == (exp, 60)

    human = world.run("exec", "--home", world.home, "--marque", marque, "--key",
                      world.holder_key, "--nonce", "n-2")
    assert human.returncode == EXIT["applied"], human
    assert f"the marque expired at {iso(exp)}" in human.stderr
    assert "60 s clock-skew allowance" in human.stderr
    assert_plain(human.stderr + human.stdout)


def test_a_marque_inside_its_window_says_nothing_about_skew(world: World) -> None:
    """A marque run well before its exp has no skew fields in its claimed event."""
    res = world.exec(world.issue([DEBIT]), "n-1")
    assert res.returncode == EXIT["applied"], res
    [claimed] = [e for e in res.events if e["event"] == "claimed"]
    assert "marque_expired_at" not in claimed and "skew_seconds" not in claimed


def test_stats_and_reap_agree_inside_and_after_the_skew_window(world: World) -> None:
    """Inside the allowance stats calls nothing reapable and reap reaps nothing; both name the
    same next time; with no allowance both see the marque."""
    marque = world.issue([DEBIT], ttl="1s")
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]
    exp = wait_past_expiry(marque)

    stats = world.stats()
    assert (stats["reapable_marques"], stats["live_marques"]) == (0, 1)
    assert (stats["skew_seconds"], stats["next_reapable_at"]) == (60, exp + 60)
    reap = world.run("ledger", "reap", "--home", world.home, "--json")
    assert reap.returncode == 0, reap
    assert reap.json["reaped"]["marques"] == 0
    assert reap.json["next_reapable_at"] == exp + 60
    human = world.run("ledger", "reap", "--home", world.home)
    assert human.returncode == 0, human
    assert "nothing to reap" in human.stdout and iso(exp + 60) in human.stdout
    assert_plain(human.stdout)

    set_settings(world, skew_seconds=0)
    stats = world.stats()
    assert (stats["reapable_marques"], stats["live_marques"]) == (1, 0)
    assert stats["next_reapable_at"] is None
    reap = world.run("ledger", "reap", "--home", world.home, "--json")
    assert reap.json["reaped"]["marques"] == 1
    assert world.stats()["reaped_marques"] == 1


def test_an_expired_marque_is_refused_naming_expiry_and_allowance(world: World) -> None:
    """marque_expired says when the marque expired (ISO) and how much skew the Pilot allows."""
    set_settings(world, skew_seconds=0)
    marque = world.issue([DEBIT], ttl="1s")
    exp = wait_past_expiry(marque)
    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["refused"], res
    message = res.json["error"]["message"]
    assert res.json["error"]["code"] == "marque_expired"
    assert iso(exp) in message and "0 s of clock skew" in message
    assert "settings.skew_seconds" in message
    assert str(exp) not in message
    assert world.ledger_count("claims") == 0


# -- finding 8: one answer for "not a marque" ---------------------------------------------


@pytest.mark.parametrize("content", [b"", b"  \n\t\n", b"\xff\xfe\x00garbage\x9b", b"hello"],
                         ids=["empty", "whitespace", "binary", "text"])
def test_a_file_that_holds_no_marque_is_marque_invalid(world: World, content: bytes) -> None:
    """Empty, blank, binary or text files are all refused marque_invalid (exit 3), nothing
    claimed."""
    path = world.root / "not-a-marque.jws"
    path.write_bytes(content)
    res = world.exec(path, "n-1")
    assert res.returncode == EXIT["refused"], res
    body = res.json
    assert (body["status"], body["error"]["code"]) == ("refused", "marque_invalid")
    assert OUTCOME_KEYS <= set(body)
    assert world.ledger_count("claims") == 0


def test_a_missing_marque_file_is_a_usage_error(world: World) -> None:
    """A marque file that does not exist is input_invalid (exit 2): the command named nothing."""
    res = world.exec(world.root / "nowhere.jws", "n-1")
    assert res.returncode == EXIT["usage"], res
    assert res.json["error"]["code"] == "input_invalid"


# -- finding 8: a dead owner is not an expired lease ----------------------------------


def _crashed_after_claim(world: World, nonce: str) -> str:
    marque = world.issue([DEBIT], executions=3)
    crashed = world.exec(marque, nonce, env={"MARQUE_CRASH_AT": "after_claim"})
    assert crashed.returncode == -9, crashed
    return world.marque_id(marque)


def _first_observation_code(world: World, mid: str, nonce: str) -> str:
    [(detail,)] = world.ledger_rows(
        "SELECT detail FROM observations WHERE marque_id = ? AND nonce = ? "
        "ORDER BY observed_at LIMIT 1", (mid, nonce))
    return str(json.loads(detail)["error"]["code"])


def test_a_dead_owner_is_owner_gone(world: World) -> None:
    """An owner killed seconds ago (lease still valid) is owner_gone, shown by `outcome` and
    kept through reconciliation; never lease_expired."""
    mid = _crashed_after_claim(world, "n-1")

    shown = world.run("outcome", "--home", world.home, mid, "n-1")
    assert shown.returncode == EXIT["in_progress"], shown
    assert "nothing is running it (owner_gone)" in shown.stdout
    assert "marque reconcile" in shown.stdout
    assert_plain(shown.stdout)

    rec = world.reconcile()
    assert rec.returncode == 0, rec
    assert [(c["from"], c["to"]) for c in rec.json["changed"]] == [
        ("in_progress", "aborted_not_applied")]
    res = world.outcome(mid, "n-1")
    assert res.returncode == EXIT["aborted_not_applied"], res
    assert res.json["error"]["code"] == "owner_gone"
    assert _first_observation_code(world, mid, "n-1") == "owner_gone"
    [entry] = world.logbook("execution.reconciliation")
    assert entry["body"]["cause"] == "owner_gone"


def test_a_lease_that_ran_out_is_lease_expired(world: World) -> None:
    """An attempt whose lease really ran out is lease_expired."""
    set_settings(world, statement_timeout_ms=1000, lease_grace_seconds=0)  # a 1 s lease
    mid = _crashed_after_claim(world, "n-1")
    time.sleep(1.3)
    rec = world.reconcile()
    assert rec.returncode == 0, rec
    res = world.outcome(mid, "n-1")
    assert res.json["error"]["code"] == "lease_expired"
    assert _first_observation_code(world, mid, "n-1") == "lease_expired"


# -- finding 8: human output is plain text an operator can read -------------------------


def test_piped_messages_are_one_plain_line_whatever_the_width(world: World) -> None:
    """A long error on a pipe is one unwrapped line without colour codes, even at 30 columns."""
    res = world.run("outcome", "--home", world.home, "mq_" + "x" * 60, "n-1",
                    env={"COLUMNS": "30"})
    assert res.returncode == EXIT["usage"], res
    [line] = human_lines(res.stderr)
    assert line.startswith("usage: not_found — ") and "mq_" + "x" * 60 in line
    assert_plain(line)


def test_control_characters_from_the_command_line_are_escaped(world: World) -> None:
    """A control character in an argument comes back escaped (\\x1b), never raw."""
    res = world.run("exec", "--home", world.home, "--marque", "evil\x1b[31m.jws", "--key",
                    world.holder_key, "--nonce", "n-1")
    assert res.returncode == EXIT["usage"], res
    assert "\x1b" not in res.stderr
    assert "evil\\x1b[31m.jws" in res.stderr

    # An id or nonce stays on its line: tabs and newlines are escaped too.
    marque = world.issue([DEBIT])
    res = world.run("exec", "--home", world.home, "--marque", marque, "--key",
                    world.holder_key, "--nonce", "a\tb\nc\x1b")
    assert res.returncode == EXIT["usage"], res  # a nonce may not hold control characters
    [echo] = [line for line in res.stderr.splitlines() if line.startswith("exec marque")]
    assert echo.endswith("nonce a\\x09b\\x0ac\\x1b"), echo
    assert "\t" not in res.stderr and "\x1b" not in res.stderr


def test_refused_objects_carry_every_outcome_key(world: World) -> None:
    """A refusal's JSON has the keys of an applied outcome, ``result`` among them (null)."""
    marque = world.issue([DEBIT])
    applied = world.exec(marque, "n-1")
    refused = world.exec(marque, "n-2")
    assert refused.returncode == EXIT["refused"], refused
    assert set(refused.json) == set(applied.json)
    assert refused.json["result"] is None and "result" in applied.json


def test_human_output_has_iso_times_and_no_internals(world: World) -> None:
    """exec, outcome, reconcile, ledger stats and reap print ISO times and readable errors, no
    reprs, epochs or table names."""
    marque = world.issue([DEBIT], executions=2)
    mid = world.marque_id(marque)
    ran = world.run("exec", "--home", world.home, "--marque", marque, "--key",
                    world.holder_key, "--nonce", "n-1")
    assert ran.returncode == EXIT["applied"], ran
    [claimed] = [line for line in ran.stderr.splitlines() if "claimed" in line]
    assert re.search(r"lease_expires_at=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", claimed), claimed
    assert mid in ran.stderr  # the marque id, which an operator needs when exec did not finish

    outputs = [ran.stdout + ran.stderr]
    for args in (("outcome", "--home", world.home, mid, "n-1"),
                 ("reconcile", "--home", world.home),
                 ("ledger", "stats", "--home", world.home),
                 ("ledger", "reap", "--home", world.home)):
        res = world.run(*args)
        assert res.returncode == 0, res
        outputs.append(res.stdout + res.stderr)
    wide = world.issue(["UPDATE accounts SET balance = balance + 1"])
    aborted = world.run("exec", "--home", world.home, "--marque", wide, "--key",
                        world.holder_key, "--nonce", "n-1")
    assert aborted.returncode == EXIT["aborted_not_applied"], aborted
    [rolled] = [line for line in aborted.stderr.splitlines() if "rolled_back" in line]
    assert "error=max_rows_exceeded (statements affected 2 rows" in rolled, rolled
    outputs.append(aborted.stdout + aborted.stderr)
    for text in outputs:
        assert_plain(text)
    stats_text, reap_text = outputs[3], outputs[4]
    assert re.search(r"next reapable at\s+\d{4}-\d\d-\d\dT", stats_text), stats_text
    assert "clock-skew allowance" in stats_text
    for internal in ("pop_jtis", "outbox", "budgets"):
        assert internal not in reap_text, reap_text
