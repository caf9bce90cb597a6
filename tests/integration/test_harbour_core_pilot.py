"""The Harbourmaster's core asking a real Pilot in process: previews, retries, evidence.

A Harbourmaster home (``init_harbour``: SQLite store, issuer key, the bootstrap
routing profile) and a Pilot home serving a SQLite ``bank`` that trusts its
issuer key (:class:`support.harbour.PilotBank`), opened with ``open_pilot`` and
asked through :class:`support.pilot_client.InProcessPilot` — the Pilot's own
preview and evidence functions, the Harbourmaster's own tokens, no HTTP. So what
the core does with a Pilot's answer, its refusal or its absence is seen here
without a ``pilot serve`` process (those run in tests/e2e/test_harbour_core.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.harbour import Harbour, PilotBank
from support.pilot_client import InProcessPilot

from marque.errors import PilotUnavailable, PopReplayed, PreviewFailed
from marque.harbour.home import HarbourHome
from marque.harbour.lifecycle import ExpiryRefused
from marque.harbour.preparation import RetrySchedule
from marque.harbour.principals import Principal
from marque.harbour.service import Harbourmaster
from marque.token import make_proof

PILOT_URL = "http://pilot-p1.test:8470"
READ = "SELECT balance FROM accounts WHERE id = 1"
DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1 RETURNING id, balance"
#: Retries due at once (the schedule's delays must be positive): a test waits them out.
QUICK_RETRY = RetrySchedule.of((0.05, 0.05))


@dataclass
class Stack:
    """A Harbourmaster core, the in-process Pilot it asks, and its principals."""

    hm: Harbourmaster
    pilot: InProcessPilot
    bank: PilotBank
    admin: Principal
    alice: Principal  # requester, holding the bank's key
    bob: Principal  # approver
    p1: Principal  # the Pilot's principal

    def body(self, sql: str, request_id: str, *, ttl: int = 600) -> dict[str, Any]:
        return {"request_id": request_id, "pilot_id": "p1", "target": "bank",
                "change": {"statements": [{"sql": sql, "params": []}]},
                "budget": {"executions": 1, "max_rows": 1, "attempts_per_nonce": 1},
                "ttl_seconds": ttl, "reason": "a test"}

    def register(self, incarnation: str | None = None) -> dict[str, Any]:
        return self.hm.register_pilot(self.p1, {
            "pilot_id": "p1", "url": PILOT_URL,
            "incarnation": incarnation or self.bank.incarnation,
            "targets": {"bank": {"dialect": "sqlite"}}})

    def execute(self, request: dict[str, Any], nonce: str = "n-1") -> str:
        """Run the request's marque on the Pilot with alice's key; the outcome's status."""
        handed = self.hm.marque_for(self.alice, request["id"])
        holder = json.loads(self.bank.holder_key.read_text())
        proof = make_proof(holder, handed["marque"], nonce=nonce, pilot_id="p1")
        return self.pilot.pilot.execute(handed["marque"], proof, nonce).status

    def state(self, id: str) -> str:
        return str(self.hm.get_request(self.admin, id)["state"])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    harbour = Harbour(tmp_path / "harbour")
    bank = PilotBank(tmp_path / "bank", harbour)
    pilot = InProcessPilot.open(bank.home, PILOT_URL)
    opened = Harbourmaster.open(HarbourHome(harbour.home))
    hm = Harbourmaster(opened.store, opened.issuer, pilot_client_factory=pilot.client,
                       retry_schedule=QUICK_RETRY, skew_seconds=0)
    try:
        store = hm.store
        holder = json.loads(bank.holder_pub.read_text())
        alice, _ = store.add_principal("alice", ["requester"], public_jwk=holder, actor="admin")
        bob, _ = store.add_principal("bob", ["approver"], actor="admin")
        p1, _ = store.add_principal("p1", ["pilot"], actor="admin")
        made = Stack(hm, pilot, bank, hm.authenticate(harbour.tokens["admin"]), alice, bob, p1)
        made.register()
        yield made
    finally:
        hm.close()
        pilot.close()


def test_a_delegated_write_is_previewed_by_its_pilot_and_sealed_over_that_preview(
        stack: Stack) -> None:
    """A write's preview is the Pilot's: its rows and RETURNING sample, rolled back, sealed."""
    request, created = stack.hm.submit(stack.alice, stack.body(DEBIT, "req-p"), None)
    assert created and request["state"] == "awaiting_approval"
    preview = request["preview"]
    [statement] = preview["statements"]
    assert statement["rows"] == 1
    assert statement["sample"] == {"columns": ["id", "balance"], "rows": [[1, 90]]}
    assert preview["total_rows"] == 1 and preview["within_max_rows"] is True
    assert preview["target"] == "bank" and preview["change_cid"] == request["change_cid"]
    assert request["checkpoint"]["body"]["preview_cid"] == preview["preview_cid"]
    assert stack.bank.balances() == {1: 100, 2: 100}  # the preview was rolled back
    assert stack.pilot.asks == ["preview"] and stack.pilot.clients_open == 0


def test_an_allowed_read_is_issued_without_asking_the_pilot(stack: Stack) -> None:
    """A read the routing allows gets its marque at once; no preview is asked for."""
    request, _ = stack.hm.submit(stack.alice, stack.body(READ, "req-r"), None)
    assert request["state"] == "prepared" and request["marque_id"]
    assert request["preview"] is None and stack.pilot.asks == []


def test_an_unreachable_pilot_leaves_the_request_preparing_and_the_retry_previews_it(
        stack: Stack) -> None:
    """``pilot_unavailable`` keeps the request ``preparing``; the due retry seals it."""
    with stack.pilot.unreachable(), pytest.raises(PilotUnavailable) as refused:
        stack.hm.submit(stack.alice, stack.body(DEBIT, "req-u"), None)
    assert refused.value.code == "pilot_unavailable"
    assert refused.value.detail["state"] == "preparing" and refused.value.detail["attempt"] == 1
    id = refused.value.detail["id"]
    waiting = stack.hm.get_request(stack.admin, id)
    assert waiting["state"] == "preparing" and waiting["preview"] is None
    assert waiting["failure"]["code"] == "pilot_unavailable"
    assert stack.pilot.asks == []  # nothing reached the Pilot

    time.sleep(QUICK_RETRY.delays[0] * 2)  # the next attempt is due
    assert stack.hm.retry_preparations() == 1
    sealed = stack.hm.get_request(stack.admin, id)
    assert sealed["state"] == "awaiting_approval"
    assert sealed["preview"]["statements"][0]["rows"] == 1
    assert stack.pilot.asks == ["preview"]


def test_a_pilot_unreachable_through_every_attempt_fails_the_request(stack: Stack) -> None:
    """Past its schedule the request ends ``failed`` with ``pilot_unavailable``."""
    with stack.pilot.unreachable():
        with pytest.raises(PilotUnavailable) as first:
            stack.hm.submit(stack.alice, stack.body(DEBIT, "req-f"), None)
        id = first.value.detail["id"]
        for _ in range(QUICK_RETRY.attempts - 1):
            time.sleep(QUICK_RETRY.delays[0] * 2)
            assert stack.hm.retry_preparations() == 1
    failed = stack.hm.get_request(stack.admin, id)
    assert failed["state"] == "failed" and failed["failure"]["code"] == "pilot_unavailable"
    assert failed["marque"] is None and stack.pilot.asks == []


def test_a_statement_the_target_refuses_fails_the_request_with_the_pilots_code(
        stack: Stack) -> None:
    """The Pilot's ``preview_failed`` reaches the core typed, and ends the request."""
    with pytest.raises(PreviewFailed) as refused:
        stack.hm.submit(stack.alice, stack.body(
            "UPDATE no_such_table SET balance = 0 WHERE id = 1", "req-x"), None)
    failed = stack.hm.get_request(stack.admin, refused.value.detail["id"])
    assert failed["state"] == "failed" and failed["failure"]["code"] == "preview_failed"
    assert failed["marque"] is None and stack.pilot.asks == ["preview"]


def test_a_preview_token_seen_before_is_refused_by_the_pilot(stack: Stack) -> None:
    """Tokens are verified by the Pilot: a replayed preview token is ``pop_replayed``."""
    request, _ = stack.hm.submit(stack.alice, stack.body(DEBIT, "req-t"), None)
    stored = stack.hm.store.get_request(request["id"])
    from marque.harbour.pilot_calls import ask_preview, preview_token
    from marque.harbour.request_change import stored_change

    pilot = stack.hm.store.get_pilot("p1")
    token = preview_token(stack.hm.ctx, stored, stored_change(stored.change), pilot)
    assert ask_preview(stack.hm.ctx, pilot, token)["statements"][0]["rows"] == 1
    with pytest.raises(PopReplayed) as replayed:
        ask_preview(stack.hm.ctx, pilot, token)
    assert replayed.value.code == "pop_replayed" and stack.pilot.asks == ["preview"] * 3


def test_the_pilots_evidence_refuses_expiring_an_executed_marque_and_allows_an_unused_one(
        stack: Stack) -> None:
    """Expiry reads the Pilot's ledger: a claimed marque stays, an unclaimed one expires."""
    ran, _ = stack.hm.submit(stack.alice, stack.body(READ, "req-ran", ttl=1), None)
    unused, _ = stack.hm.submit(stack.alice, stack.body(READ, "req-unused", ttl=1), None)
    assert stack.execute(ran) == "applied"  # the Pilot's skew still admits it later
    time.sleep(1.1)  # both marques past their exp (the Harbourmaster allows no skew here)
    with pytest.raises(ExpiryRefused) as refused:
        stack.hm.expire(stack.admin, ran["id"], "never ran?")
    assert refused.value.detail["reason"] == "claim_seen"
    assert stack.state(ran["id"]) == "prepared"
    expired = stack.hm.expire(stack.admin, unused["id"], "never ran")
    assert expired["state"] == "expired" and expired["failure"]["code"] == "request_expired"
    assert stack.pilot.asks == ["evidence", "evidence"]


def test_a_reconciliation_request_is_settled_from_the_stamp_its_pilot_reads(
        stack: Stack) -> None:
    """An unreachable Pilot leaves it ``reconciliation``; its evidence's stamp verifies it."""
    request, _ = stack.hm.submit(stack.alice, stack.body(DEBIT, "req-s"), None)
    prepared = stack.hm.approve(stack.bob, request["id"], None)
    assert stack.execute(prepared) == "applied"
    assert stack.bank.balances()[1] == 90
    stack.register("a-new-incarnation")  # the Harbourmaster no longer trusts its reports
    assert stack.state(request["id"]) == "reconciliation"
    with stack.pilot.unreachable(), pytest.raises(PilotUnavailable):
        stack.hm.settle_from_stamps(request["id"])
    assert stack.state(request["id"]) == "reconciliation"
    settled = stack.hm.settle_from_stamps(request["id"])
    assert settled["state"] == "verified"
    # Submitted and approved (the approval revalidates against a fresh preview), then read.
    assert stack.pilot.asks == ["preview", "preview", "evidence"]


def test_a_pilot_asked_at_another_url_than_it_answers_is_unavailable(stack: Stack) -> None:
    """The core asks the URL registered: a Pilot registered elsewhere is not reached."""
    stack.hm.register_pilot(stack.p1, {
        "pilot_id": "p1", "url": "http://elsewhere.test:1", "incarnation":
        stack.bank.incarnation, "targets": {"bank": {"dialect": "sqlite"}}})
    with pytest.raises(PilotUnavailable):
        stack.hm.submit(stack.alice, stack.body(DEBIT, "req-w"), None)
    assert stack.pilot.asks == [] and stack.pilot.clients_open == 0
