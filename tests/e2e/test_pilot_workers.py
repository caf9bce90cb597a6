"""`marque pilot serve --workers N`: several Pilot processes on one socket and one ledger.

Nothing but the ledger keeps the workers apart, so these tests put several
workers on the same nonces at once, kill workers mid-execution, and check that
each nonce still applied exactly once and that the service replaces what died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from e2e_support import MARQUE, Service, World, cli_env
from test_pilot_service import DEBIT, SLOW, body


def _post(url: str, payload: dict[str, str]) -> dict[str, Any]:
    with httpx.Client(timeout=60) as client:  # a fresh connection: any worker may take it
        response = client.post(f"{url}/v1/executions", json=payload)
    assert response.status_code == 200, response.text
    last: dict[str, Any] = json.loads(response.text.splitlines()[-1])
    assert last["event"] == "outcome", last
    return dict(last["outcome"])


def _processes_answering(url: str, tries: int = 200) -> set[str]:
    seen: set[str] = set()
    for _ in range(tries):
        with httpx.Client(timeout=30) as client:
            seen.add(client.get(f"{url}/v1/health").json()["process"])
        if len(seen) > 1:
            break
    return seen


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_workers_share_the_socket_and_apply_each_nonce_once(world: World) -> None:
    """Eight nonces, each posted three times at once over fresh connections: eight applies."""
    nonces = [f"w{i}" for i in range(8)]
    marque = world.issue([DEBIT], executions=8)
    service = Service(world, workers=2)
    try:
        assert len(_processes_answering(service.url)) == 2  # both workers take connections
        payloads = [body(world, marque, n) for n in nonces for _ in range(3)]
        with ThreadPoolExecutor(12) as pool:
            outcomes = list(pool.map(lambda p: _post(service.url, p), payloads))
    finally:
        assert service.stop() == 0
    assert world.balances()[1] == 100 - 8 * 10
    assert world.ledger_count("claims") == 8
    for nonce in nonces:
        answers = [o for o, p in zip(outcomes, payloads, strict=True) if p["nonce"] == nonce]
        fresh = [o for o in answers if not o["replayed"]]
        assert len(fresh) == 1 and fresh[0]["status"] == "applied"
        assert all(o["status"] in ("applied", "in_progress") for o in answers)


def test_a_killed_worker_is_replaced_and_its_execution_settles(world: World) -> None:
    """SIGKILL of every worker mid-statement: the service replaces them, and a follow on the
    new workers settles the attempt by reconciliation; a retry then applies it once."""
    marque = world.issue([SLOW], attempts=3)
    marque_id = world.marque_id(marque)
    service = Service(world, workers=2)
    try:
        before = _children(service.proc.pid)
        assert len(before) == 2
        try:
            with httpx.stream("POST", f"{service.url}/v1/executions",
                              json=body(world, marque, "k1"), timeout=60) as response:
                for line in response.iter_lines():
                    if json.loads(line)["event"] == "statement_started":
                        break
                for pid in before:
                    os.kill(pid, signal.SIGKILL)
        except httpx.HTTPError:
            pass  # the stream dies with its worker
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = _children(service.proc.pid)
            if len(now) == 2 and not set(now) & set(before):
                break
            time.sleep(0.1)
        assert len(now) == 2 and not set(now) & set(before), (before, now)
        assert service.proc.poll() is None  # the supervisor itself lives on

        followed = httpx.get(f"{service.url}/v1/executions/{marque_id}/k1",
                             params={"follow": "true"}, timeout=60)
        outcome = json.loads(followed.text.splitlines()[-1])["outcome"]
        assert outcome["status"] == "aborted_not_applied"  # killed before COMMIT
        final = _post(service.url, body(world, marque, "k1"))
        assert (final["status"], final["attempt"]) == ("applied", 2)
    finally:
        assert service.stop() == 0
    assert world.balances()[1] == 90
    assert _children(service.proc.pid) == []


def test_a_worker_that_cannot_start_stops_the_service(world: World) -> None:
    """A home whose ledger is unreadable: no worker opens, the service exits with its error."""
    ledger = world.home / "ledger.sqlite3"
    ledger.write_bytes(b"this is not a ledger")
    proc = subprocess.run(
        [str(MARQUE), "pilot", "serve", "--home", str(world.home), "--listen",
         "127.0.0.1:0", "--json", "--workers", "2"],
        capture_output=True, text=True, timeout=60, env=cli_env(), cwd=world.root)
    assert proc.returncode == 7, proc
    assert json.loads(proc.stdout.splitlines()[0])["error"]["code"] == "ledger_corrupt"
