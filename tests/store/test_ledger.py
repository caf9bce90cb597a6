"""The ledger behaviour suite (DESIGN §3–§5, seed 001), run over every ledger engine.

Every test drives the ledger through its public interface and asserts on what
the ledger then holds: attempt records, budget rows, observations, events, the
outbox and stats. The ``ledger``/``pool`` fixtures are parametrised over
the ``engine`` fixture of conftest, so a new engine runs this whole file unchanged.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.errors import (
    AttemptsExhausted,
    BudgetExhausted,
    LedgerExists,
    LedgerMissing,
    PopReplayed,
)
from marque.ledger.base import Claim, ClaimTicket, Ledger, Observed
from marque.outcome import Status, advance

from .conftest import LedgerEngine, LedgerPool, make_ticket

T0 = 1_900_000_000.0  # a fixed clock for tests that reason about expiry

MQ = "mq_test"


def observe(
    ledger: Ledger,
    nonce: str,
    status: Status,
    *,
    attempt: int = 1,
    marque_id: str = MQ,
    cause: str = "test",
    now: float | None = None,
    **kwargs: Any,
) -> Any:
    """``ledger.observe`` with a default marque, attempt, clock and cause."""
    return ledger.observe(
        marque_id,
        nonce,
        attempt,
        status,
        now=time.time() if now is None else now,
        cause=cause,
        **kwargs,
    )


def claim_and_observe(
    ledger: Ledger, ticket: ClaimTicket, status: Status | None, **kwargs: Any
) -> Claim:
    """Claim a fresh nonce and, unless ``status`` is None, settle its attempt to ``status``."""
    claimed = ledger.claim(ticket)
    assert claimed.fresh
    if status is not None:
        ledger.observe(
            ticket.marque_id,
            ticket.nonce,
            claimed.record.attempt,
            status,
            now=ticket.now,
            cause="test",
            **kwargs,
        )
    return claimed


def ack_all(ledger: Ledger, now: float = T0) -> None:
    """Acknowledge every pending outbox report."""
    for entry in ledger.outbox_pending(limit=10_000):
        ledger.outbox_ack(entry, now)


def pending_for(ledger: Ledger, nonce: str, marque_id: str = MQ) -> list[Any]:
    return [
        e
        for e in ledger.outbox_pending(limit=10_000)
        if e.marque_id == marque_id and e.nonce == nonce
    ]


# -- the incarnation, written once ---------------------------------------------


def test_create_refuses_existing_ledger(pool: LedgerPool, ledger: Ledger, ledger_location: str):
    """``create`` on a location that already holds a ledger raises LedgerExists and keeps it."""
    incarnation = ledger.incarnation
    ledger.claim(make_ticket(nonce="kept"))
    with pytest.raises(LedgerExists):
        pool.create(ledger_location, pilot_id="pilot-intruder")
    reopened = pool.open(ledger_location)
    assert reopened.incarnation == incarnation
    assert reopened.pilot_id == "pilot-test"
    assert reopened.outcome(MQ, "kept") is not None


def test_reopen_keeps_identity_and_state(pool: LedgerPool, ledger: Ledger, ledger_location: str):
    """Re-opening a ledger keeps its pilot_id, incarnation and recorded claims."""
    pilot_id, incarnation = ledger.pilot_id, ledger.incarnation
    first = ledger.claim(make_ticket(nonce="n1"))
    ledger.close()
    reopened = pool.open(ledger_location)
    assert (reopened.pilot_id, reopened.incarnation) == (pilot_id, incarnation)
    assert reopened.outcome(MQ, "n1") == first.record
    assert reopened.budget(MQ)["executions_left"] == 2


def test_open_missing_ledger_raises_ledger_missing(pool: LedgerPool):
    """Opening a location with no ledger raises LedgerMissing and initialises nothing there."""
    location = pool.location()
    with pytest.raises(LedgerMissing):
        pool.open(location)
    # Nothing was silently created: the location still takes a brand-new ledger.
    created = pool.create(location)
    assert created.incarnation
    assert created.stats(T0)["claims"] == 0


def test_new_ledger_has_new_incarnation(pool: LedgerPool, ledger: Ledger):
    """A ledger created at a new location gets a different incarnation."""
    other = pool.create(pool.location())
    assert ledger.incarnation and other.incarnation
    assert other.incarnation != ledger.incarnation
    assert other.pilot_id == ledger.pilot_id == "pilot-test"


def test_concurrent_create_loser_sees_ledger_exists(
    engine: LedgerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two ``create`` calls racing on one SQLite file: the loser gets LedgerExists, not a crash."""
    if engine.name != "sqlite":
        pytest.skip("deterministic interleaving is SQLite-specific")
    from marque.ledger.sqlite import SqliteLedger

    path = str(tmp_path / "raced.sqlite3")
    real_has_schema = SqliteLedger._has_schema
    winners: list[Ledger] = []

    def racing_has_schema(self: SqliteLedger) -> bool:
        answer = real_has_schema(self)
        if not winners:
            # The other `marque pilot init` wins the race between check and write.
            monkeypatch.setattr(SqliteLedger, "_has_schema", real_has_schema)
            winners.append(SqliteLedger.create(path, "pilot-winner"))
        return answer

    monkeypatch.setattr(SqliteLedger, "_has_schema", racing_has_schema)
    try:
        loser_error: BaseException | None = None
        try:
            SqliteLedger.create(path, "pilot-loser").close()
        except BaseException as exc:  # noqa: BLE001 - inspected below
            loser_error = exc
        # Whatever the loser saw, the winner's incarnation survived.
        reopened = SqliteLedger.open(path)
        try:
            assert reopened.incarnation == winners[0].incarnation
            assert reopened.pilot_id == "pilot-winner"
        finally:
            reopened.close()
        assert isinstance(loser_error, LedgerExists), repr(loser_error)
    finally:
        for w in winners:
            w.close()


# -- claims and the budget --------------------------------------------------------


def test_fresh_claim_starts_attempt_one_and_spends_budget(ledger: Ledger):
    """A fresh claim starts attempt 1 in_progress with owner and lease, and spends one execution."""
    now = time.time()
    ticket = make_ticket(nonce="n1", executions=3, owner_process="proc_A", lease_seconds=45,
                         now=now)
    claimed = ledger.claim(ticket)
    assert claimed.fresh is True
    rec = claimed.record
    assert (rec.marque_id, rec.nonce, rec.attempt) == (MQ, "n1", 1)
    assert rec.status is Status.IN_PROGRESS
    assert rec.owner_process == "proc_A"
    assert rec.owner_incarnation == ledger.incarnation
    assert rec.lease_expires_at == pytest.approx(now + 45)
    assert rec.started_at == pytest.approx(now)
    assert rec.rows_affected is None and rec.result is None and rec.settled_at is None
    assert ledger.outcome(MQ, "n1") == rec
    assert ledger.budget(MQ) == {
        "executions_left": 2,
        "max_rows": ticket.max_rows,
        "attempts_per_nonce": ticket.attempts_per_nonce,
        "expires_at": pytest.approx(ticket.expires_at),
        "target": "bank",
    }


def test_same_nonce_replays_without_spending(ledger: Ledger):
    """Claiming a claimed nonce returns the same record (fresh=False) and spends nothing."""
    first = ledger.claim(make_ticket(nonce="n1", executions=3))
    again = ledger.claim(make_ticket(nonce="n1", executions=3, owner_process="proc_other"))
    assert again.fresh is False
    assert again.record == first.record
    assert ledger.budget(MQ)["executions_left"] == 2
    assert len(ledger.attempts(MQ, "n1")) == 1
    assert ledger.stats(time.time())["claims"] == 1


def test_budget_row_is_taken_from_first_sight_only(ledger: Ledger):
    """The budget row is created from the first claim's ticket; later tickets don't reset it."""
    ledger.claim(make_ticket(nonce="n1", executions=2))
    ledger.claim(make_ticket(nonce="n2", executions=100, max_rows=999))
    budget = ledger.budget(MQ)
    assert budget["executions_left"] == 0
    assert budget["max_rows"] == 10
    with pytest.raises(BudgetExhausted):
        ledger.claim(make_ticket(nonce="n3", executions=100))


@pytest.mark.parametrize("executions", [1, 3])
def test_budget_allows_exactly_n_claims(ledger: Ledger, executions: int):
    """executions=N admits exactly N distinct nonces; the rest are refused and record nothing."""
    fresh, refused = [], []
    for i in range(executions + 5):
        nonce = f"n{i}"
        try:
            claimed = ledger.claim(make_ticket(nonce=nonce, executions=executions))
        except BudgetExhausted:
            refused.append(nonce)
        else:
            assert claimed.fresh
            fresh.append(nonce)
    assert fresh == [f"n{i}" for i in range(executions)]
    assert len(refused) == 5
    for nonce in refused:
        assert ledger.outcome(MQ, nonce) is None
        assert ledger.attempts(MQ, nonce) == []
    assert ledger.budget(MQ)["executions_left"] == 0
    assert ledger.stats(time.time())["claims"] == executions


def test_zero_budget_refusal_records_nothing(ledger: Ledger):
    """A first-sight claim with no executions is refused and leaves no claim and no budget row."""
    with pytest.raises(BudgetExhausted):
        ledger.claim(make_ticket(nonce="n1", executions=0))
    assert ledger.outcome(MQ, "n1") is None
    assert ledger.budget(MQ) is None
    stats = ledger.stats(time.time())
    assert (stats["claims"], stats["attempts"], stats["marques"]) == (0, 0, 0)


def test_claim_with_a_seen_proof_jti_is_refused_and_claims_nothing(ledger: Ledger):
    """A new nonce whose proof jti a claim already recorded is refused: no claim, no spend."""
    ledger.claim(make_ticket(nonce="n1", executions=3, pop_jti="jti-once"))
    with pytest.raises(PopReplayed):
        ledger.claim(make_ticket(nonce="n2", executions=3, pop_jti="jti-once"))
    assert ledger.outcome(MQ, "n2") is None
    assert ledger.budget(MQ)["executions_left"] == 2
    assert ledger.stats(time.time())["claims"] == 1


@pytest.mark.parametrize("with_proof", [True, False])
def test_claims_with_and_without_a_proof_record_the_same(ledger: Ledger, with_proof: bool):
    """A fresh claim records the same attempt and budget whether or not it carries a jti."""
    def ticket(nonce: str, **kwargs: Any) -> ClaimTicket:
        jti = f"jti-{uuid.uuid4().hex}" if with_proof else None
        return make_ticket(nonce=nonce, executions=2, pop_jti=jti, **kwargs)

    now = time.time()
    claimed = ledger.claim(ticket("n1", now=now, lease_seconds=30))
    assert claimed.fresh and ledger.outcome(MQ, "n1") == claimed.record
    assert claimed.record.lease_expires_at == pytest.approx(now + 30)
    assert ledger.budget(MQ)["executions_left"] == 1
    again = ledger.claim(ticket("n1"))
    assert not again.fresh and again.record == claimed.record
    ledger.claim(ticket("n2"))
    with pytest.raises(BudgetExhausted):
        ledger.claim(ticket("n3"))
    assert ledger.outcome(MQ, "n3") is None
    # n1, its replay and n2 recorded their jtis; n3's rolled back with its claim.
    assert ledger.stats(time.time())["pop_jtis"] == (3 if with_proof else 0)


def _messages(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the ledger's psycopg cursors send from now on (PostgreSQL)."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return sent


def test_fresh_claim_is_one_round_trip_on_postgresql(
        ledger: Ledger, engine: LedgerEngine, monkeypatch: pytest.MonkeyPatch):
    """On PostgreSQL a fresh claim is one statement that commits by itself: its jti, claim
    row, budget and attempt all there after one message."""
    if engine.name != "postgres":
        pytest.skip("round trips are PostgreSQL's concern; SQLite runs in process")
    ledger.claim(make_ticket(nonce="warm", executions=5))  # the pool holds a connection
    sent = _messages(monkeypatch)
    claimed = ledger.claim(make_ticket(nonce="n1", executions=5, pop_jti="j-n1"))
    monkeypatch.undo()
    assert claimed.fresh and claimed.record.attempt == 1
    assert len(sent) == 1, sent
    assert ledger.outcome(MQ, "n1") == claimed.record
    assert ledger.budget(MQ)["executions_left"] == 3
    assert ledger.remember_pop_jti("j-n1", time.time() + 60) is False


def test_a_claim_whose_answer_was_lost_is_recognised_as_landed(
        ledger: Ledger, engine: LedgerEngine):
    """PostgreSQL's one-statement claim commits by itself: when its connection dies under it,
    the ledger tells its own fresh claim (that attempt, this process, that start) from one
    that did not land and from another process's claim of the same nonce."""
    if engine.name != "postgres":
        pytest.skip("only PostgreSQL's claim commits in the statement that does the work")
    mine = make_ticket(nonce="n1", now=T0, owner_process="proc_a")
    assert not ledger._claim_landed(mine)  # type: ignore[attr-defined]
    assert ledger.claim(mine).fresh
    assert ledger._claim_landed(mine)  # type: ignore[attr-defined]
    for other in (dataclasses.replace(mine, owner_process="proc_b"),
                  dataclasses.replace(mine, now=T0 + 1)):
        assert not ledger._claim_landed(other)  # type: ignore[attr-defined]


def test_claim_refusals_of_one_statement_leave_nothing(ledger: Ledger):
    """A budget at zero and a seen jti refuse the claim and record nothing of it (the
    one-statement claim of PostgreSQL ends by the budget's CHECK constraint)."""
    ledger.claim(make_ticket(nonce="n1", executions=1, pop_jti="j1"))
    with pytest.raises(BudgetExhausted):
        ledger.claim(make_ticket(nonce="n2", executions=1, pop_jti="j2"))
    with pytest.raises(PopReplayed):
        ledger.claim(make_ticket(nonce="n3", executions=5, pop_jti="j1"))
    assert ledger.outcome(MQ, "n2") is None and ledger.outcome(MQ, "n3") is None
    assert ledger.budget(MQ)["executions_left"] == 0
    assert ledger.remember_pop_jti("j2", time.time() + 60) is True  # rolled back with it
    assert ledger.stats(time.time())["pop_jtis"] == 2


def test_claim_answers_an_applied_replay_behind_where_it_may(
        ledger: Ledger, engine: LedgerEngine, monkeypatch: pytest.MonkeyPatch):
    """With ``replay_behind``, a ledger that answers replays in the claim returns an applied
    nonce's record with nothing durable written (the jti held, then written behind, and
    refused at once the second time); elsewhere the claim records the jti as always."""
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    before = ledger.stats(T0)["pop_jtis"]
    ticket = dataclasses.replace(_with_jti(make_ticket(nonce="done"), "jb"), replay_behind=True)
    sent = _messages(monkeypatch) if engine.name == "postgres" else []
    again = ledger.claim(ticket)
    monkeypatch.undo()
    assert not again.fresh
    assert (again.record.status, again.record.rows_affected) == (Status.APPLIED, 1)
    if ledger.claim_answers_replays:
        assert len(sent) == 1, sent  # one statement, and no COMMIT of a write
        with pytest.raises(PopReplayed):
            ledger.claim(ticket)
        with pytest.raises(PopReplayed):
            ledger.replay(MQ, "done", "jb", T0 + 600)
        deadline = time.monotonic() + 10
        while ledger.stats(T0)["pop_jtis"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ledger.stats(T0)["pop_jtis"] == before + 1
    with pytest.raises(PopReplayed):
        ledger.claim(ticket)


@pytest.mark.parametrize("status", [Status.IN_PROGRESS, Status.ABORTED_NOT_APPLIED])
def test_replay_behind_never_answers_an_unapplied_nonce(ledger: Ledger, status: Status):
    """``replay_behind`` changes nothing for a nonce that is not applied: the jti is
    recorded with the claim, and an aborted nonce starts its next attempt."""
    claim_and_observe(ledger, make_ticket(nonce="n1"),
                      None if status is Status.IN_PROGRESS else status)
    ticket = dataclasses.replace(_with_jti(make_ticket(nonce="n1"), "jx"), replay_behind=True)
    again = ledger.claim(ticket)
    assert again.fresh is (status is Status.ABORTED_NOT_APPLIED)
    assert again.record.attempt == (2 if again.fresh else 1)
    assert ledger.remember_pop_jti("jx", T0 + 600) is False  # recorded durably, at once


def test_claimed_nonce_replays_even_when_budget_is_spent(ledger: Ledger):
    """A retry of a claimed nonce returns its record even after the budget reached zero."""
    first = ledger.claim(make_ticket(nonce="n1", executions=1))
    observe(ledger, "n1", Status.APPLIED, rows_affected=1)
    again = ledger.claim(make_ticket(nonce="n1", executions=1))
    assert again.fresh is False
    assert again.record.attempt == first.record.attempt
    assert again.record.status is Status.APPLIED
    assert again.record.rows_affected == 1
    assert ledger.budget(MQ)["executions_left"] == 0


@pytest.mark.parametrize("status", [Status.IN_PROGRESS, Status.INDETERMINATE, Status.APPLIED])
def test_nonce_not_aborted_is_returned_not_rerun(ledger: Ledger, status: Status):
    """A nonce in_progress, indeterminate or applied is returned as is, never re-attempted."""
    claim_and_observe(
        ledger, make_ticket(nonce="n1"), None if status is Status.IN_PROGRESS else status
    )
    again = ledger.claim(make_ticket(nonce="n1"))
    assert again.fresh is False
    assert again.record.attempt == 1
    assert again.record.status is status
    assert [a.attempt for a in ledger.attempts(MQ, "n1")] == [1]
    assert ledger.budget(MQ)["executions_left"] == 2


def test_aborted_nonce_retries_without_budget_until_attempts_exhausted(ledger: Ledger):
    """An aborted nonce re-attempts without spending budget, up to attempts_per_nonce attempts."""
    ticket = make_ticket(nonce="n1", executions=1, attempts_per_nonce=3)
    first = ledger.claim(ticket)
    assert first.record.attempt == 1
    assert ledger.budget(MQ)["executions_left"] == 0
    for expected_attempt in (2, 3):
        observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, attempt=expected_attempt - 1)
        retry = ledger.claim(make_ticket(nonce="n1", executions=1, attempts_per_nonce=3))
        assert retry.fresh is True
        assert retry.record.attempt == expected_attempt
        assert retry.record.status is Status.IN_PROGRESS
        assert ledger.outcome(MQ, "n1") == retry.record
        assert ledger.budget(MQ)["executions_left"] == 0
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, attempt=3)
    with pytest.raises(AttemptsExhausted):
        ledger.claim(make_ticket(nonce="n1", executions=1, attempts_per_nonce=3))
    attempts = ledger.attempts(MQ, "n1")
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert all(a.status is Status.ABORTED_NOT_APPLIED for a in attempts)
    assert ledger.outcome(MQ, "n1").attempt == 3
    assert ledger.budget(MQ)["executions_left"] == 0
    assert ledger.stats(time.time())["attempts"] == 3


def test_retry_attempt_keeps_earlier_attempts_intact(ledger: Ledger):
    """Starting attempt 2 leaves attempt 1's aborted record and error untouched."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "guard_failed"})
    ledger.claim(make_ticket(nonce="n1", owner_process="proc_B"))
    observe(ledger, "n1", Status.APPLIED, attempt=2, rows_affected=4)
    one, two = ledger.attempts(MQ, "n1")
    assert (one.attempt, one.status, one.error) == (
        1,
        Status.ABORTED_NOT_APPLIED,
        {"code": "guard_failed"},
    )
    assert (two.attempt, two.status, two.rows_affected, two.owner_process) == (
        2,
        Status.APPLIED,
        4,
        "proc_B",
    )
    assert ledger.outcome(MQ, "n1") == two


# -- settlement: compare-and-set on rank ------------------------------------------------


def test_applied_then_indeterminate_stays_applied(ledger: Ledger):
    """A late indeterminate observation does not overwrite applied, its rows or its result."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.APPLIED, rows_affected=3, result={"rows": [[1]]})
    after = observe(
        ledger, "n1", Status.INDETERMINATE, error={"code": "commit_unknown"}, rows_affected=99
    )
    assert after.status is Status.APPLIED
    assert after.rows_affected == 3
    assert after.result == {"rows": [[1]]}
    assert after.error is None
    assert ledger.outcome(MQ, "n1") == after


def test_indeterminate_then_applied_upgrades(ledger: Ledger):
    """Evidence of commit upgrades indeterminate to applied, storing rows and result."""
    ledger.claim(make_ticket(nonce="n1"))
    mid = observe(ledger, "n1", Status.INDETERMINATE, error={"code": "commit_unknown"})
    assert mid.status is Status.INDETERMINATE and mid.settled_at is None
    after = observe(ledger, "n1", Status.APPLIED, rows_affected=2, result={"ok": True}, now=T0)
    assert after.status is Status.APPLIED
    assert (after.rows_affected, after.result) == (2, {"ok": True})
    assert after.settled_at == pytest.approx(T0)
    assert ledger.outcome(MQ, "n1") == after


def test_in_progress_then_aborted(ledger: Ledger):
    """An in_progress attempt settles to aborted_not_applied with its error."""
    ledger.claim(make_ticket(nonce="n1"))
    after = observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "guard_failed"},
                    now=T0)
    assert after.status is Status.ABORTED_NOT_APPLIED
    assert after.error == {"code": "guard_failed"}
    assert after.settled_at == pytest.approx(T0)
    assert ledger.outcome(MQ, "n1") == after


def test_aborted_attempt_never_becomes_applied(ledger: Ledger):
    """An attempt settles once: a late applied observation leaves aborted_not_applied alone."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "commit_unknown"})
    ledger.outbox_ack_all(pending_for(ledger, "n1"), T0)
    after = observe(ledger, "n1", Status.APPLIED, rows_affected=1, cause="reconciliation")
    assert after.status is Status.ABORTED_NOT_APPLIED
    assert after.rows_affected is None
    assert pending_for(ledger, "n1") == []  # nothing new to report: nothing changed
    assert [o["status"] for o in ledger.observations(MQ, "n1")] == [
        "aborted_not_applied", "applied"]  # the late observation is still on record


def test_applied_attempt_never_becomes_aborted(ledger: Ledger):
    """The mirror image: applied is final too."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.INDETERMINATE, error={"code": "commit_unknown"})
    observe(ledger, "n1", Status.APPLIED, rows_affected=1)
    after = observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "late"})
    assert after.status is Status.APPLIED and after.rows_affected == 1


def test_aborted_then_indeterminate_stays_aborted(ledger: Ledger):
    """A weaker indeterminate observation does not overwrite aborted_not_applied."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "guard_failed"})
    after = observe(ledger, "n1", Status.INDETERMINATE, error={"code": "lease_expired"})
    assert after.status is Status.ABORTED_NOT_APPLIED
    assert after.error == {"code": "guard_failed"}


def test_in_progress_observation_changes_nothing(ledger: Ledger):
    """An in_progress observation never moves an attempt (not even an in_progress one)."""
    claimed = ledger.claim(make_ticket(nonce="n1"))
    after = observe(ledger, "n1", Status.IN_PROGRESS, error={"code": "x"})
    assert after == claimed.record
    assert ledger.outbox_pending() == []


def test_equal_rank_observation_does_not_overwrite(ledger: Ledger):
    """A second observation of the same status keeps the first one's error and rows."""
    ledger.claim(make_ticket(nonce="n1"))
    first = observe(
        ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "first"}, rows_affected=0, now=T0
    )
    second = observe(
        ledger,
        "n1",
        Status.ABORTED_NOT_APPLIED,
        error={"code": "second"},
        rows_affected=7,
        now=T0 + 5,
    )
    assert second == first
    assert second.error == {"code": "first"}
    assert second.settled_at == pytest.approx(T0)


def test_observations_log_every_observation(ledger: Ledger):
    """observations() lists every merged observation in order, the rejected ones included."""
    ledger.claim(make_ticket(nonce="n1"))
    steps = [
        (Status.INDETERMINATE, "pilot", T0 + 1),
        (Status.APPLIED, "reconcile", T0 + 2),
        (Status.INDETERMINATE, "late-timeout", T0 + 3),
        (Status.APPLIED, "duplicate", T0 + 4),
    ]
    for status, source, now in steps:
        observe(ledger, "n1", status, cause=source, now=now)
    observed = ledger.observations(MQ, "n1")
    assert [(o["attempt"], o["status"], o["cause"]) for o in observed] == [
        (1, s.value, src) for s, src, _ in steps
    ]
    assert [o["at"] for o in observed] == pytest.approx([now for _, _, now in steps])
    assert ledger.outcome(MQ, "n1").status is Status.APPLIED


def test_settle_unknown_attempt_fails_and_logs_nothing(ledger: Ledger):
    """Settling an attempt that was never claimed raises and leaves no observation behind."""
    ledger.claim(make_ticket(nonce="n1"))
    with pytest.raises(LedgerMissing):
        observe(ledger, "n1", Status.APPLIED, attempt=2, rows_affected=1)
    with pytest.raises(LedgerMissing):
        observe(ledger, "ghost", Status.APPLIED, rows_affected=1)
    assert ledger.observations(MQ, "n1") == []
    assert ledger.observations(MQ, "ghost") == []
    assert ledger.outcome(MQ, "n1").status is Status.IN_PROGRESS
    assert ledger.outbox_pending() == []


def test_stored_result_is_never_cleared(ledger: Ledger):
    """Once applied with rows and result, later observations (any status, None values) keep them."""
    ledger.claim(make_ticket(nonce="n1"))
    result = {"columns": ["id"], "rows": [[1], [2], [3]]}
    observe(ledger, "n1", Status.APPLIED, rows_affected=3, result=result)
    observe(ledger, "n1", Status.APPLIED, rows_affected=None, result=None)
    observe(ledger, "n1", Status.APPLIED, rows_affected=8, result={"other": 1})
    observe(ledger, "n1", Status.INDETERMINATE, rows_affected=None, result=None)
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "x"}, rows_affected=0)
    final = ledger.outcome(MQ, "n1")
    assert final.status is Status.APPLIED
    assert final.rows_affected == 3
    assert final.result == result
    assert final.error is None
    replay = ledger.claim(make_ticket(nonce="n1"))
    assert (replay.fresh, replay.record.rows_affected, replay.record.result) == (False, 3, result)


# -- events ------------------------------------------------------------------------------


def test_events_append_in_order(ledger: Ledger):
    """observe(events=...) appends to the nonce's log in call order, rejected observations too."""
    ledger.claim(make_ticket(nonce="n1"))
    ledger.claim(make_ticket(nonce="n2"))
    observe(ledger, "n2", Status.INDETERMINATE, events=[{"event": "claimed", "nonce": "n2"}])
    observe(ledger, "n1", Status.INDETERMINATE,
           events=[{"event": "claimed"}, {"event": "fence_checked"}])
    observe(ledger, "n1", Status.APPLIED, rows_affected=1, events=[{"event": "committed"}])
    # A rejected (weaker) observation still logs what happened.
    observe(ledger, "n1", Status.INDETERMINATE, events=[{"event": "late_timeout"}])
    assert ledger.events(MQ, "n1") == [
        {"event": "claimed"},
        {"event": "fence_checked"},
        {"event": "committed"},
        {"event": "late_timeout"},
    ]
    assert ledger.events(MQ, "n2") == [{"event": "claimed", "nonce": "n2"}]
    assert ledger.events(MQ, "never") == []
    assert ledger.stats(time.time())["events"] == 5


# -- outbox ------------------------------------------------------------------------------


def test_claim_alone_queues_no_report(ledger: Ledger):
    """An in_progress claim queues nothing in the outbox."""
    ledger.claim(make_ticket(nonce="n1"))
    assert ledger.outbox_pending() == []
    assert ledger.stats(time.time())["unreported_outcomes"] == 0


def test_ack_all_acknowledges_many_but_not_a_report_requeued_since(ledger: Ledger):
    """``outbox_ack_all`` of more reports than one statement takes acknowledges each, except
    one whose status changed after it was read (its new report stays pending)."""
    count = 250
    for i in range(count):
        ledger.claim(make_ticket(nonce=f"n{i}", executions=count))
        observe(ledger, f"n{i}", Status.INDETERMINATE)
    pending = ledger.outbox_pending(limit=10_000)
    assert len(pending) == count
    observe(ledger, "n7", Status.APPLIED, rows_affected=1)  # re-queued as applied
    ledger.outbox_ack_all(pending, T0)
    (left,) = ledger.outbox_pending(limit=10_000)
    assert (left.nonce, left.status) == ("n7", "applied")
    assert ledger.stats(time.time())["unreported_outcomes"] == 1


def test_status_change_queues_report_and_ack_clears_it(ledger: Ledger):
    """A settled status queues a report carrying it; outbox_ack removes it from pending."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.APPLIED, rows_affected=3, cause="pilot")
    (entry,) = ledger.outbox_pending()
    assert (entry.marque_id, entry.nonce, entry.attempt, entry.status) == (MQ, "n1", 1, "applied")
    assert entry.payload["status"] == "applied"
    assert entry.payload["rows_affected"] == 3
    assert entry.payload["attempt"] == 1
    assert entry.payload["pilot"] == {"id": ledger.pilot_id, "incarnation": ledger.incarnation}
    assert entry.tries == 0
    assert ledger.stats(time.time())["unreported_outcomes"] == 1
    ledger.outbox_ack(entry, T0)
    assert ledger.outbox_pending() == []
    assert ledger.stats(time.time())["unreported_outcomes"] == 0


def test_upgrade_requeues_report_with_new_status(ledger: Ledger):
    """indeterminate (acked) then applied re-queues the attempt's report with status applied."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.INDETERMINATE)
    (first,) = ledger.outbox_pending()
    assert first.status == "indeterminate"
    ledger.outbox_ack(first, T0)
    assert ledger.outbox_pending() == []
    observe(ledger, "n1", Status.APPLIED, rows_affected=5)
    (second,) = ledger.outbox_pending()
    assert (second.attempt, second.status) == (1, "applied")
    assert second.payload["status"] == "applied"
    assert second.payload["rows_affected"] == 5
    assert ledger.stats(time.time())["unreported_outcomes"] == 1


def test_rejected_observation_queues_nothing(ledger: Ledger):
    """An observation that does not change the status does not re-queue a report."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.APPLIED, rows_affected=1)
    ack_all(ledger)
    observe(ledger, "n1", Status.INDETERMINATE)
    observe(ledger, "n1", Status.APPLIED, rows_affected=1)
    assert ledger.outbox_pending() == []
    assert ledger.stats(time.time())["unreported_outcomes"] == 0


def test_stale_ack_does_not_ack_newer_status(ledger: Ledger):
    """Acking a report for an old status leaves the newer status's report pending."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.INDETERMINATE)
    (stale,) = ledger.outbox_pending()
    observe(ledger, "n1", Status.APPLIED, rows_affected=2)
    ledger.outbox_ack(stale, T0)
    (current,) = ledger.outbox_pending()
    assert current.status == "applied"
    assert ledger.stats(time.time())["unreported_outcomes"] == 1
    ledger.outbox_ack(current, T0)
    assert ledger.outbox_pending() == []


def test_outbox_failed_counts_tries(ledger: Ledger):
    """outbox_failed increments the entry's tries and leaves it pending."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED, error={"code": "guard_failed"})
    (entry,) = ledger.outbox_pending()
    ledger.outbox_failed(entry)
    ledger.outbox_failed(entry)
    (after,) = ledger.outbox_pending()
    assert after.tries == 2
    assert after.status == "aborted_not_applied"
    assert ledger.stats(time.time())["unreported_outcomes"] == 1


def test_each_attempt_has_its_own_report(ledger: Ledger):
    """Aborted attempt 1 and applied attempt 2 of one nonce are reported separately."""
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.ABORTED_NOT_APPLIED)
    ledger.claim(make_ticket(nonce="n1"))
    observe(ledger, "n1", Status.APPLIED, attempt=2, rows_affected=1)
    assert sorted((e.attempt, e.status) for e in pending_for(ledger, "n1")) == [
        (1, "aborted_not_applied"),
        (2, "applied"),
    ]
    assert ledger.stats(time.time())["unreported_outcomes"] == 2


def test_outbox_pending_respects_limit(ledger: Ledger):
    """outbox_pending(limit) returns at most ``limit`` entries."""
    for i in range(3):
        claim_and_observe(ledger, make_ticket(nonce=f"n{i}"), Status.APPLIED, rows_affected=1)
    assert len(ledger.outbox_pending(limit=2)) == 2
    assert len(ledger.outbox_pending()) == 3


# -- proofs ------------------------------------------------------------------------------


def test_remember_pop_jti_detects_replay(ledger: Ledger):
    """remember_pop_jti is True for a new jti and False when the same jti comes again."""
    assert ledger.remember_pop_jti("jti-1", T0 + 60) is True
    assert ledger.remember_pop_jti("jti-1", T0 + 60) is False
    assert ledger.remember_pop_jti("jti-2", T0 + 60) is True
    assert ledger.stats(T0)["pop_jtis"] == 2


# -- unsettled ---------------------------------------------------------------------------


def test_unsettled_lists_exactly_matching_attempts(ledger: Ledger):
    """unsettled(IN_PROGRESS / INDETERMINATE) lists exactly the attempts in that status."""
    claim_and_observe(ledger, make_ticket(nonce="running"), None)
    claim_and_observe(ledger, make_ticket(nonce="lost"), Status.INDETERMINATE)
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    claim_and_observe(ledger, make_ticket("mq_other", nonce="failed"), Status.ABORTED_NOT_APPLIED)
    ledger.claim(make_ticket("mq_other", nonce="failed"))  # attempt 2, in_progress

    def keys(status: Status) -> set[tuple[str, str, int]]:
        records = ledger.unsettled(status)
        assert all(r.status is status for r in records)
        return {(r.marque_id, r.nonce, r.attempt) for r in records}

    assert keys(Status.IN_PROGRESS) == {(MQ, "running", 1), ("mq_other", "failed", 2)}
    assert keys(Status.INDETERMINATE) == {(MQ, "lost", 1)}
    observe(ledger, "lost", Status.APPLIED, rows_affected=1)
    assert keys(Status.INDETERMINATE) == set()


# -- reaping -----------------------------------------------------------------------------


def _expired_ticket(marque_id: str, nonce: str, **kwargs: Any) -> ClaimTicket:
    return make_ticket(marque_id, nonce, expires_at=T0 + 100, now=T0, **kwargs)


def _live_ticket(marque_id: str, nonce: str, **kwargs: Any) -> ClaimTicket:
    return make_ticket(marque_id, nonce, expires_at=T0 + 100_000, now=T0, **kwargs)


def test_reap_deletes_settled_acked_entries_of_expired_marques(ledger: Ledger):
    """Reap deletes an expired marque's settled, acked entries and keeps a live marque's."""
    for nonce, status in (("a", Status.APPLIED), ("b", Status.ABORTED_NOT_APPLIED)):
        claim_and_observe(
            ledger,
            _expired_ticket("mq_old", nonce),
            status,
            rows_affected=1,
            events=[{"event": "committed"}],
        )
    claim_and_observe(
        ledger,
        _live_ticket("mq_live", "c"),
        Status.APPLIED,
        rows_affected=1,
        events=[{"event": "committed"}],
    )
    ack_all(ledger)
    now = T0 + 1000
    before = ledger.stats(now)
    assert (before["marques"], before["live_marques"], before["claims"]) == (2, 1, 3)
    assert before["reapable_marques"] == 1

    counts = ledger.reap(now)

    assert counts["marques"] == 1
    assert counts["claims"] == 2 and counts["attempts"] == 2 and counts["budgets"] == 1
    assert counts["events"] == 2 and counts["outbox"] == 2
    for nonce in ("a", "b"):
        assert ledger.outcome("mq_old", nonce) is None
        assert ledger.attempts("mq_old", nonce) == []
        assert ledger.events("mq_old", nonce) == []
        assert ledger.observations("mq_old", nonce) == []
    assert ledger.budget("mq_old") is None
    after = ledger.stats(now)
    assert (after["marques"], after["claims"], after["attempts"], after["events"]) == (1, 1, 1, 1)
    assert after["reapable_marques"] == 0
    # The live marque is untouched.
    assert ledger.outcome("mq_live", "c").status is Status.APPLIED
    assert ledger.events("mq_live", "c") == [{"event": "committed"}]
    assert ledger.budget("mq_live")["executions_left"] == 2
    # Reaping again removes nothing more.
    assert ledger.reap(now)["marques"] == 0
    assert ledger.stats(now)["claims"] == 1


def test_reap_keeps_marque_before_expiry(ledger: Ledger):
    """A settled, acked marque is not reaped while ``now`` is before its expiry."""
    claim_and_observe(ledger, _expired_ticket("mq_old", "a"), Status.APPLIED, rows_affected=1)
    ack_all(ledger)
    assert ledger.reap(T0 + 50)["marques"] == 0
    assert ledger.outcome("mq_old", "a") is not None
    assert ledger.reap(T0 + 101)["marques"] == 1
    assert ledger.outcome("mq_old", "a") is None


@pytest.mark.parametrize("status", [None, Status.INDETERMINATE])
def test_reap_keeps_expired_marque_with_unsettled_attempt(ledger: Ledger, status: Status | None):
    """An expired marque with an in_progress or indeterminate attempt is not reaped."""
    claim_and_observe(ledger, _expired_ticket("mq_old", "done"), Status.APPLIED, rows_affected=1)
    claim_and_observe(ledger, _expired_ticket("mq_old", "open"), status)
    ack_all(ledger)
    now = T0 + 1000
    counts = ledger.reap(now)
    assert counts["marques"] == 0 and counts["claims"] == 0
    assert ledger.outcome("mq_old", "done").status is Status.APPLIED
    expected = Status.IN_PROGRESS if status is None else status
    assert ledger.outcome("mq_old", "open").status is expected
    assert ledger.budget("mq_old") is not None
    assert ledger.stats(now)["claims"] == 2


def test_reap_keeps_expired_marque_with_unacked_report(ledger: Ledger):
    """An expired, settled marque whose report is not acknowledged is not reaped until acked."""
    claim_and_observe(ledger, _expired_ticket("mq_old", "a"), Status.APPLIED, rows_affected=1)
    claim_and_observe(ledger, _expired_ticket("mq_old", "b"), Status.APPLIED, rows_affected=1)
    (entry_a,) = pending_for(ledger, "a", "mq_old")
    ledger.outbox_ack(entry_a, T0)
    now = T0 + 1000
    assert ledger.reap(now)["marques"] == 0
    assert ledger.outcome("mq_old", "a") is not None
    assert len(pending_for(ledger, "b", "mq_old")) == 1
    assert ledger.stats(now)["claims"] == 2
    ack_all(ledger)
    assert ledger.reap(now)["marques"] == 1
    assert ledger.stats(now)["claims"] == 0


def test_reap_forgets_old_pop_jtis(ledger: Ledger):
    """Reap deletes pop jtis past forget_after and keeps the rest."""
    ledger.remember_pop_jti("old", T0 + 10)
    ledger.remember_pop_jti("new", T0 + 10_000)
    counts = ledger.reap(T0 + 100)
    assert counts["pop_jtis"] == 1
    assert ledger.stats(T0 + 100)["pop_jtis"] == 1
    assert ledger.remember_pop_jti("new", T0 + 10_000) is False
    assert ledger.remember_pop_jti("old", T0 + 10_000) is True


# -- stats -------------------------------------------------------------------------------


def test_stats_counts(ledger: Ledger):
    """stats() counts marques, live marques, claims, attempts by status, events, reports, size."""
    claim_and_observe(ledger, _expired_ticket("mq_old", "a"), Status.APPLIED, rows_affected=1)
    claim_and_observe(ledger, _live_ticket("mq_live", "b"), Status.INDETERMINATE)
    claim_and_observe(ledger, _live_ticket("mq_live", "c"), Status.ABORTED_NOT_APPLIED)
    ledger.claim(_live_ticket("mq_live", "c"))  # attempt 2, in_progress
    ledger.claim(_live_ticket("mq_live", "d"))
    # An in_progress observation changes nothing but still logs its events.
    ledger.observe("mq_live", "d", 1, Status.IN_PROGRESS, now=T0, cause="test",
                   events=[{"event": "claimed"}, {"event": "fence_checked"}])
    ledger.remember_pop_jti("j", T0 + 10)
    (old_report,) = pending_for(ledger, "a", "mq_old")
    ledger.outbox_ack(old_report, T0)

    stats = ledger.stats(T0 + 1000)
    assert stats["pilot_id"] == "pilot-test"
    assert stats["incarnation"] == ledger.incarnation
    assert stats["marques"] == 2
    assert stats["live_marques"] == 1
    assert stats["claims"] == 4
    assert stats["attempts"] == 5
    assert stats["attempts_by_status"] == {
        "in_progress": 2,
        "indeterminate": 1,
        "aborted_not_applied": 1,
        "applied": 1,
    }
    assert stats["events"] == 2
    assert stats["unreported_outcomes"] == 2  # b indeterminate, c#1 aborted
    assert stats["pop_jtis"] == 1
    assert stats["reapable_marques"] == 1
    assert stats["size_bytes"] > 0
    # Before mq_old expires, both marques are live.
    assert ledger.stats(T0)["live_marques"] == 2


def test_stats_of_empty_ledger(ledger: Ledger):
    """A new ledger's stats are all zero except its size."""
    stats = ledger.stats(time.time())
    for key in ("marques", "live_marques", "claims", "attempts", "events", "unreported_outcomes"):
        assert stats[key] == 0, key
    assert set(stats["attempts_by_status"].values()) == {0}
    assert stats["size_bytes"] > 0


# -- concurrency -------------------------------------------------------------------------

THREADS = 16


def _race(handles: list[Ledger], tickets: list[ClaimTicket]) -> tuple[list[Claim], list[Exception]]:
    """Claim every ticket from its own thread (round-robin over ``handles``), all at once."""
    barrier = threading.Barrier(len(tickets))
    claims: list[Claim] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        handle = handles[index % len(handles)]
        barrier.wait()
        try:
            claimed = handle.claim(tickets[index])
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            with lock:
                errors.append(exc)
        else:
            with lock:
                claims.append(claimed)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tickets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a claim thread hung"
    return claims, errors


def _assert_distinct_nonce_race(
    handles: list[Ledger], claims: list[Claim], errors: list[Exception], executions: int
) -> None:
    assert len(claims) + len(errors) == THREADS
    assert all(c.fresh for c in claims)
    assert len(claims) == executions
    assert all(isinstance(e, BudgetExhausted) for e in errors), errors
    for handle in handles:
        assert handle.budget(MQ)["executions_left"] == 0
        assert handle.stats(time.time())["claims"] == executions
        claimed = {c.record.nonce for c in claims}
        for i in range(THREADS):
            recorded = handle.outcome(MQ, f"n{i}")
            assert (recorded is not None) == (f"n{i}" in claimed)


def _assert_same_nonce_race(handles: list[Ledger], claims: list[Claim], errors: list[Exception]):
    assert errors == []
    assert len(claims) == THREADS
    assert sum(c.fresh for c in claims) == 1
    assert {(c.record.attempt, c.record.started_at) for c in claims} == {
        (claims[0].record.attempt, claims[0].record.started_at)
    }
    for handle in handles:
        assert [a.attempt for a in handle.attempts(MQ, "same")] == [1]
        assert handle.budget(MQ)["executions_left"] == 4


def test_threads_claiming_distinct_nonces_spend_budget_exactly(ledger: Ledger):
    """16 threads claiming distinct nonces of a 5-execution marque: exactly 5 fresh claims."""
    tickets = [make_ticket(nonce=f"n{i}", executions=5) for i in range(THREADS)]
    claims, errors = _race([ledger], tickets)
    _assert_distinct_nonce_race([ledger], claims, errors, executions=5)


def test_threads_claiming_same_nonce_get_one_fresh(ledger: Ledger):
    """16 threads claiming the same nonce: exactly one fresh claim, one attempt, one spend."""
    tickets = [make_ticket(nonce="same", executions=5, owner_process=f"proc_{i}")
               for i in range(THREADS)]
    claims, errors = _race([ledger], tickets)
    _assert_same_nonce_race([ledger], claims, errors)


def test_two_handles_claiming_distinct_nonces_spend_budget_exactly(
    pool: LedgerPool, ledger: Ledger, ledger_location: str
):
    """Two independent handles (two processes) racing on distinct nonces: exactly N fresh claims."""
    second = pool.open_second(ledger_location)
    assert second.incarnation == ledger.incarnation
    tickets = [make_ticket(nonce=f"n{i}", executions=5) for i in range(THREADS)]
    claims, errors = _race([ledger, second], tickets)
    _assert_distinct_nonce_race([ledger, second], claims, errors, executions=5)


def test_two_handles_claiming_same_nonce_get_one_fresh(
    pool: LedgerPool, ledger: Ledger, ledger_location: str
):
    """Two independent handles (two processes) racing on one nonce: exactly one fresh claim."""
    second = pool.open_second(ledger_location)
    tickets = [make_ticket(nonce="same", executions=5, owner_process=f"proc_{i}")
               for i in range(THREADS)]
    claims, errors = _race([ledger, second], tickets)
    _assert_same_nonce_race([ledger, second], claims, errors)


# -- property: settlement is a monotonic merge ------------------------------------------------

OBSERVABLE = [Status.INDETERMINATE, Status.ABORTED_NOT_APPLIED, Status.APPLIED]

observation = st.tuples(
    st.sampled_from(OBSERVABLE), st.none() | st.integers(min_value=0, max_value=1_000_000)
)


def _apply(ledger: Ledger, nonce: str, sequence: list[tuple[Status, int | None]]) -> Any:
    ledger.claim(make_ticket(nonce=nonce, executions=1_000_000, now=T0))
    record = None
    for index, (status, rows) in enumerate(sequence):
        record = observe(
            ledger,
            nonce,
            status,
            now=T0 + index,
            cause=f"obs{index}",
            rows_affected=rows,
            result={"obs": index} if status is Status.APPLIED else None,
            error=None if status is Status.APPLIED else {"obs": index},
        )
    return record


@settings(max_examples=50, deadline=None)
@given(data=st.data(), sequence=st.lists(observation, min_size=1, max_size=8))
def test_settlement_is_monotonic_merge(
    shared_ledger: Ledger, data: st.DataObject, sequence: list[tuple[Status, int | None]]
):
    """Observations advance an attempt by rank until one settles it; settled is final."""
    permuted = data.draw(st.permutations(sequence), label="permuted")
    # One ledger per engine for every example; each example uses nonces of its own.
    ledger = shared_ledger
    original, permuted_nonce = f"original-{uuid.uuid4().hex}", f"permuted-{uuid.uuid4().hex}"
    final = _apply(ledger, original, sequence)
    reordered = _apply(ledger, permuted_nonce, permuted)

    expected = reduce(advance, (s for s, _ in sequence), Status.IN_PROGRESS)
    assert final.status is expected
    assert ledger.outcome(MQ, original) == final
    assert reordered.status is reduce(advance, (s for s, _ in permuted), Status.IN_PROGRESS)

    # The write that reached the final status is kept: a later observation of the
    # same or a weaker status never overwrites its rows, result or error.
    first_index = next(i for i, (s, _) in enumerate(sequence) if s is expected)
    first_rows = sequence[first_index][1]
    if first_rows is not None:
        assert final.rows_affected == first_rows
    if expected is Status.APPLIED:
        assert final.result == {"obs": first_index}
        assert final.error is None
    else:
        assert final.error == {"obs": first_index}
    assert final.settled_at == (
        pytest.approx(T0 + first_index) if expected.settled else None
    )

    # Every observation is logged, accepted or not.
    assert [o["status"] for o in ledger.observations(MQ, original)] == [
        s.value for s, _ in sequence
    ]
    # The outbox holds exactly one pending report per attempt, with the final status.
    (report,) = pending_for(ledger, original)
    assert report.status == expected.value



@pytest.mark.parametrize("expired_share", [1.0, 0.3], ids=["mostly_free", "partly_free"])
def test_reap_returns_the_space_to_the_live_set(
    engine: LedgerEngine, pool: LedgerPool, monkeypatch: pytest.MonkeyPatch, expired_share: float
) -> None:
    """After reaping expired, settled, reported entries the SQLite file shrinks to the live set.

    A mostly free file is rebuilt (VACUUM); a partly free one gives its pages
    back in chunks, one transaction each — here many small ones, which must
    still give back every free page.
    """
    if engine.name != "sqlite":
        pytest.skip("PostgreSQL returns space through autovacuum, not through reap")
    monkeypatch.setattr("marque.ledger.sqlite.COMPACT_PAGES", 8)
    ledger = pool.create()
    empty = ledger.stats(T0)["size_bytes"]
    total, expired = 3000, int(3000 * expired_share)
    for i in range(total):
        expires_at = T0 + 1 if i < expired else T0 + 10**6
        ticket = make_ticket(f"mq_{i}", nonce="n", executions=1, expires_at=expires_at, now=T0)
        ledger.claim(ticket)
        observe(ledger, "n", Status.APPLIED, now=T0, cause="t", rows_affected=1,
               marque_id=f"mq_{i}", events=[{"event": "x", "pad": "p" * 200}] * 5)
    while pending := ledger.outbox_pending(limit=1000):
        ledger.outbox_ack_all(pending, T0)
    full = ledger.stats(T0)["size_bytes"]

    counts = ledger.reap(T0 + 10)

    assert counts["marques"] == expired and counts["claims"] == expired
    after = ledger.stats(T0 + 10)
    assert after["claims"] == total - expired
    live_share = (total - expired) / total
    # Back to the live set: the reaped share of the entries is gone from the file.
    assert after["size_bytes"] <= empty + full * (live_share + 0.15)
    freelist = ledger._conn.execute("PRAGMA freelist_count").fetchone()[0]  # type: ignore[attr-defined]
    assert freelist == 0


# -- replays of applied nonces: answered from a read, jti written behind -----------


def _with_jti(ticket: ClaimTicket, jti: str) -> ClaimTicket:
    return dataclasses.replace(ticket, pop_jti=jti, pop_forget_after=ticket.now + 600)


def test_replay_answers_only_an_applied_nonce(ledger: Ledger):
    """``replay`` returns the applied attempt; unknown, in-progress or aborted nonces are None."""
    assert ledger.replay(MQ, "unknown", "j0", T0 + 600) is None
    claim_and_observe(ledger, make_ticket(nonce="running"), None)
    assert ledger.replay(MQ, "running", "j1", T0 + 600) is None
    claim_and_observe(ledger, make_ticket(nonce="aborted"), Status.ABORTED_NOT_APPLIED)
    assert ledger.replay(MQ, "aborted", "j2", T0 + 600) is None
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    record = ledger.replay(MQ, "done", "j3", T0 + 600)
    assert record is not None
    assert (record.status, record.rows_affected, record.attempt) == (Status.APPLIED, 1, 1)
    # A refused (None) replay held no jti: the claim path may still record it.
    assert ledger.remember_pop_jti("j1", T0 + 600) is True


def test_replay_refuses_its_jti_at_once_and_after_the_write(ledger: Ledger):
    """The same proof twice is PopReplayed, before and after its jti reaches the table."""
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    assert ledger.replay(MQ, "done", "jr", T0 + 600) is not None
    with pytest.raises(PopReplayed):
        ledger.replay(MQ, "done", "jr", T0 + 600)
    with pytest.raises(PopReplayed):  # nor may the claim path take it
        ledger.claim(_with_jti(make_ticket(nonce="other"), "jr"))
    assert ledger.outcome(MQ, "other") is None
    deadline = time.monotonic() + 10
    while ledger.stats(T0)["pop_jtis"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ledger.stats(T0)["pop_jtis"] == 1  # written behind, without any further call
    assert ledger.remember_pop_jti("jr", T0 + 600) is False
    with pytest.raises(PopReplayed):
        ledger.replay(MQ, "done", "jr", T0 + 600)


def test_replay_refuses_a_jti_the_claim_recorded(ledger: Ledger):
    """A proof that claimed the nonce cannot be replayed once the nonce is applied."""
    ticket = _with_jti(make_ticket(nonce="done"), "jc")
    claim_and_observe(ledger, ticket, Status.APPLIED, rows_affected=1)
    with pytest.raises(PopReplayed):
        ledger.replay(MQ, "done", "jc", T0 + 600)


def test_replay_jtis_survive_close_and_reopen(
    pool: LedgerPool, ledger: Ledger, ledger_location: str
):
    """Closing the ledger writes every held jti: a restart does not reopen those proofs."""
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    for index in range(50):
        assert ledger.replay(MQ, "done", f"jz{index}", T0 + 600) is not None
    ledger.close()
    reopened = pool.open(ledger_location)
    assert reopened.stats(T0)["pop_jtis"] == 50
    for index in (0, 49):
        with pytest.raises(PopReplayed):
            reopened.replay(MQ, "done", f"jz{index}", T0 + 600)


def test_concurrent_replays_of_one_proof_admit_one(ledger: Ledger):
    """Eight threads replaying one proof at once: exactly one answer, seven PopReplayed."""
    claim_and_observe(ledger, make_ticket(nonce="done"), Status.APPLIED, rows_affected=1)
    barrier = threading.Barrier(8)
    results: list[str] = []

    def replay() -> None:
        barrier.wait()
        try:
            ledger.replay(MQ, "done", "jsame", T0 + 600)
            results.append("answered")
        except PopReplayed:
            results.append("refused")

    threads = [threading.Thread(target=replay) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["answered"] + ["refused"] * 7


# -- upgrading a ledger made by an older Marque ---------------------------------------------

# The whole schema of ledger version 1, exactly as released (MIGRATIONS[0] up to 7d99a85):
# frozen here, so a later edit of that migration cannot make this test pass by accident.
LEDGER_V1 = [
    """CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL)""",
    """CREATE TABLE budgets (
        marque_id TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        executions_left INTEGER NOT NULL CHECK (executions_left >= 0),
        max_rows BIGINT NOT NULL,
        attempts_per_nonce INTEGER NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX budgets_expiry ON budgets (expires_at)",
    """CREATE TABLE claims (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        claimed_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce))""",
    """CREATE TABLE attempts (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        status_rank INTEGER NOT NULL,
        rows_affected BIGINT,
        error TEXT,
        result TEXT,
        owner_incarnation TEXT NOT NULL,
        owner_run TEXT NOT NULL,
        lease_expires_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        settled_at DOUBLE PRECISION,
        PRIMARY KEY (marque_id, nonce, attempt))""",
    "CREATE INDEX attempts_unsettled ON attempts (status_rank) WHERE status_rank < 3",
    """CREATE TABLE observations (
        id TEXT PRIMARY KEY,
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        source TEXT NOT NULL,
        detail TEXT,
        observed_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX observations_nonce ON observations (marque_id, nonce, observed_at)",
    """CREATE TABLE events (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (marque_id, nonce, seq))""",
    """CREATE TABLE outbox (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        payload TEXT NOT NULL,
        tries INTEGER NOT NULL DEFAULT 0,
        queued_at DOUBLE PRECISION NOT NULL,
        acked_at DOUBLE PRECISION,
        PRIMARY KEY (marque_id, nonce, attempt))""",
    "CREATE INDEX outbox_unacked ON outbox (queued_at) WHERE acked_at IS NULL",
    """CREATE TABLE pop_jtis (
        jti TEXT PRIMARY KEY,
        forget_after DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX pop_jtis_forget ON pop_jtis (forget_after)",
]
V1_INCARNATION = "inc_" + "1" * 32


def _v1_history(now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """What a version-1 Pilot left: identity, a marque with one applied nonce, reported."""
    payload = ('{"attempt":1,"error":null,"marque_id":"mq_test","nonce":"old-1",'
               '"rows_affected":1,"status":"applied"}')
    return [
        ("INSERT INTO meta (key, value) VALUES (?, ?)", ("schema_version", "1")),
        ("INSERT INTO meta (key, value) VALUES (?, ?)", ("pilot_id", "pilot-v1")),
        ("INSERT INTO meta (key, value) VALUES (?, ?)", ("incarnation", V1_INCARNATION)),
        ("INSERT INTO meta (key, value) VALUES (?, ?)", ("created_at", repr(now - 60))),
        ("INSERT INTO budgets VALUES (?, ?, ?, ?, ?, ?)", (MQ, "bank", 2, 10, 3, now + 600)),
        ("INSERT INTO claims VALUES (?, ?, ?, ?)", (MQ, "old-1", 1, now - 30)),
        ("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
         (MQ, "old-1", 1, "applied", Status.APPLIED.rank, 1, None,
          '{"columns":["n"],"rows":[[1]]}', V1_INCARNATION, "run_old", now, now - 30,
          now - 29)),
        ("INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
         ("obs1", MQ, "old-1", 1, "applied", "execution",
          '{"error":null,"rows_affected":1}', now - 29)),
        ("INSERT INTO events VALUES (?, ?, ?, ?)",
         (MQ, "old-1", 1, '[{"event":"claimed","attempt":1},{"event":"committed","attempt":1}]')),
        ("INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
         (MQ, "old-1", 1, "applied", payload, 1, now - 29, now - 28)),
        ("INSERT INTO pop_jtis VALUES (?, ?)", ("jti-old", now + 300)),
    ]


def _build_v1(engine: LedgerEngine, location: str, now: float) -> None:
    """A version-1 ledger at ``location``, written with the engine's plain driver."""
    write_plain(engine, location, [(s, ()) for s in LEDGER_V1] + _v1_history(now))


def write_plain(engine: LedgerEngine, location: str,
                statements: list[tuple[str, tuple[Any, ...]]],
                sqlite_pragmas: tuple[str, ...] = ()) -> None:
    """Run ``statements`` (``?`` placeholders) at ``location`` in one transaction, with the
    engine's plain driver (no Marque code): how an older Marque's ledger is made."""
    if engine.name == "sqlite":
        import sqlite3

        conn = sqlite3.connect(location, isolation_level=None)
        try:
            for pragma in (*sqlite_pragmas, "PRAGMA journal_mode = WAL"):
                conn.execute(pragma)
            conn.execute("BEGIN")
            for sql, params in statements:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return
    import psycopg

    from marque.ledger.postgres import SCHEMA

    with psycopg.connect(location) as pg:
        pg.execute(f"CREATE SCHEMA {SCHEMA}")
        pg.execute(f"SET search_path TO {SCHEMA}")
        for sql, params in statements:
            pg.execute(sql.replace("?", "%s"), params or None)


def _schema_of(engine: LedgerEngine, location: str) -> dict[str, Any]:
    """Tables with their columns, index names (and on SQLite which tables are WITHOUT
    ROWID), as the engine's catalogue lists them."""
    if engine.name == "sqlite":
        import sqlite3

        conn = sqlite3.connect(location)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            columns = {t: sorted((c[1], c[2].upper(), c[3])
                                 for c in conn.execute(f"PRAGMA table_info({t})"))
                       for t in tables}
            indexes = sorted(r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))
            # How each table is stored (migration 7 rebuilds some WITHOUT ROWID).
            rowless = sorted(name for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table'")
                if sql.upper().rstrip().endswith("WITHOUT ROWID"))
        finally:
            conn.close()
        return {"columns": columns, "indexes": indexes, "rowless": rowless}
    import psycopg

    from marque.ledger.postgres import SCHEMA

    with psycopg.connect(location) as pg:
        rows = pg.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM "
            "information_schema.columns WHERE table_schema = %s", (SCHEMA,)).fetchall()
        indexes = sorted(r[0] for r in pg.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (SCHEMA,)))
    columns: dict[str, list[Any]] = {}
    for table, column, data_type, nullable in rows:
        columns.setdefault(table, []).append((column, data_type, nullable))
    return {"columns": {t: sorted(c) for t, c in columns.items()}, "indexes": indexes}


def test_a_version_1_ledger_is_upgraded_and_keeps_its_history(
    engine: LedgerEngine, pool: LedgerPool
):
    """A ledger made by schema version 1 opens at the current version with its history intact."""
    from marque.ledger.schema import MIGRATIONS

    now = time.time()
    location = pool.location()
    _build_v1(engine, location, now)

    upgraded = pool.open(location)

    assert upgraded.schema_version == len(MIGRATIONS)
    assert (upgraded.pilot_id, upgraded.incarnation) == ("pilot-v1", V1_INCARNATION)
    old = upgraded.outcome(MQ, "old-1")
    assert old is not None
    assert (old.status, old.attempt, old.rows_affected) == (Status.APPLIED, 1, 1)
    assert old.result == {"columns": ["n"], "rows": [[1]]}
    assert [e["event"] for e in upgraded.events(MQ, "old-1")] == ["claimed", "committed"]
    assert upgraded.outbox_pending() == []
    # The old nonce replays; a new one spends the budget the version-1 ledger left (2 → 1).
    again = upgraded.claim(make_ticket(nonce="old-1", now=now))
    assert not again.fresh and again.record.status is Status.APPLIED
    fresh = upgraded.claim(make_ticket(nonce="new-1", now=now))
    assert fresh.fresh and fresh.record.attempt == 1
    observe(upgraded, "new-1", Status.APPLIED, rows_affected=1, now=now)
    stats = upgraded.stats(now)
    assert (stats["schema_version"], stats["claims"], stats["pop_jtis"]) == (
        len(MIGRATIONS), 2, 1)
    assert upgraded.budget(MQ)["executions_left"] == 1
    assert upgraded.remember_pop_jti("jti-old", now + 300) is False  # still remembered
    upgraded.close()

    # Upgraded in place, to exactly the schema a new ledger gets; reopening changes nothing.
    assert pool.open(location).schema_version == len(MIGRATIONS)
    new_location = pool.location()
    pool.create(new_location)
    assert _schema_of(engine, location) == _schema_of(engine, new_location)


# -- observe_all: many observations, one statement per table --------------------------


def test_observe_all_matches_observing_one_by_one(pool: LedgerPool):
    """``observe_all`` over eleven nonces (a batch of eight, then one of three) leaves
    exactly what observing each in turn leaves: attempts, observations, events, reports."""
    batched, single = pool.create(), pool.create()
    plans: list[tuple[str, Status | None, Status, dict[str, Any]]] = [
        (f"n{i}", None, Status.APPLIED, {"rows_affected": i, "events": [{"event": "e", "i": i}]})
        for i in range(7)
    ]
    plans += [
        ("weaker", Status.APPLIED, Status.INDETERMINATE, {"events": [{"event": "late"}]}),
        ("unknown", None, Status.INDETERMINATE,
         {"error": {"code": "commit_unknown"}, "events": [{"event": "x"}]}),
        ("read", None, Status.APPLIED, {"rows_affected": 2, "result": {"rows": [[1], [2]]}}),
        ("aborted", None, Status.ABORTED_NOT_APPLIED, {"error": {"code": "guard"}}),
    ]
    for ledger in (batched, single):
        for nonce, before, _, _ in plans:
            ledger.claim(make_ticket(nonce=nonce, executions=100, now=T0))
            if before is not None:
                observe(ledger, nonce, before, rows_affected=9, now=T0)
    items = [Observed(MQ, nonce, 1, status, now=T0 + 1, cause="settle", **kwargs)
             for nonce, _, status, kwargs in plans]
    records = batched.observe_all(items)
    expected = [single.observe(MQ, item.nonce, 1, item.status, now=item.now, cause=item.cause,
                               rows_affected=item.rows_affected, error=item.error,
                               result=item.result, events=item.events) for item in items]

    def same(records: list[Any]) -> list[Any]:  # two ledgers, two incarnations
        return [dataclasses.replace(r, owner_incarnation="") for r in records]

    assert same(records) == same(expected)
    for nonce, *_ in plans:
        assert same(batched.attempts(MQ, nonce)) == same(single.attempts(MQ, nonce))
        assert batched.events(MQ, nonce) == single.events(MQ, nonce)
        assert batched.observations(MQ, nonce) == single.observations(MQ, nonce)

    def reports(ledger: Ledger) -> list[tuple[Any, ...]]:
        return sorted((e.nonce, e.status, e.payload["rows_affected"], e.payload["cause"])
                      for e in ledger.outbox_pending(limit=100))

    assert reports(batched) == reports(single)
    assert ("weaker", "indeterminate") not in {r[:2] for r in reports(batched)}


def test_observe_all_of_a_missing_attempt_records_nothing(ledger: Ledger):
    """One item naming no attempt fails the whole batch: none of its observations land."""
    for nonce in ("a", "b"):
        ledger.claim(make_ticket(nonce=nonce, now=T0))
    items = [Observed(MQ, nonce, 1, Status.APPLIED, now=T0, cause="settle", rows_affected=1,
                      events=[{"event": "e"}]) for nonce in ("a", "ghost", "b", "c")]
    ledger.claim(make_ticket(nonce="c", now=T0))
    with pytest.raises(LedgerMissing):
        ledger.observe_all(items)
    for nonce in ("a", "b", "c"):
        assert ledger.outcome(MQ, nonce).status is Status.IN_PROGRESS
        assert ledger.observations(MQ, nonce) == [] and ledger.events(MQ, nonce) == []
    assert ledger.outbox_pending() == []
