"""The Pilot in process, against real SQLite files: DESIGN §2–§5 and seed 000.

Every test drives :meth:`Pilot.execute` (or recovery) and then looks at what
an operator could look at: the target's rows and stamps, the ledger's
outcome/budget/stats, the Outcome object, the event stream and the logbook.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
import threading
import time
from typing import Any

import pytest
from joserfc import jws
from joserfc.jwk import OKPKey

from marque.cid import cid
from marque.errors import (
    AttemptsExhausted,
    BudgetExhausted,
    ConfigInvalid,
    InvalidInput,
    LedgerMissing,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    PopInvalid,
    PopKeyMismatch,
    PopMissing,
    PopReplayed,
    Refusal,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.ledger import ClaimTicket
from marque.outcome import Outcome
from marque.pilot import PilotHome, open_pilot
from marque.pilot.setup import init_home
from marque.token import Guard, make_proof, new_key

from .conftest import PILOT_ID, Env, marque_id_of

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
DEBIT_1_BY_1 = "UPDATE accounts SET balance = balance - 1 WHERE id = 1"
START = {1: 100, 2: 100, 3: 100}
HAPPY_EVENTS = [
    "claimed",
    "fence_checked",
    "statement_started",
    "statement_finished",
    "asserted",
    "committed",
    "outcome_recorded",
]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def executions_left(env: Env, marque_id: str) -> int | None:
    budget = env.pilot.ledger.budget(marque_id)
    return None if budget is None else budget["executions_left"]


# -- the happy path and its replay -------------------------------------------------------


def test_happy_path_applies_once_and_records_everything(env: Env) -> None:
    """An approved UPDATE applies once, stamps the target, streams and stores its events."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)

    outcome = env.run(token, "n-1")

    assert outcome.status == "applied"
    assert outcome.attempt == 1
    assert outcome.rows_affected == 1
    assert outcome.replayed is False
    assert outcome.error is None
    assert outcome.marque_id == mid and outcome.nonce == "n-1"
    assert outcome.pilot_id == PILOT_ID == env.pilot.pilot_id
    assert outcome.incarnation == env.pilot.incarnation
    assert outcome.exit_status == 0
    assert env.balances() == {1: 90, 2: 100, 3: 100}

    stamps = env.stamps()
    assert len(stamps) == 1
    stamp = stamps[0]
    assert (stamp["marque_id"], stamp["nonce"], stamp["attempt"]) == (mid, "n-1", 1)
    assert stamp["kind"] == "applied"
    assert stamp["rows_affected"] == 1
    assert stamp["pilot_id"] == PILOT_ID
    assert stamp["incarnation"] == env.pilot.incarnation

    streamed = kinds(env.events)
    assert streamed[: len(HAPPY_EVENTS)] == HAPPY_EVENTS
    assert streamed[len(HAPPY_EVENTS):] in ([], ["reported"])
    assert all(e["marque_id"] == mid and e["nonce"] == "n-1" for e in env.events)
    assert env.events[-1 if streamed[-1] != "reported" else -2]["status"] == "applied"

    stored = env.pilot.ledger.events(mid, "n-1")
    assert kinds(stored) == HAPPY_EVENTS
    assert stored == env.events[: len(HAPPY_EVENTS)]

    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and record.status.value == "applied"
    assert record.rows_affected == 1
    assert executions_left(env, mid) == 0


def test_replay_same_nonce_returns_recorded_outcome_without_touching_target(env: Env) -> None:
    """A retry with the same nonce returns the recorded outcome, replayed, and runs nothing."""
    token = env.issue([DEBIT_1], executions=2)
    mid = marque_id_of(token)
    first = env.run(token, "n-1")
    budget_before = env.pilot.ledger.budget(mid)
    env.events.clear()

    second = env.run(token, "n-1")

    assert second.replayed is True
    assert {**second.to_dict(), "replayed": False} == first.to_dict()
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    assert env.pilot.ledger.budget(mid) == budget_before
    assert len(env.stamps()) == 1
    assert "statement_started" not in kinds(env.events)
    assert env.pilot.outcome(mid, "n-1") == second


# -- refusals (DESIGN §2): typed, claim nothing, spend nothing ---------------------------


def _tampered_signature(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    header, payload, signature = token.split(".")
    middle = len(signature) // 2
    flipped = "A" if signature[middle] != "A" else "B"
    bad = f"{header}.{payload}.{signature[:middle]}{flipped}{signature[middle + 1:]}"
    return bad, None


def _tampered_payload(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["budget"]["executions"] = 1000
    return f"{header}.{b64(json.dumps(claims).encode())}.{signature}", None


def _alg_changed(alg: str) -> Any:
    def build(env: Env) -> tuple[str, str | None]:
        token = env.issue([DEBIT_1])
        _, payload, signature = token.split(".")
        header = {"alg": alg, "typ": "marque+jwt", "kid": env.issuer["kid"]}
        return f"{b64(json.dumps(header).encode())}.{payload}.{signature}", None

    return build


def _unknown_kid(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1], issuer=new_key()), None


def _expired(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1], now=time.time() - 3600, ttl=60), None


def _not_yet_valid(env: Env) -> tuple[str, str | None]:
    now = time.time()
    return env.issue([DEBIT_1], now=now, not_before=now + 3600, ttl=7200), None


def _wrong_pilot(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1], pilot_id="pilot-2"), None


def _wrong_incarnation(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1], incarnation="inc_" + "0" * 32), None


def _unknown_target(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1], target="nope"), None


def _proof_missing(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1]), ""


def _proof_garbage(env: Env) -> tuple[str, str | None]:
    return env.issue([DEBIT_1]), "garbage"


def _proof_other_holder(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    return token, make_proof(new_key(), token, nonce="n-1", pilot_id=env.pilot.pilot_id)


def _proof_other_nonce(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    return token, env.proof(token, "another-nonce")


def _proof_other_pilot(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    return token, make_proof(env.holder, token, nonce="n-1", pilot_id="pilot-2")


def _proof_other_marque(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    other = env.issue([DEBIT_1])
    return token, env.proof(other, "n-1")


def _proof_stale(env: Env) -> tuple[str, str | None]:
    token = env.issue([DEBIT_1])
    return token, make_proof(
        env.holder, token, nonce="n-1", pilot_id=env.pilot.pilot_id, now=time.time() - 3600
    )


REFUSALS = [
    pytest.param(_tampered_signature, MarqueInvalid, "marque_invalid", id="tampered-signature"),
    pytest.param(_tampered_payload, MarqueInvalid, "marque_invalid", id="tampered-payload"),
    pytest.param(_alg_changed("HS256"), MarqueInvalid, "marque_invalid", id="alg-hs256"),
    pytest.param(_alg_changed("none"), MarqueInvalid, "marque_invalid", id="alg-none"),
    pytest.param(_unknown_kid, MarqueInvalid, "marque_invalid", id="unknown-kid"),
    pytest.param(_expired, MarqueExpired, "marque_expired", id="expired"),
    pytest.param(_not_yet_valid, MarqueNotYetValid, "marque_not_yet_valid", id="not-yet-valid"),
    pytest.param(_wrong_pilot, WrongPilot, "wrong_pilot", id="wrong-pilot"),
    pytest.param(_wrong_incarnation, WrongIncarnation, "wrong_incarnation",
                 id="wrong-incarnation"),
    pytest.param(_unknown_target, UnknownTarget, "unknown_target", id="unknown-target"),
    pytest.param(_proof_missing, PopMissing, "pop_missing", id="proof-missing"),
    pytest.param(_proof_garbage, PopInvalid, "pop_invalid", id="proof-garbage"),
    pytest.param(_proof_other_nonce, PopInvalid, "pop_invalid", id="proof-other-nonce"),
    pytest.param(_proof_other_pilot, PopInvalid, "pop_invalid", id="proof-other-pilot"),
    pytest.param(_proof_other_marque, PopInvalid, "pop_invalid", id="proof-other-marque"),
    pytest.param(_proof_stale, PopInvalid, "pop_invalid", id="proof-stale"),
    pytest.param(_proof_other_holder, PopKeyMismatch, "pop_key_mismatch",
                 id="proof-other-holder"),
]


def assert_untouched(env: Env, marque_id: str) -> None:
    assert env.pilot.ledger.outcome(marque_id, "n-1") is None
    assert env.pilot.ledger.budget(marque_id) is None
    assert env.pilot.ledger.stats(time.time())["claims"] == 0
    assert env.balances() == START
    assert env.stamps() == []


@pytest.mark.parametrize(("build", "error", "code"), REFUSALS)
def test_refusal_is_typed_and_claims_nothing(env: Env, build: Any, error: Any, code: str) -> None:
    """Each DESIGN §2 refusal raises its typed error and claims no nonce, spends no budget."""
    token, proof = build(env)

    with pytest.raises(error) as caught:
        env.pilot.execute(token, proof, "n-1", on_event=env.events.append)

    assert caught.value.code == code
    assert isinstance(caught.value, Refusal)
    assert env.events == []
    assert_untouched(env, marque_id_of(token))


def test_proof_none_is_pop_missing(env: Env) -> None:
    """A request without any proof (None) is refused with pop_missing and claims nothing."""
    token = env.issue([DEBIT_1])
    with pytest.raises(PopMissing) as caught:
        env.pilot.execute(token, None, "n-1")
    assert caught.value.code == "pop_missing"
    assert_untouched(env, marque_id_of(token))


def test_refusal_does_not_burn_the_nonce(env: Env) -> None:
    """A refused request leaves its nonce free: a good request with it then applies."""
    token = env.issue([DEBIT_1])
    with pytest.raises(PopMissing):
        env.pilot.execute(token, None, "n-1")
    with pytest.raises(PopKeyMismatch):
        env.run(token, "n-1", holder=new_key())

    outcome = env.run(token, "n-1")

    assert outcome.status == "applied" and outcome.attempt == 1 and not outcome.replayed
    assert env.balances() == {1: 90, 2: 100, 3: 100}


def test_refused_proof_does_not_burn_its_jti(env: Env) -> None:
    """A proof refused for another nonce is not remembered; used for its own nonce it works."""
    token = env.issue([DEBIT_1])
    proof = env.proof(token, "n-1")
    with pytest.raises(PopInvalid):
        env.pilot.execute(token, proof, "n-2")

    outcome = env.pilot.execute(token, proof, "n-1")

    assert outcome.status == "applied"


def test_replayed_proof_is_refused_and_changes_nothing(env: Env) -> None:
    """The same proof used twice: the second request raises pop_replayed and spends nothing."""
    token = env.issue([DEBIT_1], executions=2)
    mid = marque_id_of(token)
    proof = env.proof(token, "n-1")
    first = env.pilot.execute(token, proof, "n-1")
    assert first.status == "applied"
    budget = env.pilot.ledger.budget(mid)
    stamps = env.stamps()

    with pytest.raises(PopReplayed) as caught:
        env.pilot.execute(token, proof, "n-1")

    assert caught.value.code == "pop_replayed"
    assert env.pilot.ledger.budget(mid) == budget
    assert budget is not None and budget["executions_left"] == 1
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    assert env.stamps() == stamps
    assert env.pilot.ledger.outcome(mid, "n-1").attempt == 1  # type: ignore[union-attr]


def test_replay_proof_is_refused_again_and_after_a_restart(env: Env) -> None:
    """A proof that replayed an applied nonce cannot be used twice, nor after a restart."""
    token = env.issue([DEBIT_1], executions=2)
    mid = marque_id_of(token)
    env.run(token, "n-1")
    proof = env.proof(token, "n-1")

    replayed = env.pilot.execute(token, proof, "n-1")
    assert (replayed.status, replayed.replayed) == ("applied", True)
    with pytest.raises(PopReplayed):
        env.pilot.execute(token, proof, "n-1")

    env.reopen()
    with pytest.raises(PopReplayed):
        env.pilot.execute(token, proof, "n-1")
    assert env.pilot.execute(token, env.proof(token, "n-1"), "n-1").replayed is True
    assert env.pilot.ledger.budget(mid)["executions_left"] == 1  # type: ignore[index]
    assert env.balances() == {1: 90, 2: 100, 3: 100}


def test_replay_records_its_jti_before_answering_when_write_behind_is_off(env: Env) -> None:
    """settings.replay_jti_write_behind = false: the replay's jti is durable when it returns."""
    env.pilot.options.replay_jti_write_behind = False
    token = env.issue([DEBIT_1], executions=2)
    env.run(token, "n-1")
    proof = make_proof(env.holder, token, nonce="n-1", pilot_id=PILOT_ID, jti="jti-durable")

    replayed = env.pilot.execute(token, proof, "n-1")

    assert (replayed.status, replayed.replayed) == ("applied", True)
    # Nothing went write-behind (its writer thread starts with the first held jti)...
    assert env.pilot.ledger._jtis._writer.started is False  # type: ignore[attr-defined]
    # ...yet the jti is already in the ledger.
    assert env.pilot.ledger.remember_pop_jti("jti-durable", time.time() + 600) is False
    with pytest.raises(PopReplayed):
        env.pilot.execute(token, proof, "n-1")


def test_replay_jti_write_behind_setting_is_read_from_pilot_json_and_checked(env: Env) -> None:
    """The setting reaches the Pilot from pilot.json; a non-boolean value is config_invalid."""
    home = PilotHome(env.home)
    config = json.loads(home.config_path.read_text())
    config.setdefault("settings", {})["replay_jti_write_behind"] = False
    home.config_path.write_text(json.dumps(config))
    assert env.reopen().options.replay_jti_write_behind is False

    config["settings"]["replay_jti_write_behind"] = "false"
    home.config_path.write_text(json.dumps(config))
    env.pilot.close()
    with pytest.raises(ConfigInvalid) as caught:
        env.pilot = open_pilot(env.home)
    assert "replay_jti_write_behind" in str(caught.value)
    config["settings"]["replay_jti_write_behind"] = True
    home.config_path.write_text(json.dumps(config))
    env.pilot = open_pilot(env.home)


def test_refusal_after_a_run_leaves_budget_unchanged(env: Env) -> None:
    """A refused request for a marque that already has a budget row leaves executions_left."""
    token = env.issue([DEBIT_1], executions=3)
    mid = marque_id_of(token)
    env.run(token, "n-1")
    assert executions_left(env, mid) == 2

    with pytest.raises(PopKeyMismatch):
        env.run(token, "n-2", holder=new_key())
    with pytest.raises(PopMissing):
        env.pilot.execute(token, None, "n-3")

    assert executions_left(env, mid) == 2
    assert env.pilot.ledger.outcome(mid, "n-2") is None
    assert env.pilot.ledger.outcome(mid, "n-3") is None
    assert env.balances() == {1: 90, 2: 100, 3: 100}


# -- budget (seed 000) -------------------------------------------------------------------


def test_budget_allows_exactly_executions_nonces(env: Env) -> None:
    """executions=3 over 8 distinct nonces: exactly 3 apply, 5 are budget_exhausted."""
    token = env.issue([DEBIT_1_BY_1], executions=3)
    mid = marque_id_of(token)
    applied, exhausted = 0, 0
    for i in range(8):
        try:
            outcome = env.run(token, f"n-{i}")
        except BudgetExhausted as exc:
            assert exc.code == "budget_exhausted"
            assert env.pilot.ledger.outcome(mid, f"n-{i}") is None
            exhausted += 1
        else:
            assert outcome.status == "applied"
            applied += 1
    assert (applied, exhausted) == (3, 5)
    assert env.balances()[1] == 97
    assert executions_left(env, mid) == 0
    assert len(env.stamps()) == 3


def test_failed_attempts_spend_budget(env: Env) -> None:
    """A nonce whose statement fails still spends an execution (seed 000)."""
    token = env.issue(["INSERT INTO accounts (id, balance) VALUES (1, 0)"], executions=2)
    mid = marque_id_of(token)

    a = env.run(token, "A")
    b = env.run(token, "B")

    for outcome in (a, b):
        assert outcome.status == "aborted_not_applied"
        assert outcome.error is not None and outcome.error["code"] == "statement_error"
        assert outcome.exit_status == 4
    assert "rolled_back" in kinds(env.events)
    with pytest.raises(BudgetExhausted):
        env.run(token, "C")
    assert env.pilot.ledger.outcome(mid, "C") is None
    assert executions_left(env, mid) == 0
    assert env.balances() == START
    assert env.stamps() == []


def test_aborted_nonce_reruns_as_next_attempt_without_second_decrement(env: Env) -> None:
    """aborted_not_applied re-runs under the same nonce as attempt 2, budget spent once."""
    guard = Guard("SELECT balance FROM accounts WHERE id = 2", expect=50)
    token = env.issue([DEBIT_1], executions=2, guards=[guard])
    mid = marque_id_of(token)

    first = env.run(token, "n-1")
    assert first.status == "aborted_not_applied"
    assert first.attempt == 1
    assert first.error is not None and first.error["code"] == "guard_failed"
    assert executions_left(env, mid) == 1
    assert env.stamps() == []

    env.set_balance(2, 50)
    second = env.run(token, "n-1")

    assert second.status == "applied"
    assert second.attempt == 2
    assert second.replayed is False
    assert executions_left(env, mid) == 1
    assert env.balances() == {1: 90, 2: 50, 3: 100}
    [stamp] = env.stamps()
    assert (stamp["kind"], stamp["attempt"]) == ("applied", 2)
    attempts = env.pilot.ledger.attempts(mid, "n-1")
    assert [(a.attempt, a.status.value) for a in attempts] == [
        (1, "aborted_not_applied"),
        (2, "applied"),
    ]
    # and now the nonce is settled for good
    assert env.run(token, "n-1").replayed is True
    assert executions_left(env, mid) == 1


def test_attempts_per_nonce_bound_retries(env: Env) -> None:
    """After attempts_per_nonce aborted attempts the nonce is refused with attempts_exhausted."""
    guard = Guard("SELECT balance FROM accounts WHERE id = 2", expect=50)
    token = env.issue([DEBIT_1], executions=1, attempts=2, guards=[guard])
    mid = marque_id_of(token)

    assert env.run(token, "n-1").attempt == 1
    assert env.run(token, "n-1").attempt == 2
    with pytest.raises(AttemptsExhausted) as caught:
        env.run(token, "n-1")

    assert caught.value.code == "attempts_exhausted"
    assert len(env.pilot.ledger.attempts(mid, "n-1")) == 2
    assert executions_left(env, mid) == 0
    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None
    assert (record.attempt, record.status.value) == (2, "aborted_not_applied")
    assert env.balances() == START


# -- max_rows is an assertion ------------------------------------------------------------


def test_write_over_max_rows_rolls_back(env: Env) -> None:
    """An UPDATE touching 3 rows under max_rows=1 aborts with max_rows_exceeded, nothing kept."""
    token = env.issue(["UPDATE accounts SET balance = balance - 10"], max_rows=1)

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "max_rows_exceeded"
    assert env.balances() == START
    assert env.stamps() == []


def test_multi_statement_total_counts_against_max_rows(env: Env) -> None:
    """Rows of all statements add up: two 1-row UPDATEs under max_rows=1 roll back together."""
    token = env.issue(
        [DEBIT_1, "UPDATE accounts SET balance = balance + 10 WHERE id = 2"], max_rows=1
    )

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "max_rows_exceeded"
    assert env.balances() == START


def test_read_within_max_rows_spends_budget_and_returns_rows(env: Env) -> None:
    """A SELECT under a marque spends budget and returns its rows when within max_rows."""
    token = env.issue(["SELECT id, balance FROM accounts ORDER BY id"], executions=2, max_rows=3)
    mid = marque_id_of(token)

    outcome = env.run(token, "n-1")

    assert outcome.status == "applied"
    assert outcome.rows_affected == 3
    assert outcome.result == {"columns": ["id", "balance"],
                              "rows": [[1, 100], [2, 100], [3, 100]]}
    assert executions_left(env, mid) == 1
    [stamp] = env.stamps()
    assert (stamp["kind"], stamp["rows_affected"]) == ("applied", 3)
    replay = env.run(token, "n-1")
    assert replay.replayed and replay.result == outcome.result


def test_read_over_max_rows_fails_rather_than_truncates(env: Env) -> None:
    """A SELECT returning more than max_rows aborts with max_rows_exceeded, never 2 of 3 rows."""
    token = env.issue(["SELECT id, balance FROM accounts ORDER BY id"], executions=2, max_rows=2)
    mid = marque_id_of(token)

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "max_rows_exceeded"
    assert outcome.result is None
    assert outcome.rows_affected is None
    assert executions_left(env, mid) == 1
    assert env.stamps() == []


# -- statement timeout -------------------------------------------------------------------

SLOW = (
    "UPDATE accounts SET balance = balance + (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x + 1 FROM c WHERE x < 100000000) SELECT count(*) - count(*) FROM c) WHERE id = 1"
)


def test_statement_timeout_from_pilot_options_aborts(env: Env) -> None:
    """A statement running past the Pilot's statement timeout aborts, not applied."""
    env.pilot.options.statement_timeout_ms = 200
    token = env.issue([SLOW])

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "statement_timeout"
    assert env.balances() == START
    assert env.stamps() == []


def test_statement_timeout_from_change_aborts(env: Env) -> None:
    """The change's own statement_timeout_ms bounds the statement too."""
    token = env.issue([SLOW], statement_timeout_ms=200)

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "statement_timeout"
    assert env.balances() == START
    assert env.stamps() == []


# -- guards ------------------------------------------------------------------------------


def test_guard_that_holds_lets_the_change_apply(env: Env) -> None:
    """Guards that hold before (value and boolean) let the change apply."""
    guards = [
        Guard("SELECT balance FROM accounts WHERE id = 1", expect=100),
        Guard("SELECT balance >= 10 FROM accounts WHERE id = ?", (1,), expect=True),
    ]
    token = env.issue([DEBIT_1], guards=guards)

    outcome = env.run(token, "n-1")

    assert outcome.status == "applied"
    assert env.balances()[1] == 90
    assert kinds(env.events).count("guard_checked") == 2


def test_guard_that_fails_aborts(env: Env) -> None:
    """A failing guard aborts with guard_failed and leaves the target unchanged."""
    token = env.issue([DEBIT_1], guards=[Guard("SELECT balance FROM accounts WHERE id = 1",
                                               expect=42)])

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "guard_failed"
    assert env.balances() == START
    assert env.stamps() == []
    assert "statement_started" not in kinds(env.events)


def test_after_guard_failing_rolls_back_the_update(env: Env) -> None:
    """A when='after' guard that fails after the UPDATE rolls the UPDATE back."""
    guard = Guard("SELECT balance FROM accounts WHERE id = 1", expect=100, when="after")
    token = env.issue([DEBIT_1], guards=[guard])

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "guard_failed"
    assert "statement_finished" in kinds(env.events)
    assert env.balances() == START
    assert env.stamps() == []


def test_after_guard_that_holds_applies(env: Env) -> None:
    """A when='after' guard sees the change inside the transaction and lets it commit."""
    guard = Guard("SELECT balance FROM accounts WHERE id = 1", expect=90, when="after")
    token = env.issue([DEBIT_1], guards=[guard])

    assert env.run(token, "n-1").status == "applied"
    assert env.balances()[1] == 90


# -- concurrency -------------------------------------------------------------------------


def _in_threads(count: int, work: Any) -> list[Any]:
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # collected and asserted on by the caller
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_same_nonce_from_many_threads_executes_once(env: Env) -> None:
    """20 threads with the same token and nonce: one execution, 20 identical applied outcomes."""
    token = env.issue([DEBIT_1], executions=1)
    proofs = [env.proof(token, "n-1") for _ in range(20)]

    results = _in_threads(20, lambda i: env.pilot.execute(token, proofs[i], "n-1"))

    assert all(isinstance(r, Outcome) for r in results), results
    assert {r.status for r in results} == {"applied"}
    assert {r.attempt for r in results} == {1}
    assert {r.rows_affected for r in results} == {1}
    assert sum(1 for r in results if not r.replayed) == 1
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    assert len(env.stamps()) == 1


def test_many_nonces_from_many_threads_respect_budget(env: Env) -> None:
    """20 threads with 20 nonces on executions=5: exactly 5 apply, 15 are budget_exhausted."""
    token = env.issue([DEBIT_1_BY_1], executions=5)
    proofs = [env.proof(token, f"n-{i}") for i in range(20)]

    results = _in_threads(20, lambda i: env.pilot.execute(token, proofs[i], f"n-{i}"))

    applied = [r for r in results if isinstance(r, Outcome)]
    exhausted = [r for r in results if isinstance(r, BudgetExhausted)]
    assert len(applied) == 5 and len(exhausted) == 15, results
    assert {r.status for r in applied} == {"applied"}
    assert env.balances()[1] == 95
    assert len(env.stamps()) == 5
    assert executions_left(env, marque_id_of(token)) == 0


class _JoinWatch(dict):  # type: ignore[type-arg]
    """The Pilot's in-flight table, reporting each caller that finds a running execution.

    ``Pilot.execute`` looks a nonce up here under its lock; a caller that finds
    one follows it instead of claiming. Counting those finds lets a test release
    the first caller exactly when the others are following it — no sleeps.
    """

    def __init__(self, joined: threading.Semaphore) -> None:
        super().__init__()
        self._joined = joined

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, default)
        if found is not None:
            self._joined.release()
        return found


def test_followers_of_a_refused_nonce_see_the_refusal(env: Env) -> None:
    """Callers that join an in-flight nonce whose claim is refused get the leader's refusal."""
    token = env.issue([DEBIT_1_BY_1], executions=1)
    assert env.run(token, "spent").status == "applied"
    counted = ("marques", "claims", "attempts", "pop_jtis")
    before = {k: env.pilot.ledger.stats(time.time())[k] for k in counted}

    real_clock = env.pilot.clock
    entered, release = threading.Event(), threading.Event()
    joined = threading.Semaphore(0)
    calls: dict[int, int] = {}

    def gated_clock() -> float:
        # The leader's second clock read is the one right before its claim: hold it there
        # (inflight registered, claim not yet made) until the followers are following it.
        ident = threading.get_ident()
        calls[ident] = calls.get(ident, 0) + 1
        if threading.current_thread().name == "leader" and calls[ident] == 2:
            entered.set()
            release.wait(10)
        return real_clock()

    env.pilot.clock = gated_clock
    env.pilot.execution._inflight = _JoinWatch(joined)
    errors: dict[str, BaseException | None] = {}
    proofs = {name: env.proof(token, "n-x") for name in ("leader", "f0", "f1", "f2")}

    def call(name: str) -> None:
        try:
            env.pilot.execute(token, proofs[name], "n-x")
            errors[name] = None
        except BaseException as exc:  # asserted on below
            errors[name] = exc

    first = threading.Thread(target=call, args=("leader",), name="leader")
    first.start()
    assert entered.wait(10)
    followers = [threading.Thread(target=call, args=(f"f{i}",)) for i in range(3)]
    for thread in followers:
        thread.start()
    for _ in followers:  # each has found the leader's execution and follows it
        assert joined.acquire(timeout=10)
    release.set()
    for thread in [first, *followers]:
        thread.join(10)

    leader_error = errors["leader"]
    assert isinstance(leader_error, BudgetExhausted)
    for i in range(3):
        # The very refusal the leader got: followers never made a claim of their own.
        assert errors[f"f{i}"] is leader_error, errors[f"f{i}"]
    assert env.pilot.ledger.outcome(marque_id_of(token), "n-x") is None
    assert {k: env.pilot.ledger.stats(time.time())[k] for k in counted} == before


# -- the stamp fence ---------------------------------------------------------------------


def test_existing_applied_stamp_blocks_the_statement_and_settles_applied(env: Env) -> None:
    """An applied stamp already in the target means the statement never runs again."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    env.plant_stamp(mid, "n-1", kind="applied", rows_affected=1)

    outcome = env.run(token, "n-1")

    assert env.balances() == START
    assert outcome.status == "applied"
    assert outcome.rows_affected == 1
    assert outcome.replayed is False
    assert "statement_started" not in kinds(env.events)
    assert {"event": "fence_checked", "stamp": "conflict"}.items() <= next(
        e for e in env.events if e["event"] == "fence_checked").items()
    [stamp] = env.stamps()
    assert stamp["kind"] == "applied"
    assert env.pilot.logbook is not None
    reconciliations = env.pilot.logbook.entries("execution.reconciliation")
    assert [e["body"]["cause"] for e in reconciliations] == ["fence_conflict"]
    assert reconciliations[0]["body"]["status"] == "applied"
    # the nonce is settled; a retry is a replay and still does not run
    assert env.run(token, "n-1").replayed is True
    assert env.balances() == START


def test_existing_tombstone_blocks_its_attempt_and_the_next_attempt_applies(env: Env) -> None:
    """A tombstone for attempt 1 aborts attempt 1; attempt 2 replaces it and applies once."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    env.plant_stamp(mid, "n-1", kind="tombstone", attempt=1)

    first = env.run(token, "n-1")
    assert first.status == "aborted_not_applied"
    assert env.balances() == START

    second = env.run(token, "n-1")
    assert (second.status, second.attempt) == ("applied", 2)
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    [stamp] = env.stamps()
    assert (stamp["kind"], stamp["attempt"], stamp["rows_affected"]) == ("applied", 2, 1)


# -- leases and recovery -----------------------------------------------------------------


def _stale_claim(env: Env, token: str, nonce: str) -> None:
    """Claim ``nonce`` as a foreign run whose lease ran out long ago."""
    now = time.time()
    claim = env.pilot.ledger.claim(
        ClaimTicket(
            marque_id=marque_id_of(token), nonce=nonce, target="bank", executions=1,
            max_rows=1, attempts_per_nonce=3, expires_at=now + 600,
            owner_process="proc_" + "f" * 32, lease_seconds=0.01, now=now - 10,
        )
    )
    assert claim.fresh and claim.record.status.value == "in_progress"


def test_expired_lease_becomes_indeterminate_then_reconciled_by_tombstone(env: Env) -> None:
    """An expired foreign lease: indeterminate, then a tombstone proves it not applied."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    _stale_claim(env, token, "n-1")

    changes = env.pilot.recover()

    assert changes == [{"marque_id": mid, "nonce": "n-1", "attempt": 1,
                        "from": "in_progress", "to": "aborted_not_applied"}]
    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and record.status.value == "aborted_not_applied"
    seen = [(o["status"], o["cause"]) for o in env.pilot.ledger.observations(mid, "n-1")]
    assert seen == [("indeterminate", "lease"), ("aborted_not_applied", "reconciliation")]
    assert env.balances() == START
    [stamp] = env.stamps()
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)

    assert env.pilot.logbook is not None
    entries = env.pilot.logbook.entries("execution.")
    reconciliation = [e for e in entries if e["kind"] == "execution.reconciliation"]
    assert len(reconciliation) == 1
    assert reconciliation[0]["body"]["cause"] == "lease_expired"
    assert reconciliation[0]["body"]["status"] == "aborted_not_applied"
    outcomes = [e for e in entries if e["kind"] == "execution.aborted_not_applied"]
    assert len(outcomes) == 1 and outcomes[0]["body"]["nonce"] == "n-1"
    assert env.pilot.logbook.verify()

    # The nonce may now run again as attempt 2, with no second budget decrement.
    again = env.run(token, "n-1")
    assert (again.status, again.attempt) == ("applied", 2)
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    assert executions_left(env, mid) == 0


def test_expired_lease_found_by_execute_is_settled_not_rerun(env: Env) -> None:
    """A retry that meets an expired foreign lease settles it by evidence before answering."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    _stale_claim(env, token, "n-1")

    outcome = env.run(token, "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.attempt == 1
    assert env.balances() == START
    assert [s["kind"] for s in env.stamps()] == ["tombstone"]
    assert env.pilot.ledger.outcome(mid, "n-1").status.value == (  # type: ignore[union-attr]
        "aborted_not_applied"
    )


def test_recovery_runs_at_open(env: Env) -> None:
    """open_pilot settles an expired lease left by a previous run."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    _stale_claim(env, token, "n-1")

    env.reopen()

    record = env.pilot.ledger.outcome(mid, "n-1")
    assert record is not None and record.status.value == "aborted_not_applied"
    assert [s["kind"] for s in env.stamps()] == ["tombstone"]


# -- incarnations ------------------------------------------------------------------------


def _ledger_files(env: Env) -> list[str]:
    base = str(env.home / "ledger.sqlite3")
    return [base, base + "-wal", base + "-shm"]


def test_lost_ledger_is_a_new_incarnation_and_old_marques_are_refused(env: Env) -> None:
    """A deleted ledger is re-initialised deliberately; old marques then hit wrong_incarnation."""
    old_incarnation = env.pilot.incarnation
    token = env.issue([DEBIT_1], executions=2)
    assert env.run(token, "n-1").status == "applied"

    env.pilot.close()
    for path in _ledger_files(env):
        if os.path.exists(path):
            os.remove(path)
    with pytest.raises(LedgerMissing):
        open_pilot(env.home)

    created = init_home(env.home, PILOT_ID)
    assert created["pilot_id"] == PILOT_ID
    assert created["incarnation"] != old_incarnation
    env.pilot = open_pilot(env.home)
    assert env.pilot.incarnation == created["incarnation"]

    with pytest.raises(WrongIncarnation) as caught:
        env.run(token, "n-2")
    assert caught.value.code == "wrong_incarnation"
    assert env.balances() == {1: 90, 2: 100, 3: 100}

    fresh = env.issue([DEBIT_1])
    outcome = env.run(fresh, "n-1")
    assert outcome.status == "applied"
    assert outcome.incarnation == created["incarnation"]


def test_init_home_refuses_to_overwrite_a_live_ledger(env: Env) -> None:
    """init_home on a home whose ledger exists refuses rather than resetting budgets."""
    from marque.errors import LedgerExists

    with pytest.raises(LedgerExists):
        init_home(env.home, PILOT_ID)
    with pytest.raises(LedgerExists):
        init_home(env.home, "someone-else")


def test_ledger_restored_from_old_copy_rotates_incarnation(env: Env) -> None:
    """A ledger restored from before a stamped execution is detected at start: new incarnation."""
    old_incarnation = env.pilot.incarnation
    env.pilot.close()
    backup = env.home / "backup"
    backup.mkdir()
    for path in _ledger_files(env):
        if os.path.exists(path):
            shutil.copy(path, backup / os.path.basename(path))
    env.pilot = open_pilot(env.home)
    token = env.issue([DEBIT_1], executions=2)
    assert env.run(token, "n-1").status == "applied"
    env.pilot.close()
    for path in _ledger_files(env):
        if os.path.exists(path):
            os.remove(path)
    for saved in backup.iterdir():
        shutil.copy(saved, env.home / saved.name)

    env.pilot = open_pilot(env.home)

    assert env.pilot.incarnation != old_incarnation
    with pytest.raises(WrongIncarnation):
        env.run(token, "n-1")
    assert env.balances() == {1: 90, 2: 100, 3: 100}


# -- outbox and logbook ------------------------------------------------------------------


def test_applied_outcome_is_reported_to_the_logbook(env: Env) -> None:
    """After an applied run the outbox is drained and the logbook holds a matching entry."""
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)

    outcome = env.run(token, "n-1")

    assert kinds(env.events)[-1] == "reported"
    stats = env.pilot.ledger.stats(time.time())
    assert stats["unreported_outcomes"] == 0
    assert stats["attempts_by_status"]["applied"] == 1
    assert stats["incarnation"] == env.pilot.incarnation
    assert env.pilot.logbook is not None
    [entry] = env.pilot.logbook.entries("execution.applied")
    assert entry["body"] == {
        "marque_id": mid,
        "nonce": "n-1",
        "attempt": 1,
        "status": "applied",
        "rows_affected": 1,
        "error": None,
        "pilot": {"id": PILOT_ID, "incarnation": env.pilot.incarnation},
        "cause": "execution",
    }
    assert entry["body"]["status"] == outcome.status
    assert env.pilot.logbook.verify()

    # a replay reports nothing new
    env.run(token, "n-1")
    assert len(env.pilot.logbook.entries("execution.")) == 1


def test_aborted_outcomes_are_reported_per_attempt(env: Env) -> None:
    """Each settled attempt of a nonce reaches the logbook once, keyed by attempt."""
    guard = Guard("SELECT balance FROM accounts WHERE id = 2", expect=50)
    token = env.issue([DEBIT_1], guards=[guard])
    env.run(token, "n-1")
    env.set_balance(2, 50)
    env.run(token, "n-1")

    assert env.pilot.logbook is not None
    entries = env.pilot.logbook.entries("execution.")
    assert [(e["kind"], e["body"]["attempt"]) for e in entries] == [
        ("execution.aborted_not_applied", 1),
        ("execution.applied", 2),
    ]
    assert env.pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
    assert env.pilot.logbook.verify()


# -- lost COMMIT responses and the fenced transaction's edges ----------------------------


def test_commit_blocked_by_a_reader_is_indeterminate_then_reconciled(env: Env) -> None:
    """A COMMIT blocked by a reader is indeterminate; recovery settles it by a tombstone."""
    home = PilotHome(env.home)
    config = home.load()
    config.settings.lock_timeout_ms = 200
    home.save(config)
    env.reopen()
    token = env.issue([DEBIT_1])
    mid = marque_id_of(token)
    reader = sqlite3.connect(env.bank_path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM accounts").fetchall()  # holds a SHARED lock

        outcome = env.run(token, "n-1")

        assert outcome.status == "indeterminate"
        assert outcome.error is not None and outcome.error["code"] == "commit_unknown"
        assert outcome.exit_status == 5
        assert "committed" not in kinds(env.events)
        # a retry asks the target again (its tombstone is still blocked): the truth as it
        # stands, still unknown, never a second run
        retry = env.run(token, "n-1")
        assert (retry.status, retry.attempt, retry.replayed) == ("indeterminate", 1, True)
    finally:
        reader.execute("ROLLBACK")
        reader.close()

    changes = env.pilot.recover()

    assert changes == [{"marque_id": mid, "nonce": "n-1", "attempt": 1,
                        "from": "indeterminate", "to": "aborted_not_applied"}]
    assert env.balances() == START
    [stamp] = env.stamps()
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)
    assert env.pilot.logbook is not None
    whys = [e["body"]["cause"] for e in env.pilot.logbook.entries("execution.reconciliation")]
    assert whys == ["commit_unknown", "retry", "recovery"]
    again = env.run(token, "n-1")
    assert (again.status, again.attempt) == ("applied", 2)
    assert env.balances() == {1: 90, 2: 100, 3: 100}
    assert executions_left(env, mid) == 0


def test_two_statements_in_one_sql_string_are_not_run(env: Env) -> None:
    """An approved SQL string smuggling a second statement is refused before it is signed."""
    with pytest.raises(InvalidInput, match="more than one statement"):
        env.issue([DEBIT_1 + "; UPDATE accounts SET balance = 0 WHERE id = 2"])
    assert env.balances() == START


@pytest.mark.parametrize(
    "statements",
    [
        ["COMMIT", "UPDATE accounts SET balance = balance - 10"],
        ["ROLLBACK", DEBIT_1],
        [DEBIT_1 + "; COMMIT"],
        ["/* hidden */ savepoint s1", DEBIT_1],
        ["SET LOCAL statement_timeout = 0", DEBIT_1],
    ],
    ids=["commit", "rollback", "two-in-one", "savepoint", "set"],
)
def test_transaction_control_cannot_be_issued(env: Env, statements: list[str]) -> None:
    """A change that would end, split or reconfigure the fenced transaction is not issuable."""
    with pytest.raises(InvalidInput):
        env.issue(statements, max_rows=1)


@pytest.mark.filterwarnings("ignore:EdDSA is deprecated")
def test_transaction_control_signed_by_a_trusted_issuer_is_refused(env: Env) -> None:
    """A trusted signature over a COMMIT is still refused: nothing claimed, nothing run."""
    token = env.issue([DEBIT_1])
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["change"]["statements"] = [
        {"sql": "COMMIT", "params": []},
        {"sql": "UPDATE accounts SET balance = balance - 10", "params": []},
    ]
    claims["change"]["change_cid"] = cid(claims["change"], exclude="change_cid")
    forged = jws.serialize_compact(
        json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))),
        json.dumps(claims).encode(),
        OKPKey.import_key(env.issuer),
        algorithms=["EdDSA"],
    )

    with pytest.raises(MarqueInvalid):
        env.run(forged, "n-1")

    assert env.pilot.ledger.outcome(claims["jti"], "n-1") is None
    assert env.balances() == START
    assert env.stamps() == []


def test_lease_outlives_the_change_statement_timeout(env: Env) -> None:
    """The claim's lease covers the statement timeout the change asks for, plus grace."""
    token = env.issue([DEBIT_1], statement_timeout_ms=600_000)
    mid = marque_id_of(token)

    env.run(token, "n-1")

    [record] = env.pilot.ledger.attempts(mid, "n-1")
    assert record.lease_expires_at - record.started_at >= 600


def test_a_caller_following_a_running_nonce_sees_every_event(env: Env) -> None:
    """A second caller of a running nonce gets the events so far, then the live ones, in order."""
    slow = ("UPDATE accounts SET balance = balance - 10 + (WITH RECURSIVE c(x) AS (SELECT 1 "
            "UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT count(*) - count(*) FROM c) "
            "WHERE id = 1")
    token = env.issue([slow])
    started = threading.Event()
    first_events: list[dict[str, Any]] = []

    def on_first(event: dict[str, Any]) -> None:
        first_events.append(event)
        if event["event"] == "statement_started":
            started.set()

    results: list[Outcome] = []
    leader = threading.Thread(
        target=lambda: results.append(
            env.pilot.execute(token, env.proof(token, "n-1"), "n-1", on_event=on_first)
        )
    )
    leader.start()
    assert started.wait(30)
    followed: list[dict[str, Any]] = []
    second = env.pilot.execute(token, env.proof(token, "n-1"), "n-1", on_event=followed.append)
    leader.join(30)

    assert second.replayed and second.status == "applied"
    assert results and results[0].status == "applied" and not results[0].replayed
    executed = [e["event"] for e in first_events if e["event"] != "reported"]
    assert kinds(followed)[: len(executed)] == executed
    assert "committed" in kinds(followed) and "outcome_recorded" in kinds(followed)
    assert env.balances()[1] == 90
