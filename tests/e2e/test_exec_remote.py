"""`marque exec --pilot URL`: executing through a real `marque pilot serve` process.

The CLI streams the service's events, exits with the outcome's status, answers
refusals with their code, says the service is unavailable (exit 7) when it
cannot reach it, and — when it loses the service mid-execution — gets back to
the same execution instead of starting another.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from e2e_support import EXIT, MARQUE, Service, World, cli_env, json_lines, one_json

from marque.token import new_key

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
SLOW = (
    "UPDATE accounts SET balance = balance - 10 + (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x+1 FROM c WHERE x < 4000000) SELECT count(*) - count(*) FROM c) WHERE id = 1"
)


@pytest.fixture
def service(world: World) -> Iterator[Service]:
    running = Service(world)
    try:
        yield running
    finally:
        running.stop()


def remote(world: World, url: str, marque: object, nonce: str, key: object = None) -> list[str]:
    return ["exec", "--pilot", url, "--marque", marque, "--key", key or world.holder_key,
            "--nonce", nonce, "--json"]


def test_exec_through_the_service_applies_once(world: World, service: Service) -> None:
    """exec --pilot: events on stderr, the outcome on stdout, exit 0; a retry replays."""
    marque = world.issue([DEBIT])
    res = world.run(*remote(world, service.url, marque, "n1"))
    assert res.returncode == EXIT["applied"], res
    body = res.json
    assert (body["status"], body["attempt"], body["replayed"]) == ("applied", 1, False)
    assert body["pilot"]["id"] == world.pilot_id
    kinds = res.kinds()
    assert kinds[0] == "claimed" and "committed" in kinds
    again = world.run(*remote(world, service.url, marque, "n1"))
    assert again.returncode == 0 and again.json["replayed"] is True
    assert world.balances()[1] == 90


def test_a_refusal_through_the_service_is_exit_3_with_its_code(
        world: World, service: Service) -> None:
    """A proof by another key is refused: exit 3, pop_key_mismatch, nothing claimed."""
    marque = world.issue([DEBIT])
    stranger = world.root / "stranger.jwk"
    stranger.write_text(json.dumps(new_key()))
    res = world.run(*remote(world, service.url, marque, "n1", key=stranger))
    assert res.returncode == EXIT["refused"], res
    assert res.json["error"]["code"] == "pop_key_mismatch"
    assert res.json["status"] == "refused"
    assert world.ledger_count("claims") == 0


def test_a_service_that_cannot_be_reached_is_exit_7(world: World) -> None:
    """Nothing listens there: pilot_unavailable, exit 7, nothing happened."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    marque = world.issue([DEBIT])
    res = world.run(*remote(world, f"http://127.0.0.1:{port}", marque, "n1"))
    assert res.returncode == 7, res
    assert one_json(res.stdout)["error"]["code"] == "pilot_unavailable"
    assert world.balances()[1] == 100


def test_losing_the_service_mid_execution_follows_the_same_execution(world: World) -> None:
    """The service is killed mid-statement and restarted: exec reconnects, runs nothing twice."""
    marque = world.issue([SLOW], attempts=3)
    first = Service(world)
    port = int(first.url.rsplit(":", 1)[1])
    proc = subprocess.Popen(
        [str(MARQUE), *map(str, remote(world, first.url, marque, "k1"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli_env(), cwd=world.root)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until the statement runs on the service
            if '"statement_started"' in line:
                break
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
        time.sleep(0.5)
        second = Service(world, port=port)  # the same address, a new process
        try:
            out, err = proc.communicate(timeout=90)
        finally:
            second.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
    events = json_lines(err)
    kinds = [e["event"] for e in events]
    assert "reconnected" in kinds, err
    body = one_json(out)
    # Killed before COMMIT: the restarted service's recovery tombstones attempt 1, and the
    # follow reports that — it never starts a second execution on its own.
    assert (body["status"], body["attempt"]) == ("aborted_not_applied", 1), body
    assert proc.returncode == EXIT["aborted_not_applied"]
    assert world.balances()[1] == 100
    [stamp] = [s for s in world.stamps() if s["nonce"] == "k1"]
    assert (stamp["kind"], stamp["attempt"]) == ("tombstone", 1)
    assert world.ledger_count("attempts") == 1
