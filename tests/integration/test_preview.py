"""Previews and evidence (DESIGN §10) on a real Pilot home over a real SQLite bank."""

from __future__ import annotations

from typing import Any

import pytest

from marque.cid import cid
from marque.errors import (
    ConfigInvalid,
    MarqueError,
    MarqueExpired,
    MarqueInvalid,
    PopReplayed,
    PreviewFailed,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.pilot.config import PilotConfig
from marque.pilot.evidence import marque_evidence
from marque.pilot.preview import run_preview
from marque.token import (
    Budget,
    Change,
    Statement,
    issue_marque,
    new_key,
)
from marque.token.service_tokens import PreviewGrant, issue_preview_token, issue_query_token

from .conftest import Env, marque_id_of

DEBIT_ALL = "UPDATE accounts SET balance = balance - 10"
START = {1: 100, 2: 100, 3: 100}


def change(*sql: str) -> Change:
    return Change(tuple(Statement(s) for s in sql))


def preview_token(env: Env, *sql: str, issuer_key: dict[str, Any] | None = None,
                  now: float | None = None, **kw: Any) -> str:
    args: dict[str, Any] = {"pilot_id": env.pilot.pilot_id,
                            "incarnation": env.pilot.incarnation, "target": "bank", **kw}
    return issue_preview_token(issuer_key or env.issuer,
                               PreviewGrant(change=change(*sql), **args), now=now)


def nothing_claimed(env: Env) -> bool:
    stats = env.pilot.ledger.stats(env.pilot.clock())
    return (stats["marques"], stats["claims"], stats["attempts"]) == (0, 0, 0) and \
        env.stamps() == []


def test_rollback_preview_counts_exact_rows_and_leaves_the_target_unchanged(env: Env) -> None:
    """A rollback preview of an UPDATE reports the rows it touched, then rolls everything back."""
    result = run_preview(env.pilot, preview_token(env, DEBIT_ALL, max_rows=5))
    assert result["mode"] == "rollback"
    assert [s["rows"] for s in result["statements"]] == [3]
    assert result["total_rows"] == 3 and result["within_max_rows"] is True
    assert env.balances() == START
    assert nothing_claimed(env)
    assert result["preview_cid"] == cid(result, exclude="preview_cid")
    assert result["change_cid"] == change(DEBIT_ALL).change_cid
    assert result["pilot"] == {"id": env.pilot.pilot_id, "incarnation": env.pilot.incarnation}


def test_preview_samples_select_and_returning_rows(env: Env) -> None:
    """SELECT and RETURNING statements give their exact row count and up to sample_rows rows."""
    result = run_preview(env.pilot, preview_token(
        env, "SELECT id, balance FROM accounts ORDER BY id",
        "UPDATE accounts SET balance = 0 WHERE id >= 2 RETURNING id, balance", sample_rows=1))
    select, returning = result["statements"]
    assert select["rows"] == 3
    assert select["sample"] == {"columns": ["id", "balance"], "rows": [[1, 100]]}
    assert returning["rows"] == 2
    assert returning["sample"]["columns"] == ["id", "balance"]
    assert len(returning["sample"]["rows"]) == 1 and returning["sample"]["rows"][0][1] == 0
    assert env.balances() == START


def test_explain_mode_executes_nothing_and_reports_a_plan(env: Env) -> None:
    """Under mode explain the statement is only planned: rows null, a plan, nothing changed."""
    result = run_preview(env.pilot, preview_token(env, DEBIT_ALL), modes={"bank": "explain"})
    (statement,) = result["statements"]
    assert result["mode"] == "explain"
    assert statement["rows"] is None and statement["plan"]
    assert result["total_rows"] is None and result["within_max_rows"] is None
    assert env.balances() == START


def test_preview_beyond_max_rows_says_so(env: Env) -> None:
    """A preview touching more rows than max_rows reports within_max_rows false."""
    result = run_preview(env.pilot, preview_token(env, DEBIT_ALL, max_rows=2))
    assert result["total_rows"] == 3 and result["within_max_rows"] is False
    assert env.balances() == START


def test_statement_error_is_preview_failed_with_the_sqlite_error(env: Env) -> None:
    """A statement the target refuses is preview_failed, naming SQLite's error; nothing kept."""
    with pytest.raises(PreviewFailed) as caught:
        run_preview(env.pilot, preview_token(env, DEBIT_ALL, "UPDATE nowhere SET x = 1"))
    assert caught.value.code == "preview_failed"
    assert caught.value.detail["sqlite_errorname"] == "SQLITE_ERROR"
    assert env.balances() == START


def test_preview_is_logged(env: Env) -> None:
    """Each preview leaves a preview.run entry in the Pilot's logbook."""
    assert env.pilot.logbook is not None
    result = run_preview(env.pilot, preview_token(env, DEBIT_ALL))
    entries = env.pilot.logbook.entries("preview.run")
    assert [e["body"]["preview_cid"] for e in entries] == [result["preview_cid"]]


@pytest.mark.parametrize(
    ("make", "error", "code"),
    [
        (lambda env: preview_token(env, DEBIT_ALL, issuer_key=new_key()), MarqueInvalid,
         "marque_invalid"),
        (lambda env: preview_token(env, DEBIT_ALL, now=0), MarqueExpired, "marque_expired"),
        (lambda env: preview_token(env, DEBIT_ALL, pilot_id="pilot-2"), WrongPilot,
         "wrong_pilot"),
        (lambda env: preview_token(env, DEBIT_ALL, incarnation="inc-other"), WrongIncarnation,
         "wrong_incarnation"),
        (lambda env: preview_token(env, DEBIT_ALL, target="vault"), UnknownTarget,
         "unknown_target"),
        (lambda env: issue_marque(env.issuer, pilot_id=env.pilot.pilot_id,
                                  incarnation=env.pilot.incarnation, target="bank",
                                  holder_jwk=env.holder, change=change(DEBIT_ALL),
                                  budget=Budget(1, 5),
                                  ttl_seconds=60), MarqueInvalid, "marque_invalid"),
    ],
    ids=["forged", "expired", "other-pilot", "other-incarnation", "unknown-target", "wrong-typ"],
)
def test_bad_preview_token_is_refused_and_nothing_runs(
    env: Env, make: Any, error: type[MarqueError], code: str
) -> None:
    """A forged, expired, misdirected or mistyped preview token is refused by code; no effect."""
    with pytest.raises(error) as caught:
        run_preview(env.pilot, make(env))
    assert caught.value.code == code
    assert "preview token" in caught.value.message
    assert nothing_claimed(env)
    assert env.balances() == START


def test_replayed_preview_token_is_refused(env: Env) -> None:
    """The same preview token runs once; its second use is pop_replayed."""
    token = preview_token(env, DEBIT_ALL)
    run_preview(env.pilot, token)
    with pytest.raises(PopReplayed) as caught:
        run_preview(env.pilot, token)
    assert caught.value.code == "pop_replayed"
    assert nothing_claimed(env)


def test_evidence_shows_the_claim_and_the_applied_stamp(env: Env) -> None:
    """After an execution, the evidence lists its nonce, attempt and the target's stamp."""
    marque = env.issue(["UPDATE accounts SET balance = balance - 10 WHERE id = 1"])
    marque_id = marque_id_of(marque)
    assert env.run(marque, "n-1").status == "applied"
    token = issue_query_token(env.issuer, pilot_id=env.pilot.pilot_id, marque_id=marque_id)
    evidence = marque_evidence(env.pilot, token, marque_id)
    assert evidence["marque_id"] == marque_id
    assert evidence["budget"]["executions_left"] == 0
    (claim,) = evidence["claims"]
    assert claim["nonce"] == "n-1"
    assert [(a["attempt"], a["status"], a["rows_affected"]) for a in claim["attempts"]] == [
        (1, "applied", 1)]
    assert [(s["nonce"], s["kind"], s["rows_affected"]) for s in evidence["stamps"]] == [
        ("n-1", "applied", 1)]
    assert evidence["target_reachable"] is True


def test_evidence_of_an_unknown_marque_is_empty(env: Env) -> None:
    """A marque never claimed has no budget, no claims and no stamps (what expiry needs)."""
    token = issue_query_token(env.issuer, pilot_id=env.pilot.pilot_id, marque_id="mq_none")
    evidence = marque_evidence(env.pilot, token, "mq_none")
    assert (evidence["budget"], evidence["claims"], evidence["stamps"]) == (None, [], [])


def test_query_token_for_another_marque_is_refused(env: Env) -> None:
    """A query token naming one marque cannot read another's evidence."""
    token = issue_query_token(env.issuer, pilot_id=env.pilot.pilot_id, marque_id="mq_a")
    with pytest.raises(MarqueInvalid) as caught:
        marque_evidence(env.pilot, token, "mq_b")
    assert caught.value.code == "marque_invalid"


def test_previews_key_in_pilot_json_is_checked() -> None:
    """pilot.json's previews must name a served target and rollback or explain."""
    base = {"pilot_id": "p1", "targets": {"bank": "sqlite:///bank.db"}}
    assert PilotConfig.from_dict({**base, "previews": {"bank": "explain"}}).previews == {
        "bank": "explain"}
    assert PilotConfig.from_dict(base).previews == {}
    with pytest.raises(ConfigInvalid, match=r"previews\.bank must be one of rollback, explain"):
        PilotConfig.from_dict({**base, "previews": {"bank": "dry"}})
    with pytest.raises(ConfigInvalid, match=r"previews\.vault: there is no target"):
        PilotConfig.from_dict({**base, "previews": {"vault": "rollback"}})
