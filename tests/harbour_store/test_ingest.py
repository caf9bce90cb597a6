"""Migration 3's fields and report ingestion: one transaction, idempotent, §11.2's moves."""

from __future__ import annotations

from typing import Any

import pytest

from marque.errors import Forbidden, InvalidInput, NotFound, ReportKeyChanged
from marque.harbour.store.base import HarbourStore

from .conftest import T0, assert_chain_verifies, make_draft


def _report(status: str, nonce: str = "n-1", attempt: int = 1, *, marque_id: str = "mq_1",
            incarnation: str = "inc-1", pilot: str = "pilot-1") -> dict[str, Any]:
    return {"marque_id": marque_id, "nonce": nonce, "attempt": attempt, "status": status,
            "rows_affected": 1 if status == "applied" else None,
            "error": None if status != "aborted_not_applied" else
            {"code": "guard_failed", "message": "no", "sqlstate": None},
            "pilot": {"id": pilot, "incarnation": incarnation}, "cause": "executed"}


def _prepared(store: HarbourStore, request_id: str = "req-1", *, executions: int = 1,
              exp: float = T0 + 600) -> str:
    store.register_pilot("pilot-1", "http://127.0.0.1:1", "inc-1", ["bank"],
                         dialects={"bank": "sqlite"}, now=T0)
    draft = make_draft(request_id)
    draft = type(draft)(**{**draft.__dict__, "budget": {
        "executions": executions, "max_rows": 1, "attempts_per_nonce": 1}})
    request, _ = store.create_request(draft, now=T0)
    moved = store.transition(request.id, 1, "prepared", actor="hm", now=T0,
                             kind="marque.issued", marque_id=f"mq_{request_id}",
                             marque="a.b.c", marque_expires_at=exp)
    assert moved.marque == "a.b.c" and moved.marque_expires_at == exp
    return moved.id


def test_pilot_dialects_are_stored_and_must_name_its_targets(store: HarbourStore) -> None:
    store.register_pilot("p", "http://x", "i", ["bank", "crm"],
                         dialects={"bank": "sqlite", "crm": "postgres"}, now=T0)
    assert store.get_pilot("p").dialects == {"bank": "sqlite", "crm": "postgres"}
    with pytest.raises(InvalidInput):
        store.register_pilot("p", "http://x", "i", ["bank"], dialects={"crm": "sqlite"})
    store.register_pilot("q", "http://y", "i", ["bank"], now=T0)
    assert store.get_pilot("q").dialects == {}


def test_a_report_moves_its_request_once_in_the_same_transaction(store: HarbourStore) -> None:
    rid = _prepared(store)
    report = _report("applied", marque_id="mq_req-1")
    new, request = store.ingest_report(report, actor="pilot-1", now=T0 + 1)
    assert new and request is not None and request.state.value == "verified"
    again, same = store.ingest_report(report, actor="pilot-1", now=T0 + 2)
    assert not again and same is not None and same.version == request.version
    kinds = [e.kind for e in assert_chain_verifies(store)]
    assert kinds.count("execution.applied") == 1 and kinds.count("request.verified") == 1
    assert [r.status for r in store.reports("mq_req-1")] == ["applied"]
    assert store.get_request(rid).state.value == "verified"


def test_indeterminate_then_applied_and_the_failed_rule(store: HarbourStore) -> None:
    rid = _prepared(store, "req-x", executions=2)
    _, request = store.ingest_report(_report("indeterminate", marque_id="mq_req-x"),
                                     actor="pilot-1", now=T0 + 1)
    assert request is not None and request.state.value == "reconciliation"
    _, request = store.ingest_report(_report("applied", marque_id="mq_req-x"),
                                     actor="pilot-1", now=T0 + 2)
    assert request is not None and request.state.value == "verified"

    other = _prepared(store, "req-y", executions=2)
    _, request = store.ingest_report(_report("aborted_not_applied", marque_id="mq_req-y"),
                                     actor="pilot-1", now=T0 + 1)
    assert request is not None and request.state.value == "executing"  # a nonce is left
    _, request = store.ingest_report(
        _report("aborted_not_applied", "n-2", marque_id="mq_req-y"), actor="pilot-1",
        now=T0 + 2)
    assert request is not None and request.state.value == "failed"
    assert request.failure is not None and request.failure["code"] == "guard_failed"
    assert {rid, other} == {r.id for r in store.list_requests()}


def test_a_later_same_status_report_completes_a_missing_effect_set_summary_once(
        store: HarbourStore) -> None:
    """An indeterminate report without its Effect Set summary, then the same status with it:
    the stored report gains the summary (nothing moves, nothing new is journalled); a third
    with another summary changes nothing (docs/effects.md, choice 43)."""
    _prepared(store, "req-fx")
    bare = _report("indeterminate", marque_id="mq_req-fx")
    summary = {"set_receipt": {"status": "unknown_outcome"}, "row_states": {"m": ["unknown"]}}
    store.ingest_report(bare, actor="pilot-1", now=T0 + 1)
    seqs = len(store.logbook_entries(limit=1000))

    new, request = store.ingest_report({**bare, "effect_set": summary}, actor="pilot-1",
                                       now=T0 + 2)
    store.ingest_report({**bare, "effect_set": {**summary, "row_states": {}}},
                        actor="pilot-1", now=T0 + 3)

    assert new is False and request is not None and request.state.value == "reconciliation"
    [held] = store.reports("mq_req-fx")
    assert held.body["effect_set"] == summary
    assert len(store.logbook_entries(limit=1000)) == seqs


def test_reports_of_an_unknown_marque_or_another_pilot_write_nothing(
        store: HarbourStore) -> None:
    """A marque never issued here is not stored; another Pilot's report of a marque is
    refused (forbidden): no report row, no logbook entry, the request unmoved."""
    rid = _prepared(store, "req-z")
    seqs = len(store.logbook_entries(limit=1000))
    assert store.ingest_report(_report("applied", marque_id="mq_nobody"), actor="p",
                               now=T0) == (False, None)
    with pytest.raises(Forbidden):
        store.ingest_report(_report("applied", marque_id="mq_req-z", pilot="evil"),
                            actor="evil", now=T0)
    assert store.reports("mq_req-z") == [] and store.reports("mq_nobody") == []
    assert len(store.logbook_entries(limit=1000)) == seqs
    assert store.get_request(rid).state.value == "prepared"
    assert store.marque_pilots(["mq_req-z", "mq_nobody"]) == {"mq_req-z": "pilot-1"}


def test_a_reports_signature_is_kept_in_its_logbook_entry(store: HarbourStore) -> None:
    """The compact JWS a report carries is in its execution entry's body, hash-chained."""
    _prepared(store, "req-s")
    report = {**_report("applied", marque_id="mq_req-s"), "signature": "h.p.s"}
    store.ingest_report(report, actor="pilot-1", now=T0 + 1)
    [entry] = [e for e in assert_chain_verifies(store) if e.kind == "execution.applied"]
    assert entry.body["signature"] == "h.p.s"


def test_a_registration_is_logged_only_when_something_about_the_pilot_changed(
        store: HarbourStore) -> None:
    """The same registration again only moves last_seen; another URL, targets or report key
    is one pilot.registered naming what changed; another report key is refused (a finding),
    until an admin accepts it."""
    key = {"kty": "OKP", "crv": "Ed25519", "x": "a" * 43, "kid": "k1"}
    args = ("pilot-r", "http://127.0.0.1:1", "inc-1", ["bank"])
    store.register_pilot(*args, dialects={"bank": "sqlite"}, report_key=key, now=T0)
    for minute in range(1, 6):
        store.register_pilot(*args, dialects={"bank": "sqlite"}, report_key=key,
                             now=T0 + 60 * minute)
    store.register_pilot(*args, dialects={"bank": "sqlite"}, now=T0 + 400)  # no key sent
    assert store.get_pilot("pilot-r").last_seen == T0 + 400
    assert store.get_pilot("pilot-r").report_key == key
    store.register_pilot("pilot-r", "http://127.0.0.1:2", "inc-1", ["bank"],
                         dialects={"bank": "sqlite"}, report_key=key, now=T0 + 500)
    other = {**key, "x": "b" * 43, "kid": "k2"}
    with pytest.raises(ReportKeyChanged):  # a Pilot never replaces its own key
        store.register_pilot("pilot-r", "http://127.0.0.1:3", "inc-2", ["bank"],
                             dialects={"bank": "sqlite"}, report_key=other, now=T0 + 600)
    held = store.get_pilot("pilot-r")
    assert (held.report_key, held.url, held.incarnation) == (key, "http://127.0.0.1:2", "inc-1")
    entries = [e for e in assert_chain_verifies(store) if e.subject == "pilot-r"]
    assert [e.kind for e in entries] == ["pilot.registered", "pilot.registered",
                                         "finding.pilot_report_key_refused"]
    assert entries[0].body["report_key"] == key and "changed" not in entries[0].body
    assert entries[1].body["changed"] == ["url"]
    assert entries[2].body["report_key"] == key
    assert entries[2].body["offered_report_key"] == other

    # An admin's decision replaces it; the Pilot's next registration with it is taken.
    store.accept_report_key("pilot-r", other, actor="root", reason="home rebuilt", now=T0 + 700)
    store.register_pilot("pilot-r", "http://127.0.0.1:2", "inc-1", ["bank"],
                         dialects={"bank": "sqlite"}, report_key=other, now=T0 + 800)
    assert store.get_pilot("pilot-r").report_key == other
    [accepted] = [e for e in assert_chain_verifies(store)
                  if e.kind == "pilot.report_key_accepted"]
    assert (accepted.actor, accepted.body["previous_report_key"], accepted.body["report_key"],
            accepted.body["reason"]) == ("root", key, other, "home rebuilt")
    with pytest.raises(NotFound):
        store.accept_report_key("nobody", other, actor="root", reason="r")


def test_after_an_incarnation_change_only_the_current_ledger_moves_it(
        store: HarbourStore) -> None:
    rid = _prepared(store, "req-w")
    store.register_pilot("pilot-1", "http://127.0.0.1:1", "inc-2", ["bank"],
                         dialects={"bank": "sqlite"}, now=T0 + 1)
    assert store.get_request(rid).state.value == "reconciliation"
    _, request = store.ingest_report(_report("applied", marque_id="mq_req-w"),
                                     actor="pilot-1", now=T0 + 2)
    assert request is not None and request.state.value == "reconciliation"


def test_sealing_a_checkpoint_stores_routing_and_preview_under_its_kind(
        store: HarbourStore) -> None:
    request, _ = store.create_request(make_draft("req-s"), now=T0)
    moved = store.seal_checkpoint(
        request.id, 1, checkpoint_cid="sha256:" + "c" * 64, body={"b": 1},
        expires_at=T0 + 60, actor="alice", now=T0, kind="checkpoint.sealed",
        routing={"outcome": "delegate"}, preview={"preview_cid": "sha256:" + "d" * 64})
    assert moved.routing == {"outcome": "delegate"} and moved.preview is not None
    assert assert_chain_verifies(store)[-1].kind == "checkpoint.sealed"
    with pytest.raises(InvalidInput):
        store.seal_checkpoint(moved.id, moved.version, checkpoint_cid="sha256:" + "e" * 64,
                              body={}, expires_at=T0, actor="a", state="x")


def _stale(nonce: str, marque_id: str) -> dict[str, Any]:
    return {**_report("aborted_not_applied", nonce, marque_id=marque_id),
            "error": {"code": "stale_preview", "message": "row 2 changed", "sqlstate": None}}


def test_a_stale_effect_preview_ends_its_request_failed_with_the_next_step(
        store: HarbourStore) -> None:
    """An Effect Set attempt refused as stale_preview, with a nonce still unused: no attempt
    of the marque can apply that preview, so the request is failed (stale_preview, saying to
    re-request) — unless something applied or is unknown, which keep their states."""
    rid = _prepared(store, "req-st", executions=2)
    _, request = store.ingest_report(_stale("n-1", "mq_req-st"), actor="pilot-1", now=T0 + 1)
    assert request is not None and request.state.value == "failed"
    assert request.failure is not None and request.failure["code"] == "stale_preview"
    assert "Re-request" in request.failure["message"]
    assert store.get_request(rid).state.value == "failed"

    _prepared(store, "req-sa", executions=2)
    store.ingest_report(_report("applied", marque_id="mq_req-sa"), actor="pilot-1", now=T0 + 1)
    _, request = store.ingest_report(_stale("n-2", "mq_req-sa"), actor="pilot-1", now=T0 + 2)
    assert request is not None and request.state.value == "verified"

    _prepared(store, "req-su", executions=2)
    store.ingest_report(_report("indeterminate", marque_id="mq_req-su"), actor="pilot-1",
                        now=T0 + 1)
    _, request = store.ingest_report(_stale("n-2", "mq_req-su"), actor="pilot-1", now=T0 + 2)
    assert request is not None and request.state.value == "reconciliation"
