"""The Harbourmaster's synchronous core in process, against real `marque pilot serve` processes.

A real Harbourmaster home (``init_harbour``: SQLite store, issuer key, the
bootstrap routing profile) whose issuer key the Pilot world trusts through the
CLI; the core asks that Pilot for previews and evidence over HTTP, and marques
it issues are executed through the Pilot with the requester's own key.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Service, World
from support.harbour import READS_ALLOWED, WRITES_DENIED, routing_toml

from marque.clients.pilot import PilotClient
from marque.errors import (
    AccountDenied,
    AccountNoMatch,
    Conflict,
    Forbidden,
    RevalidationFailed,
    SelfApproval,
    Unauthenticated,
)
from marque.harbour.home import HarbourHome
from marque.harbour.lifecycle import IntentConflict
from marque.harbour.principals import Principal
from marque.harbour.routing import BOOTSTRAP_PROFILE_TOML, parse_config
from marque.harbour.service import Harbourmaster
from marque.harbour.setup import init_harbour
from marque.pilot.setup import trust_issuer
from marque.token import make_proof

READ = "SELECT balance FROM accounts WHERE id = 1"
WRITE = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


@dataclass
class Harbour:
    """A Harbourmaster core, its principals and the Pilot it routes to."""

    hm: Harbourmaster
    world: World
    pilot: Service
    admin: Principal
    alice: Principal  # requester (and approver: to try self-approval)
    bob: Principal  # approver
    carol: Principal  # approver
    p1: Principal  # the Pilot's principal
    alice_token: str

    def body(self, sql: str = WRITE, request_id: str = "req-1", *, ttl: int = 600,
             max_rows: int = 1) -> dict[str, Any]:
        return {"request_id": request_id, "pilot_id": "p1", "target": "bank",
                "change": {"statements": [{"sql": sql, "params": []}]},
                "budget": {"executions": 1, "max_rows": max_rows, "attempts_per_nonce": 1},
                "ttl_seconds": ttl, "reason": "a test"}

    def register(self, incarnation: str | None = None) -> dict[str, Any]:
        return self.hm.register_pilot(self.p1, {
            "pilot_id": "p1", "url": self.pilot.url,
            "incarnation": incarnation or self.world.incarnation,
            "targets": {"bank": {"dialect": "sqlite"}}})

    def adopt(self, text: str) -> None:
        config = parse_config(text)
        assert self.hm.store.adopt_routing_config(config.config_cid, config.text, actor="admin")

    def execute(self, request: dict[str, Any], nonce: str = "n-1") -> Any:
        handed = self.hm.marque_for(self.alice, request["id"])
        key = json.loads(self.world.holder_key.read_text())
        client = PilotClient(handed["pilot"]["url"])
        try:
            outcome = client.execute(handed["marque"], nonce, lambda: make_proof(
                key, handed["marque"], nonce=nonce, pilot_id="p1"))
        finally:
            client.close()
        # An applied write is answered before its settle lands (settle_write_behind):
        # the tests read the ledger's outbox next, so wait until the ledger holds it.
        deadline = time.monotonic() + 30
        while outcome.status == "applied" and not outcome.recorded and self.world.ledger_rows(
                "SELECT 1 FROM attempts WHERE marque_id = ? AND nonce = ? "
                "AND status = 'in_progress'", (outcome.marque_id, nonce)):
            assert time.monotonic() < deadline, "the outcome was never recorded"
            time.sleep(0.02)
        return outcome

    def outbox(self) -> list[dict[str, Any]]:
        return [json.loads(p) for (p,) in self.world.ledger_rows(
            "SELECT payload FROM outbox ORDER BY marque_id, nonce, attempt")]

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.hm.logbook(self.admin, 0, 1000, kind)["entries"]]


@pytest.fixture
def harbour(world: World, tmp_path: Path) -> Iterator[Harbour]:
    made = init_harbour(tmp_path / "harbour")
    # `pilot trust`'s core, in process (the command is tested as one in test_home.py).
    trust_issuer(world.home, made["issuer"]["jwk"])
    pilot = Service(world)
    hm = Harbourmaster.open(HarbourHome(tmp_path / "harbour"))
    try:
        store = hm.store
        holder = json.loads(world.holder_pub.read_text())
        alice, alice_token = store.add_principal("alice", ["requester", "approver"],
                                                 public_jwk=holder, actor="admin")
        bob, _ = store.add_principal("bob", ["approver"], actor="admin")
        carol, _ = store.add_principal("carol", ["approver"], actor="admin")
        p1, _ = store.add_principal("p1", ["pilot"], actor="admin")
        harbour = Harbour(hm, world, pilot, hm.authenticate(made["admin_token"]), alice, bob,
                          carol, p1, alice_token)
        harbour.register()
        yield harbour
    finally:
        hm.close()
        pilot.stop()


def _approvals(n: int) -> str:
    return BOOTSTRAP_PROFILE_TOML.replace("approvals = 1", f"approvals = {n}")


def test_an_allowed_read_is_issued_at_once_executes_and_is_verified_by_its_report(
        harbour: Harbour) -> None:
    assert harbour.hm.authenticate(harbour.alice_token).name == "alice"
    with pytest.raises(Unauthenticated):
        harbour.hm.authenticate("mqh_not-a-token")
    request, created = harbour.hm.submit(harbour.alice, harbour.body(READ), None)
    assert created and request["state"] == "prepared"
    assert request["routing"]["outcome"] == "allow"
    assert request["change"]["access"] == "read_only"
    assert request["preview"] is None and request["checkpoint"] is None
    # A retried POST answers the same request; another change under the id is refused.
    again, created = harbour.hm.submit(harbour.alice, harbour.body(READ), '"req-1"')
    assert not created and again["id"] == request["id"]
    with pytest.raises(IntentConflict):
        harbour.hm.submit(harbour.alice, harbour.body(WRITE), None)

    outcome = harbour.execute(request)
    assert outcome.status == "applied"
    [report] = harbour.outbox()
    assert report["marque_id"] == request["marque_id"]
    delivery = {"pilot_id": "p1", "reports": [report]}
    assert harbour.hm.ingest_reports(harbour.p1, delivery) == {"acknowledged": 1, "new": 1,
                                                               "ignored": 0}
    assert harbour.hm.ingest_reports(harbour.p1, delivery) == {"acknowledged": 1, "new": 0,
                                                               "ignored": 0}
    seen = harbour.hm.get_request(harbour.alice, "req-1")
    assert seen["state"] == "verified"
    assert seen["executions"] == [{"nonce": "n-1", "attempt": 1, "status": "applied",
                                   "rows_affected": report["rows_affected"], "error": None}]
    assert len(harbour.kinds("execution.applied")) == 1
    assert len(harbour.kinds("marque.issued")) == 1
    # Another Pilot principal cannot report for p1.
    other, _ = harbour.hm.store.add_principal("p2", ["pilot"], actor="admin")
    with pytest.raises(Forbidden):
        harbour.hm.ingest_reports(other, delivery)


def test_a_write_waits_on_a_checkpoint_and_another_approver_completes_it(
        harbour: Harbour) -> None:
    before = harbour.world.balances()
    request, created = harbour.hm.submit(harbour.alice, harbour.body(WRITE), None)
    assert created and request["state"] == "awaiting_approval"
    preview = request["preview"]
    assert preview["statements"][0]["rows"] == 1 and preview["total_rows"] == 1
    assert preview["change_cid"] == request["change_cid"]
    assert harbour.world.balances() == before  # a preview never changes the target
    checkpoint = request["checkpoint"]
    assert checkpoint["body"]["preview_cid"] == preview["preview_cid"]
    assert checkpoint["body"]["routing"]["approvals"] == 1
    assert len(harbour.kinds("checkpoint.sealed")) == 1
    with pytest.raises(Conflict):
        harbour.hm.marque_for(harbour.alice, request["id"])

    with pytest.raises(SelfApproval):
        harbour.hm.approve(harbour.alice, request["id"], None)
    done = harbour.hm.approve(harbour.bob, request["id"], "looks right")
    assert done["state"] == "prepared" and done["marque_id"]
    assert [r["approver"] for r in done["resolutions"]] == ["bob"]
    # The same approval again is answered; a different decision is refused.
    assert harbour.hm.approve(harbour.bob, request["id"], "looks right")["version"] \
        == done["version"]
    with pytest.raises(Conflict):
        harbour.hm.reject(harbour.bob, request["id"], "changed my mind")

    assert harbour.execute(done).status == "applied"
    assert harbour.world.balances()[1] == before[1] - 10


def test_two_approvals_required_one_leaves_it_waiting(harbour: Harbour) -> None:
    harbour.adopt(_approvals(2))
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-2"), None)
    assert request["checkpoint"]["body"]["routing"]["approvals"] == 2
    waiting = harbour.hm.approve(harbour.bob, request["id"], None)
    assert waiting["state"] == "awaiting_approval" and waiting["marque"] is None
    done = harbour.hm.approve(harbour.carol, request["id"], None)
    assert done["state"] == "prepared"
    assert sorted(r["approver"] for r in done["resolutions"]) == ["bob", "carol"]


def test_a_reject_ends_the_request(harbour: Harbour) -> None:
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-r"), None)
    ended = harbour.hm.reject(harbour.bob, request["id"], "not today")
    assert ended["state"] == "rejected"
    assert ended["failure"]["code"] == "delegation_rejected" and ended["marque"] is None


def test_deny_and_no_match_have_their_codes_a_failed_request_and_no_marque(
        harbour: Harbour) -> None:
    harbour.adopt(routing_toml(READS_ALLOWED, WRITES_DENIED))
    with pytest.raises(AccountDenied) as denied:
        harbour.hm.submit(harbour.alice, harbour.body(WRITE, "d-1"), None)
    with pytest.raises(AccountNoMatch) as unmatched:
        harbour.hm.submit(harbour.alice, harbour.body("CREATE TABLE t (x INTEGER)", "d-2"), None)
    for raised, code in ((denied.value, "account_denied"), (unmatched.value, "account_no_match")):
        failed = harbour.hm.get_request(harbour.alice, raised.detail["id"])
        assert failed["state"] == "failed" and failed["failure"]["code"] == code
        assert failed["marque"] is None and failed["routing"]["code"] == code


def test_a_routing_config_changed_while_waiting_fails_revalidation(harbour: Harbour) -> None:
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-c"), None)
    # Another config (the same entries, but self-approval allowed) is adopted meanwhile.
    harbour.adopt(BOOTSTRAP_PROFILE_TOML.replace("self_approval = false", "self_approval = true"))
    with pytest.raises(RevalidationFailed) as refused:
        harbour.hm.approve(harbour.bob, request["id"], None)
    assert refused.value.detail["state"] == "failed"
    ended = harbour.hm.get_request(harbour.bob, request["id"])
    assert ended["state"] == "failed"
    assert ended["failure"]["code"] == "revalidation_failed"
    assert ended["marque"] is None and ended["marque_id"] is None


def test_decision_facts_of_several_requests_are_what_each_reads_alone(harbour: Harbour) -> None:
    """decision_facts reads, for several requests awaiting approval at once, their
    self-approval, their requester's keys and what of their Checkpoint no longer holds —
    what no_longer_holds says of each alone, before and after the config changes."""
    made = [harbour.hm.submit(harbour.alice, harbour.body(WRITE, f"req-f{i}"), None)[0]
            for i in range(3)]
    ids = [r["id"] for r in made]
    facts = harbour.hm.decision_facts([*ids, "rq_missing"])
    assert set(facts) == set(ids)
    for id in ids:
        assert facts[id].no_longer_holds == harbour.hm.no_longer_holds(id) == []
        assert facts[id].self_approval is False
        assert harbour.alice.key_thumbprint in facts[id].requester_keys
    harbour.adopt(BOOTSTRAP_PROFILE_TOML.replace("self_approval = false", "self_approval = true"))
    later = harbour.hm.decision_facts(ids)
    for id in ids:
        assert later[id].no_longer_holds == harbour.hm.no_longer_holds(id) != []


def test_an_incarnation_change_sends_a_prepared_request_to_reconciliation_stamps_settle_it(
        harbour: Harbour) -> None:
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-i"), None)
    prepared = harbour.hm.approve(harbour.bob, request["id"], None)
    assert harbour.execute(prepared).status == "applied"  # a stamp on the target
    answer = harbour.register("a-new-incarnation")
    assert answer["previous_incarnation"] == harbour.world.incarnation
    assert len(harbour.kinds("finding.ledger_incarnation_changed")) == 1
    assert harbour.hm.get_request(harbour.alice, request["id"])["state"] == "reconciliation"
    # A report of the old ledger does not settle it: only stamps do.
    [report] = harbour.outbox()
    harbour.hm.ingest_reports(harbour.p1, {"pilot_id": "p1", "reports": [report]})
    assert harbour.hm.get_request(harbour.alice, request["id"])["state"] == "reconciliation"
    settled = harbour.hm.settle_from_stamps(request["id"])
    assert settled["state"] == "verified"
    assert len(harbour.kinds("reconciliation.settled")) == 1


def test_expiring_a_prepared_request_that_never_ran_frees_its_request_id(
        harbour: Harbour) -> None:
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(READ, "req-e", ttl=1), None)
    assert request["state"] == "prepared"
    with pytest.raises(Conflict):  # the marque may still be used
        harbour.hm.expire(harbour.admin, request["id"], "never ran")
    late = Harbourmaster(harbour.hm.store, harbour.hm.issuer,
                         clock=lambda: time.time() + 3600)
    expired = late.expire(harbour.admin, request["id"], "never ran")
    assert expired["state"] == "expired"
    assert expired["failure"]["code"] == "request_expired"
    fresh, created = harbour.hm.submit(harbour.alice, harbour.body(READ, "req-e", ttl=1), None)
    assert created and fresh["id"] != request["id"] and fresh["state"] == "prepared"


def test_two_approvals_completing_one_checkpoint_at_once_issue_one_marque(
        harbour: Harbour) -> None:
    harbour.adopt(_approvals(2))
    erin, _ = harbour.hm.store.add_principal("erin", ["approver"], actor="admin")
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-t"), None)
    assert harbour.hm.approve(harbour.bob, request["id"], None)["state"] == "awaiting_approval"
    barrier = threading.Barrier(2)
    answers: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def approve(who: Principal) -> None:
        barrier.wait()
        try:
            answers.append(harbour.hm.approve(who, request["id"], None))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=approve, args=(p,)) for p in (harbour.carol, erin)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Each second approval either completed the Checkpoint (and, losing the race, answers
    # what the winner stored) or came after it was complete: a conflict, never a second marque.
    assert len(answers) >= 1 and all(isinstance(e, Conflict) for e in errors), errors
    final = harbour.hm.get_request(harbour.admin, request["id"])
    assert final["state"] == "prepared"
    assert {a["marque_id"] for a in answers} == {final["marque_id"]}
    issued = [e for e in harbour.kinds("marque.issued") if e["subject"] == request["id"]]
    assert len(issued) == 1 and issued[0]["body"]["marque_id"] == final["marque_id"]
    assert harbour.hm.marque_for(harbour.alice, request["id"])["marque_id"] == final["marque_id"]


def test_the_loser_of_a_completion_race_answers_the_winners_marque(harbour: Harbour) -> None:
    """Two completions of one approved Checkpoint from the same read: the CAS decides."""
    harbour.adopt(_approvals(2))
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-cas"), None)
    harbour.hm.approve(harbour.bob, request["id"], None)
    # carol's Resolution is stored, but the request is still read as awaiting approval by
    # both completers (as two processes would each read it before either moved it).
    stale = harbour.hm.store.get_request(request["id"])
    checkpoint = harbour.hm.store.get_checkpoint(stale.checkpoint_cid or "")
    from marque.harbour.checkpoint import Checkpoint, seal_resolution

    sealed = Checkpoint.from_body(checkpoint.body, checkpoint.checkpoint_cid)
    resolution = seal_resolution(sealed, decision="approve", approver="carol", at=time.time())
    harbour.hm.store.add_resolution(sealed.cid, resolution_cid=resolution.cid,
                                    approver="carol", decision="approve", body=resolution.body)
    first = harbour.hm.settle(stale, "carol")
    second = harbour.hm.settle(stale, "bob")
    assert first.state.value == second.state.value == "prepared"
    assert first.marque_id == second.marque_id and first.marque == second.marque
    issued = [e for e in harbour.kinds("marque.issued") if e["subject"] == request["id"]]
    assert len(issued) == 1


def test_an_approval_after_the_deciding_one_finishes_an_interrupted_issuance(
        harbour: Harbour) -> None:
    """The deciding Resolution was stored but its completer stopped before issuing: the next
    approver is told ``conflict`` (theirs does not count) and the marque is issued then."""
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(WRITE, "req-cut"), None)
    stale = harbour.hm.store.get_request(request["id"])
    checkpoint = harbour.hm.store.get_checkpoint(stale.checkpoint_cid or "")
    from marque.harbour.checkpoint import Checkpoint, seal_resolution

    sealed = Checkpoint.from_body(checkpoint.body, checkpoint.checkpoint_cid)
    resolution = seal_resolution(sealed, decision="approve", approver="bob", at=time.time())
    harbour.hm.store.add_resolution(sealed.cid, resolution_cid=resolution.cid,
                                    approver="bob", decision="approve", body=resolution.body)
    assert harbour.hm.store.get_request(request["id"]).state.value == "awaiting_approval"
    with pytest.raises(Conflict):
        harbour.hm.approve(harbour.carol, request["id"], None)
    final = harbour.hm.get_request(harbour.admin, request["id"])
    assert final["state"] == "prepared" and final["marque_id"] is not None
    assert [r["approver"] for r in final["resolutions"]] == ["bob"]
    issued = [e for e in harbour.kinds("marque.issued") if e["subject"] == request["id"]]
    assert len(issued) == 1


def test_access_is_checked_by_the_core(harbour: Harbour) -> None:
    request, _ = harbour.hm.submit(harbour.alice, harbour.body(READ, "req-a"), None)
    other, _ = harbour.hm.store.add_principal("dave", ["requester"], actor="admin")
    from marque.errors import NotFound

    with pytest.raises(NotFound):
        harbour.hm.get_request(other, request["id"])
    with pytest.raises(NotFound):
        harbour.hm.marque_for(other, request["id"])
    with pytest.raises(Forbidden):
        harbour.hm.approve(other, request["id"], None)
    with pytest.raises(Forbidden):
        harbour.hm.logbook(other, 0, 10, "")
    assert [p["pilot_id"] for p in harbour.hm.list_pilots(harbour.bob)] == ["p1"]
    head = harbour.hm.logbook_head(harbour.admin)
    assert head["seq"] > 0 and head["signed"].count(".") == 2
