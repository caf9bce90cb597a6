"""Receipts: the seed's aggregation (hypothesis against tables), member and set receipts,
and reconciliation chains (unknown → unknown → applied; conflict; redelivery)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.cid import cid
from marque.effects import receipts
from marque.effects.declare import bind, capture_input, parse_declaration
from marque.effects.dispatch import DispatchState, advance, prepare
from marque.effects.preview import build_preview
from marque.errors import EffectReceiptInvalid, ReconciliationInvalid

D = DispatchState
STATES = ["applied", "accepted", "failed", "unknown", "unattempted", "rolled_back"]

# -- the seed's rules, written as tables (first matching row wins) ------------------------
# Flags: unknown, failed, unattempted, rolled_back, accepted, applied; "*" matches anything.
ENTRY_TABLE = [
    ((1, "*", "*", "*", "*", "*"), "unknown"),
    ((0, 1, "*", "*", "*", "*"), "failed"),
    ((0, 0, 1, "*", 1, "*"), "failed"),
    ((0, 0, 1, "*", "*", 1), "failed"),
    ((0, 0, "*", 1, 1, "*"), "failed"),
    ((0, 0, "*", 1, "*", 1), "failed"),
    ((0, 0, 1, 0, 0, 0), "unattempted"),
    ((0, 0, 0, 1, 0, 0), "rolled_back"),
    ((0, 0, 1, 1, 0, 0), "failed"),      # the seed is silent: a choice (docs/effects.md)
    ((0, 0, 0, 0, 1, "*"), "accepted"),
    ((0, 0, 0, 0, 0, 1), "applied"),
    ((0, 0, 0, 0, 0, 0), "applied"),     # no rows: successful zero-item meaning (a choice)
]
# Flags: unknown, any success (applied/accepted), any not done (failed/unattempted/rolled_back),
# accepted.
SET_TABLE = [
    ((1, "*", "*", "*"), "unknown_outcome"),
    ((0, 1, 1, "*"), "partial_failure"),
    ((0, 0, 1, "*"), "failed"),
    ((0, "*", 0, 1), "accepted"),
    ((0, "*", 0, 0), "applied"),
]
RUN_TABLE = [
    ((1, "*", "*", "*"), "needs_reconciliation"),
    ((0, "*", 1, "*"), "failed"),
    ((0, "*", 0, "*"), "succeeded"),
]


def _lookup(table: list[tuple[tuple[Any, ...], str]], flags: tuple[int, ...]) -> str:
    for pattern, result in table:
        if all(p == "*" or p == f for p, f in zip(pattern, flags, strict=True)):
            return result
    raise AssertionError(f"no row for {flags}")


def _entry_flags(rows: list[str]) -> tuple[int, ...]:
    return tuple(int(s in rows) for s in ("unknown", "failed", "unattempted", "rolled_back",
                                          "accepted", "applied"))


def _set_flags(rows: list[str]) -> tuple[int, ...]:
    return (int("unknown" in rows), int(bool({"applied", "accepted"} & set(rows))),
            int(bool({"failed", "unattempted", "rolled_back"} & set(rows))),
            int("accepted" in rows))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(STATES), max_size=6), min_size=1, max_size=5))
def test_aggregation_is_exactly_the_seeds_rules(members: list[list[str]]) -> None:
    """Member entry states, the set status and the Run outcome agree with the seed's tables."""
    for rows in members:
        assert receipts.member_entry_state(rows) == _lookup(ENTRY_TABLE, _entry_flags(rows))
    every = [s for rows in members for s in rows]
    assert receipts.set_status(every) == _lookup(SET_TABLE, _set_flags(every))
    assert receipts.run_outcome(every) == _lookup(RUN_TABLE, _set_flags(every))


@pytest.mark.parametrize("outcome", [
    {"state": "applied"}, {"state": "applied", "rows_affected": -1},
    {"state": "applied", "rows_affected": 1, "action": "inserted"},
    {"state": "accepted", "operation_ref": ""}, {"state": "failed", "error": {"code": "x"}},
    {"state": "unknown", "reason": "lost", "idempotency_key": "nope"},
    {"state": "pending"}, None, {"state": "failed", "error": {"code": "c", "message": "m"},
                                 "extra": 1},
])
def test_outcomes_are_closed(outcome: Any) -> None:
    """An EffectOutcome is one of four closed shapes; anything else is refused."""
    with pytest.raises(EffectReceiptInvalid):
        receipts.check_outcome(outcome)


# -- a preview, its dispatch and its receipts -------------------------------------------

SCOPE, RUN = cid({"scope": 1}), cid({"run": 1})
APPROVAL = {"kind": "approval", "checkpoint_cid": cid({"ck": 1}),
            "resolution_cids": [cid({"res": 1})]}


def _preview(kind: str = "update", policy: str = "continue") -> Any:
    decl = parse_declaration({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "fix", "kind": kind, "table": "t", "key": ["id"],
         "failure_policy": policy, "max_items": 5}]})
    bound = bind(decl, {"fix": capture_input(
        b'[{"id": 1, "e": "a"}, {"id": 2, "e": "b"}, {"id": 3, "e": "c"}]', "json")})
    reads = {"fix": {f'{{"id":{i}}}': {"state": "present", "value": {"id": i, "e": "o"}}
                     for i in (1, 2, 3)}}
    return build_preview(bound, reads, pilot_id="p", target="main", logical_request_scope=SCOPE,
                         run_identity_cid=RUN)


APPLIED = {"state": "applied", "rows_affected": 1}


def _applied(preview: Any, outcomes: list[str]) -> tuple[Any, Any, list[Any]]:
    """Dispatch each row to its outcome; build the member and set receipts."""
    member = preview.members[0]
    entries, records = [], []
    for row, outcome in zip(member.changes, outcomes, strict=True):
        record = prepare(row.row_preview_cid, member.effect_apply_key, row.row_idempotency_key)
        receipt = None
        if outcome != "unattempted":
            record = advance(record, D.DISPATCHING, fence="f")
            record = advance(record, D(outcome), fence="f")
            if outcome != "unknown":
                typed = (APPLIED if outcome == "applied" else
                         {"state": "failed", "error": {"code": "statement_error", "message": "x"}})
                receipt = receipts.row_outcome_receipt(
                    preview, member, row, dispatch_entry_cid=record.dispatch_entry_cid,
                    attempt=record.attempt, outcome=typed)
        records.append(record)
        entries.append(receipts.entry_from_ledger(record, receipt))
    member_receipt = receipts.member_receipt(preview, "fix", entries)
    return member_receipt, receipts.set_receipt(preview, [member_receipt], APPROVAL), records


def test_member_receipt_has_one_ordered_entry_per_row_with_the_seeds_references() -> None:
    """Terminal rows reference dispatch, attempt and outcome receipt; unknown the ledger head;
    unattempted nothing."""
    preview = _preview(policy="halt")
    member, set_receipt, records = _applied(preview, ["applied", "unknown", "unattempted"])
    rows = member.to_json()["rows"]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert [r["row_preview_cid"] for r in rows] == [
        r.row_preview_cid for r in preview.members[0].changes]
    assert set(rows[0]) == {"index", "row_preview_cid", "state", "dispatch_entry_cid",
                            "attempt", "outcome_receipt_cid"}
    assert rows[1]["ledger_head_cid"] == records[1].ledger_head_cid
    assert "outcome_receipt_cid" not in rows[1]
    assert set(rows[2]) == {"index", "row_preview_cid", "state"}
    assert member.receipt_cid == cid(member.to_json(), exclude="receipt_cid")
    assert set_receipt.status == "unknown_outcome"
    assert set_receipt.run_outcome == "needs_reconciliation"
    assert set_receipt.to_json()["members"] == [{
        "effect_id": "fix", "effect_member_preview_cid":
            preview.members[0].effect_member_preview_cid,
        "member_receipt_cid": member.receipt_cid, "state": "unknown"}]


def test_receipts_refuse_what_does_not_match_their_preview() -> None:
    """Wrong entry count, wrong references, a missing member or bad authorization is refused."""
    preview = _preview()
    member, _, _ = _applied(preview, ["applied", "applied", "applied"])
    with pytest.raises(EffectReceiptInvalid):
        receipts.member_receipt(preview, "fix", [{"state": "unattempted"}])
    with pytest.raises(EffectReceiptInvalid):
        receipts.member_receipt(preview, "fix", [{"state": "unknown"}] * 3)
    with pytest.raises(EffectReceiptInvalid):
        receipts.set_receipt(preview, [], APPROVAL)
    with pytest.raises(EffectReceiptInvalid):
        receipts.set_receipt(preview, [member], {"kind": "allow", "config_cid": cid({}),
                                                 "approval_required": True,
                                                 "risk_claim_required": False})
    allow = {"kind": "allow", "config_cid": cid({}), "approval_required": False,
             "risk_claim_required": False}
    assert receipts.set_receipt(preview, [member], allow).status == "applied"


def test_an_upsert_outcome_carries_the_databases_action() -> None:
    """An applied upsert row needs action created|updated; an update row may not have one."""
    upsert = _preview(kind="upsert")
    member, row = upsert.members[0], upsert.members[0].changes[0]
    with pytest.raises(EffectReceiptInvalid):
        receipts.row_outcome_receipt(upsert, member, row, dispatch_entry_cid=cid({}),
                                     attempt=1, outcome=APPLIED)
    made = receipts.row_outcome_receipt(upsert, member, row, dispatch_entry_cid=cid({}),
                                        attempt=1, outcome={**APPLIED, "action": "created"})
    assert made["outcome"]["action"] == "created"
    update = _preview()
    with pytest.raises(EffectReceiptInvalid):
        receipts.row_outcome_receipt(update, update.members[0], update.members[0].changes[0],
                                     dispatch_entry_cid=cid({}), attempt=1,
                                     outcome={**APPLIED, "action": "updated"})


# -- reconciliation chains ---------------------------------------------------------------


def _chain() -> tuple[Any, Any, Any, Any]:
    preview = _preview()
    member, set_receipt, _ = _applied(preview, ["applied", "unknown", "applied"])
    row = preview.members[0].changes[1]
    chain = receipts.ReconciliationChain.open(preview, set_receipt, member, row.row_preview_cid)
    return preview, member, set_receipt, chain


def _unknown(chain: Any) -> dict[str, Any]:
    return {"state": "unknown", "reason": "target unreachable", "idempotency_key":
            chain.idempotency_key}


def test_unknown_then_unknown_then_applied_is_one_valid_chain() -> None:
    """Two unknown observations, then applied: accepted in order; the Run then succeeds."""
    _, member, _, chain = _chain()
    first = chain.next_receipt(_unknown(chain))
    assert "previous_reconciliation_receipt_cid" not in first and first["terminal"] is False
    chain, added = chain.accept(first)
    second = chain.next_receipt(_unknown(chain))
    chain, _ = chain.accept(second)
    assert second["attempt_sequence"] == 2
    assert second["previous_reconciliation_receipt_cid"] == first["reconciliation_receipt_cid"]
    third = chain.next_receipt(APPLIED, outcome_receipt_cid=cid({"outcome": 1}))
    chain, added = chain.accept(third)
    assert added and chain.closed and chain.latest_state == "applied"
    assert third["command_id"] == member.to_json()["effect_apply_key"]
    states = receipts.effective_states([member], {chain.bindings["row_preview_cid"]: chain})
    assert receipts.run_outcome(states) == "succeeded"
    assert receipts.run_outcome(member.states) == "needs_reconciliation"  # receipts unchanged


def test_exact_redelivery_is_idempotent() -> None:
    """Delivering an accepted receipt again changes nothing, before or after the chain closes."""
    _, _, _, chain = _chain()
    first = chain.next_receipt(_unknown(chain))
    chain, _ = chain.accept(first)
    again, added = chain.accept(first)
    assert again is chain and not added
    last = chain.next_receipt(APPLIED, outcome_receipt_cid=cid({"o": 1}))
    chain, _ = chain.accept(last)
    assert chain.accept(last) == (chain, False)
    assert chain.accept(first) == (chain, False)


def test_a_different_receipt_after_a_terminal_one_is_a_conflict() -> None:
    """Once applied closes the chain, a failed (or any other) receipt is a conflict."""
    _, _, _, chain = _chain()
    applied = chain.next_receipt(APPLIED, outcome_receipt_cid=cid({"o": 1}))
    failed = chain.next_receipt({"state": "failed", "error": {"code": "c", "message": "m"}},
                                outcome_receipt_cid=cid({"o": 2}))
    closed, _ = chain.accept(applied)
    with pytest.raises(receipts.ReconciliationConflict) as caught:
        closed.accept(failed)
    assert caught.value.code == "conflict"


def test_a_second_receipt_for_a_taken_attempt_is_a_conflict() -> None:
    """Two different receipts for attempt 1 of an open chain: the second conflicts."""
    _, _, _, chain = _chain()
    one = chain.next_receipt(_unknown(chain))
    other = chain.next_receipt({**_unknown(chain), "reason": "still unreachable"})
    chain, _ = chain.accept(one)
    with pytest.raises(receipts.ReconciliationConflict):
        chain.accept(other)


def _resealed(receipt: dict[str, Any], **changes: Any) -> dict[str, Any]:
    body = {**receipt, **changes}
    body = {k: v for k, v in body.items() if v is not ...}
    body["reconciliation_receipt_cid"] = cid(body, exclude="reconciliation_receipt_cid")
    return body


@pytest.mark.parametrize(("rule", "change"), [
    ("self_cid", lambda c, r: {**r, "attempt_sequence": 1, "terminal": False,
                               "reconciliation_receipt_cid": cid({"forged": 1})}),
    ("binding", lambda c, r: _resealed(r, row_preview_cid=cid({"other": 1}))),
    ("binding", lambda c, r: _resealed(r, prior_receipt_cid=cid({"other": 1}))),
    ("sequence", lambda c, r: _resealed(r, attempt_sequence=2)),
    ("sequence", lambda c, r: _resealed(r, previous_reconciliation_receipt_cid=cid({"p": 1}))),
    ("terminal", lambda c, r: _resealed(r, terminal=True)),
    ("outcome_receipt_cid", lambda c, r: _resealed(r, outcome=APPLIED, terminal=True)),
    ("correlation", lambda c, r: _resealed(r, operation_ref="op-1")),
    ("correlation", lambda c, r: _resealed(r, command_id=..., idempotency_key=...)),
    ("correlation", lambda c, r: _resealed(r, idempotency_key=cid({"k": 2}))),
    ("fields", lambda c, r: _resealed(r, extra="x")),
    ("fields", lambda c, r: _resealed(r, effect_set_receipt_cid=...)),
    ("outcome", lambda c, r: _resealed(r, outcome={"state": "pending"})),
])
def test_a_receipt_that_breaks_the_closed_fields_or_the_chain_is_refused(rule: str,
                                                                        change: Any) -> None:
    """Forged self-CIDs, other bindings, gaps, inconsistent terminal flags, missing outcome
    receipts, two or no correlations, unknown fields and open outcomes are refused."""
    _, _, _, chain = _chain()
    with pytest.raises(ReconciliationInvalid) as caught:
        chain.accept(change(chain, chain.next_receipt(_unknown(chain))))
    assert caught.value.detail["rule"] == rule


def test_a_known_terminal_row_is_not_eligible_for_reconciliation() -> None:
    """Opening a chain for an applied row is refused: only unknown rows are reconciled."""
    preview, member, set_receipt, _ = _chain()
    with pytest.raises(ReconciliationInvalid) as caught:
        receipts.ReconciliationChain.open(preview, set_receipt, member,
                                          preview.members[0].changes[0].row_preview_cid)
    assert caught.value.detail["rule"] == "not_unknown"
