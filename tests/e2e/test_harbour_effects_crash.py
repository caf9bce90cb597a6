"""An Effect Set request whose `pilot serve` is SIGKILLed mid-set (issue 14).

A real `harbour serve` and a joined `pilot serve` on the SQLite bank (accounts
1, 2, 3). The Pilot dies right after row 2 committed, before its dispatch
ledger knew (``MARQUE_CRASH_AT=after_commit@2``). Restarted on the same
address, it recovers the dead owner's attempt: row 2 is unknown, reconciled
from its row stamp (never resent), row 3 stays unattempted (halt), and the
report it then sends brings the reconciled row states to the Harbourmaster —
the request ends verified, its receipt in agreement with the rows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import run_cli
from support.harbour import (
    TOPUP_ROWS,
    HarbourServer,
    HarbourWorld,
    cli_env,
    cli_json,
    effect_body,
    wait_for_request,
)

from marque.token import make_proof, unverified_claims

ROWS = TOPUP_ROWS


class CrashStack(HarbourWorld):
    """A Harbourmaster (bootstrap profile), a Pilot joined at a fixed loopback address that
    the test starts, kills and starts again, a requester and an approver."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.proc: subprocess.Popen[str] | None = None

    def start_pilot(self, crash_at: str | None = None) -> None:
        """``pilot serve`` at the joined address (with a crash point, if given)."""
        self.bank.start(listen=f"127.0.0.1:{self.port}",
                        env={"MARQUE_CRASH_AT": crash_at} if crash_at else None)
        assert self.bank.pilot is not None
        self.proc = self.bank.pilot.proc

    def wait_pilot(self) -> int:
        assert self.bank.pilot is not None
        status = self.bank.pilot.wait_dead(60)
        assert status is not None, "pilot serve still runs after a minute"
        return status

@pytest.fixture
def crash_stack(tmp_path: Path) -> Iterator[CrashStack]:
    running = CrashStack(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _wait(stack: CrashStack, rq: str, ready: Any, seconds: float = 30) -> dict[str, Any]:
    return wait_for_request(stack.call, rq, stack.alice, ready, seconds)


def test_a_pilot_killed_mid_set_reconciles_on_restart_and_the_request_shows_the_settled_rows(
        crash_stack: CrashStack) -> None:
    """SIGKILL after row 2's commit: nothing is reported; on restart the Pilot reconciles row 2
    applied from its stamp (not resent), row 3 stays unattempted, and its report makes the
    request verified with a receipt whose row states are the reconciled ones (unknown_outcome
    sealed, Run failed), exactly as the Pilot's own ledger says."""
    stack = crash_stack
    stack.start_pilot(crash_at="after_commit@2")
    body = effect_body(ROWS, request_id="crash-1")
    request = stack.call("POST", "/v1/requests", stack.alice, json=body).json()
    assert request["state"] == "awaiting_approval", request
    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob,
                          json={"reason": "as shown"})
    assert approved.status_code == 200, approved.text
    marque = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()
    token = marque["marque"]

    holder = json.loads(stack.bank.holder_key.read_text())
    proof = make_proof(holder, token, nonce="n-1", pilot_id="p1")
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", f"http://127.0.0.1:{stack.port}/v1/executions", timeout=60,
                          json={"marque": token, "nonce": "n-1", "proof": proof}) as streamed:
            lines = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
            assert "outcome" not in lines[-1], lines  # the stream must not end normally
    assert stack.wait_pilot() == -9
    assert stack.bank.balances() == {1: 150, 2: 250, 3: 100}
    before = stack.call("GET", f"/v1/requests/{request['id']}", stack.alice).json()
    assert before["receipt"] is None and before["executions"] == []

    stack.start_pilot()
    final = _wait(stack, request["id"], lambda r: r["state"] == "verified"
                  and r["receipt"] is not None)
    assert final["state"] == "verified", final
    assert [(e["nonce"], e["status"]) for e in final["executions"]] == [("n-1", "applied")]
    receipt = final["receipt"]
    assert receipt["row_states"] == {"topup": ["applied", "applied", "unattempted"]}
    assert (receipt["status"], receipt["run_outcome"]) == ("unknown_outcome", "failed")
    assert receipt["set_receipt"]["members"][0]["state"] == "unknown"
    assert stack.bank.balances() == {1: 150, 2: 250, 3: 100}
    conn = sqlite3.connect(stack.bank.bank)
    try:
        stamps = conn.execute("SELECT kind FROM marque_row_stamps "
                              "ORDER BY created_at").fetchall()
    finally:
        conn.close()
    assert stamps == [("applied",), ("applied",)]  # row 2 was never resent, row 3 never sent

    # The Pilot's own ledger agrees with what the Harbourmaster shows.
    mid = (unverified_claims(token) or {})["jti"]
    shown = run_cli("effects", "receipt", "--home", stack.bank.home, mid, "n-1", "--json",
                    env=cli_env(), timeout=60)
    assert shown.returncode == 4, shown.stderr  # the Run failed: row 3 unattempted
    ledger = json.loads(shown.stdout)
    assert ledger["set_receipt"]["receipt_cid"] == receipt["set_receipt_cid"]
    [chain] = ledger["reconciliation_receipts"]
    assert chain["terminal"] is True and chain["outcome"]["state"] == "applied"
    assert [r["state"] for r in ledger["rows"]] == ["applied", "applied", "prepared"]


def test_a_row_left_unknown_at_restart_is_reported_then_settled_by_a_later_report(
        crash_stack: CrashStack) -> None:
    """Killed after row 2's commit and restarted while another writer holds the bank's write
    lock: the tombstone cannot be written, so the attempt is reported indeterminate with its
    sealed unknown_outcome receipt and the request awaits reconciliation; once the lock is
    gone the Pilot's
    periodic recovery settles row 2 applied and a later report of the same attempt brings
    the settled row states."""
    stack = crash_stack
    stack.start_pilot(crash_at="after_commit@2")
    body = effect_body(ROWS, request_id="crash-2")
    request = stack.call("POST", "/v1/requests", stack.alice, json=body).json()
    stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob, json={})
    token = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()[
        "marque"]
    holder = json.loads(stack.bank.holder_key.read_text())
    proof = make_proof(holder, token, nonce="n-1", pilot_id="p1")
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", f"http://127.0.0.1:{stack.port}/v1/executions", timeout=60,
                          json={"marque": token, "nonce": "n-1", "proof": proof}) as streamed:
            for _ in streamed.iter_lines():
                pass
    assert stack.wait_pilot() == -9

    blocker = sqlite3.connect(stack.bank.bank, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another writer: no tombstone can be written
        stack.start_pilot()
        pending = _wait(stack, request["id"], lambda r: r["executions"])
        assert [(e["nonce"], e["status"]) for e in pending["executions"]] == [
            ("n-1", "indeterminate")], pending
        assert pending["state"] == "reconciliation"
        # The recovery's indeterminate report carries the sealed unknown_outcome receipt and
        # the rows' states (docs/effects.md, choice 43), so the request in reconciliation
        # shows what is known and what is not.
        unknown = _wait(stack, request["id"], lambda r: r["receipt"] is not None)
        assert unknown["state"] == "reconciliation", unknown
        assert unknown["receipt"]["status"] == "unknown_outcome"
        assert unknown["receipt"]["set_receipt"]["status"] == "unknown_outcome"
        assert unknown["receipt"]["run_outcome"] == "needs_reconciliation"
        assert unknown["receipt"]["row_states"] == {"topup": ["applied", "unknown",
                                                              "unattempted"]}
        run = unknown["receipt"]["run_state"]
        assert (run["state"], run["next_action"]) == (
            "needs_reconciliation", {"kind": "reconcile", "effects": ["topup"]})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    final = _wait(stack, request["id"], lambda r: r["state"] == "verified"
                  and r["receipt"] is not None, seconds=60)
    assert final["state"] == "verified", final
    assert [(e["nonce"], e["status"]) for e in final["executions"]] == [("n-1", "applied")]
    receipt = final["receipt"]
    assert receipt["row_states"] == {"topup": ["applied", "applied", "unattempted"]}
    # Row 3 stays unattempted under halt (choice 18): the Run ends failed, reconciled.
    assert (receipt["run_state"]["state"], receipt["run_state"]["next_action"]) == (
        "failed", {"kind": "none"})
    assert stack.bank.balances() == {1: 150, 2: 250, 3: 100}


def test_an_effect_set_whose_ledger_was_wiped_is_verified_from_its_row_stamps(
        crash_stack: CrashStack) -> None:
    """The set applies while the Harbourmaster is away, then the Pilot's ledger is wiped: the
    new incarnation sends the request to reconciliation, and the target's row stamps — an
    Effect Set leaves no nonce-level stamp — settle it verified, never expired."""
    stack = crash_stack
    stack.start_pilot()
    body = effect_body(ROWS, request_id="wiped-1")
    request = stack.call("POST", "/v1/requests", stack.alice, json=body).json()
    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob,
                          json={"reason": "as shown"})
    assert approved.status_code == 200, approved.text
    token = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()["marque"]
    harbour_port = int(stack.server.url.rsplit(":", 1)[1])
    stack.server.stop()

    holder = json.loads(stack.bank.holder_key.read_text())
    proof = make_proof(holder, token, nonce="n-1", pilot_id="p1")
    with httpx.stream("POST", f"http://127.0.0.1:{stack.port}/v1/executions", timeout=60,
                      json={"marque": token, "nonce": "n-1", "proof": proof}) as streamed:
        lines = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
    assert lines[-1]["outcome"]["status"] == "applied", lines[-1]
    applied = stack.bank.balances()
    assert stack.proc is not None
    stack.proc.terminate()
    stack.wait_pilot()
    for suffix in ("", "-wal", "-shm"):
        (stack.bank.home / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    cli_json("pilot", "init", "--home", stack.bank.home, "--pilot-id", "p1")

    stack.server = HarbourServer(stack.harbour.home, port=harbour_port)
    stack.start_pilot()  # registers the new incarnation: the finding
    waiting = _wait(stack, request["id"], lambda r: r["state"] == "reconciliation")
    assert waiting["state"] == "reconciliation", waiting
    settled = stack.call("POST", f"/v1/requests/{request['id']}/expire",
                         stack.harbour.tokens["admin"], json={"reason": "ledger wiped"})
    assert settled.status_code == 200, settled.text
    assert settled.json()["state"] == "verified", settled.json()
    assert stack.bank.balances() == applied  # nothing ran again
