"""A joined Pilot's home opened by the CLI keeps the Harbourmaster's reports (found by soak
row 11).

`marque exec --home` and `marque reconcile --home` open the embedded Pilot
with `open_pilot`, which used to attach no Harbourmaster sink: the outbox
was drained into the local logbook and acknowledged there, so an outcome
reached or reconciled that way while the Harbourmaster was away never
reached it — the request stayed `prepared` although its marque had applied.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from support.harbour import (
    MARQUE,
    READ,
    TIMEOUT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    cli_json,
    free_port,
    request_body,
)


def _cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MARQUE), *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=TIMEOUT, env=cli_env(), stdin=subprocess.DEVNULL)


def _unacked(bank: PilotBank) -> int:
    conn = sqlite3.connect(bank.home / "ledger.sqlite3")
    try:
        [(left,)] = conn.execute("SELECT count(*) FROM outbox WHERE acked_at IS NULL")
    finally:
        conn.close()
    return int(left)


def test_exec_and_reconcile_on_a_joined_home_keep_reports_for_the_harbourmaster(
        tmp_path: Path) -> None:
    """Executed with `exec --home` and reconciled with `reconcile --home` while the
    Harbourmaster is down: the report stays unacknowledged; once it is back, `reconcile`
    delivers it, the request is verified, and its logbook has it once."""
    harbour = Harbour(tmp_path / "harbour")
    pilot_token = harbour.add("p1", "pilot")
    bank = PilotBank(tmp_path / "site", harbour, pilot_id="p1")
    harbour.add("alice", "requester", key=bank.holder_pub)
    server = HarbourServer(harbour.home)
    port = int(server.url.rsplit(":", 1)[1])
    try:
        cli_json("pilot", "join", "--home", bank.home, "--harbour", server.url, "--token",
                 pilot_token, "--url", f"http://127.0.0.1:{free_port()}")
        made = server.call("POST", "/v1/requests", harbour.tokens["alice"],
                           json=request_body(READ, request_id="read-1"))
        assert made.status_code == 201, made.text
        request = made.json()
        marque = server.call("GET", f"/v1/requests/{request['id']}/marque",
                             harbour.tokens["alice"]).json()
    finally:
        server.stop()
    (tmp_path / "marque.jws").write_text(marque["marque"])

    ran = _cli("exec", "--home", bank.home, "--marque", tmp_path / "marque.jws", "--key",
               bank.holder_key, "--nonce", "n-1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["status"] == "applied", ran.stdout
    assert _unacked(bank) == 1, "acknowledged without the Harbourmaster"
    assert _cli("reconcile", "--home", bank.home).returncode == 0
    assert _unacked(bank) == 1, "acknowledged without the Harbourmaster"

    back = HarbourServer(harbour.home, port=port)
    try:
        assert _cli("reconcile", "--home", bank.home).returncode == 0
        assert _unacked(bank) == 0
        state = back.call("GET", f"/v1/requests/{request['id']}", harbour.tokens["admin"])
        assert state.json()["state"] == "verified", state.text
        entries = back.call("GET", "/v1/logbook", harbour.tokens["admin"],
                            params={"kind": "execution.", "limit": 100}).json()["entries"]
        assert [e["kind"] for e in entries
                if e["body"].get("marque_id") == marque["marque_id"]] == ["execution.applied"]
    finally:
        back.stop()
