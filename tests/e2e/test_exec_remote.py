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
import threading
import time

import pytest
from e2e_support import EXIT, MARQUE, Service, World, cli_env, json_lines, one_json
from support.harbour import free_port
from support.pgproxy import close_socket

from marque.token import new_key

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
SLOW = (
    "UPDATE accounts SET balance = balance - 10 + (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x+1 FROM c WHERE x < 4000000) SELECT count(*) - count(*) FROM c) WHERE id = 1"
)


class HttpCutter:
    """A loopback TCP proxy in front of a service that can cut the network, not the service.

    ``sever()`` closes every connection through it now (new ones still pass);
    ``drop_posts`` closes, without forwarding it, that many executions' POSTs.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.drop_posts = 0
        self.dropped = 0
        #: Connections the proxy accepted: how many a client opened.
        self.accepted = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def sever(self) -> None:
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            close_socket(sock)

    def close(self) -> None:
        self.listener.close()
        self.sever()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._open.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and data.startswith(b"POST /v1/executions"):
                    with self._lock:
                        drop = self.drop_posts > 0
                        self.drop_posts -= drop
                        self.dropped += drop
                    if drop:
                        break
                dst.sendall(data)
        except OSError:
            pass
        close_socket(src)
        close_socket(dst)


def _exec_in_background(world: World, url: str, marque: object,
                        nonce: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(MARQUE), *map(str, remote(world, url, marque, nonce))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli_env(), cwd=world.root)




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


def test_one_client_runs_many_executions_over_one_connection(
        world: World, service: Service) -> None:
    """The client exec --pilot uses reads each stream to its end, so its connection serves
    the next execution too (a stream left half-read took its connection with it)."""
    from marque.clients.pilot import PilotClient
    from marque.token import make_proof

    marque = world.issue([DEBIT], executions=3)
    token = marque.read_text().strip()
    holder = json.loads(world.holder_key.read_text())
    cutter = HttpCutter(int(service.url.rsplit(":", 1)[1]))
    client = PilotClient(cutter.url)
    try:
        for nonce in ("n1", "n2", "n3"):
            events: list[dict[str, object]] = []
            outcome = client.execute(token, nonce, lambda nonce=nonce: make_proof(
                holder, token, nonce=nonce, pilot_id=world.pilot_id), events.append)
            assert (outcome.status, outcome.replayed) == ("applied", False)
            assert events[0]["event"] == "claimed" and "committed" in [e["event"] for e in events]
    finally:
        client.close()
        cutter.close()
    assert cutter.accepted == 1
    assert world.balances()[1] == 70


def test_a_client_with_a_proxy_in_its_environment_goes_through_it(
        world: World, service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """Executions skip httpx's Client.send for its transport, but not the environment's
    proxy: with HTTP_PROXY set they travel through it (here a forwarding proxy in front
    of the service), and apply once each over its one connection."""
    from marque.clients.pilot import PilotClient
    from marque.token import make_proof

    marque = world.issue([DEBIT], executions=2)
    token = marque.read_text().strip()
    holder = json.loads(world.holder_key.read_text())
    proxy = HttpCutter(int(service.url.rsplit(":", 1)[1]))
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    client = PilotClient(service.url)
    try:
        for nonce in ("x1", "x2"):
            outcome = client.execute(token, nonce, lambda nonce=nonce: make_proof(
                holder, token, nonce=nonce, pilot_id=world.pilot_id))
            assert (outcome.status, outcome.replayed) == ("applied", False)
    finally:
        client.close()
        proxy.close()
    assert proxy.accepted == 1
    assert world.balances()[1] == 80


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
    marque = world.issue([DEBIT])
    res = world.run(*remote(world, f"http://127.0.0.1:{free_port()}", marque, "n1"))
    assert res.returncode == 7, res
    assert one_json(res.stdout)["error"]["code"] == "pilot_unavailable"
    assert world.balances()[1] == 100


def test_losing_the_service_mid_execution_follows_the_same_execution(world: World) -> None:
    """The service is killed mid-statement and restarted: exec reconnects, runs nothing twice."""
    marque = world.issue([SLOW], attempts=3)
    first = Service(world)
    port = int(first.url.rsplit(":", 1)[1])
    proc = _exec_in_background(world, first.url, marque, "k1")
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


def test_a_connection_cut_mid_execution_follows_it_to_its_outcome(
        world: World, service: Service) -> None:
    """The network drops mid-statement, the service lives: exec follows it to applied, once."""
    marque = world.issue([SLOW], attempts=3)
    cutter = HttpCutter(int(service.url.rsplit(":", 1)[1]))
    proc = _exec_in_background(world, cutter.url, marque, "c1")
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # wait until the statement runs on the service
            seen.append(line)
            if '"statement_started"' in line:
                break
        cutter.sever()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        cutter.close()
    events = json_lines("".join(seen) + err)
    kinds = [e["event"] for e in events]
    assert "reconnected" in kinds, err
    assert not any(e.get("reposted") for e in events)  # followed, never posted again
    assert "committed" in kinds[kinds.index("reconnected"):], kinds
    body = one_json(out)
    assert (body["status"], body["attempt"]) == ("applied", 1), body
    assert proc.returncode == EXIT["applied"]
    assert world.balances()[1] == 90
    assert world.ledger_count("attempts") == 1


def test_a_post_lost_before_the_service_saw_it_is_posted_again_once(
        world: World, service: Service) -> None:
    """The POST is cut before reaching the service: the follow says never claimed, exec posts
    it again under the same nonce, and it applies exactly once."""
    marque = world.issue([DEBIT], executions=1)
    cutter = HttpCutter(int(service.url.rsplit(":", 1)[1]))
    cutter.drop_posts = 1
    try:
        res = world.run(*remote(world, cutter.url, marque, "p1"))
    finally:
        cutter.close()
    assert cutter.dropped == 1
    assert res.returncode == EXIT["applied"], res
    [back] = [e for e in json_lines(res.stderr) if e["event"] == "reconnected"]
    assert back["reposted"] is True and back["nonce"] == "p1"
    assert (res.json["status"], res.json["attempt"], res.json["replayed"]) == ("applied", 1, False)
    assert world.balances()[1] == 90
    assert world.ledger_count("attempts") == 1


def test_an_applied_exec_settled_behind_its_answer_says_nothing_alarming(
        world: World, service: Service) -> None:
    """The service answers an applied write before its ledger records it (settling behind
    the answer, its default): that is the normal path, so the human output asks nothing
    of the operator — no "not yet recorded", no warning about nonces."""
    marque = world.issue([DEBIT])
    res = world.run("exec", "--pilot", service.url, "--marque", marque, "--key",
                    world.holder_key, "--nonce", "n1")
    assert res.returncode == EXIT["applied"], res
    assert "settle_behind" in res.stderr  # it was answered ahead of its record
    assert res.stdout.startswith("applied marque "), res
    assert res.stdout.startswith("applied marque ") and res.stdout.count("\n") == 1, res
    for said in (res.stdout, res.stderr):
        assert "not yet recorded" not in said and "Do not retry" not in said, said
    assert world.balances()[1] == 90
