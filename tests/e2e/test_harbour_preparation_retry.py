"""A request whose Pilot is down moves on: real `harbour serve` processes retry its preview.

The Pilot is registered at a loopback port nothing listens on. A request made
through the CLI without ``--request-id`` is answered ``pilot_unavailable``
naming the stored request; the Harbourmaster then tries the preview again on
the schedule ``--preview-retry`` gives (short here, by configuration), and
after the last attempt the request is ``failed`` with ``pilot_unavailable`` and
a message saying what to do. Two processes share one store (SQLite and
PostgreSQL) and each attempt is made once; a request a killed process left
``preparing`` — between attempts, or in the middle of one — is finished by the
next one; a Pilot that comes back in time
gets the request previewed and waiting for approval.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import Result, run_cli
from support.harbour import (
    DEBIT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    free_port,
    request_body,
)
from support.wait import wait_until

#: Three tries after the first, a second apart.
FAST = ("--preview-retry", "1s,1s,1s")


class Down:
    """A Harbourmaster home (bootstrap profile) whose Pilot ``p1`` is registered at a
    port nothing listens on (its bank home is made, not started)."""

    def __init__(self, root: Path, store: str | None) -> None:
        self.harbour = Harbour(root / "harbour", store=store)
        self.bank = PilotBank(root / "p1", self.harbour)
        self.alice = self.harbour.add("alice", "requester", key=self.bank.holder_pub)
        self.bob = self.harbour.add("bob", "approver")
        self.audra = self.harbour.add("audra", "auditor")
        self.p1 = self.harbour.add("p1", "pilot")
        self.port = free_port()
        self.bank.url = f"http://127.0.0.1:{self.port}"
        self.servers: list[HarbourServer] = []

    def serve(self, *args: str) -> HarbourServer:
        server = HarbourServer(self.harbour.home, args=args)
        self.servers.append(server)
        if len(self.servers) == 1:
            registered = server.call("POST", "/v1/pilots", self.p1,
                                     json=self.bank.registration())
            assert registered.status_code == 200, registered.text
        return server

    def cli(self, server: HarbourServer, token: str, *args: Any) -> Result:
        env = cli_env({"MARQUE_HARBOUR": server.url, "MARQUE_TOKEN": token})
        return run_cli(*args, env=env, timeout=60)

    def ask(self, server: HarbourServer) -> dict[str, Any]:
        """``marque request`` without ``--request-id``: refused pilot_unavailable (exit 7),
        naming the stored request, which waits ``preparing``."""
        asked = self.cli(server, self.alice, "request", "--pilot", "p1", "--target", "bank",
                         "--sql", DEBIT, "--executions", 1, "--max-rows", 1, "--json")
        assert asked.returncode == 7, asked
        error = asked.json["error"]
        assert error["code"] == "pilot_unavailable", error
        assert error["detail"]["state"] == "preparing" and error["detail"]["attempt"] == 1
        assert asked.json["id"] == error["detail"]["id"]
        return dict(asked.json)

    def show(self, server: HarbourServer, rq: str) -> dict[str, Any]:
        shown = self.cli(server, self.alice, "requests", "show", rq, "--json")
        assert shown.returncode == 0, shown
        return dict(shown.json)

    def wait_until_not(self, server: HarbourServer, rq: str, state: str,
                       seconds: float = 60) -> dict[str, Any]:
        seen: list[dict[str, Any]] = []

        def moved() -> bool:
            seen.append(self.show(server, rq))
            return seen[-1]["state"] != state

        wait_until(moved, timeout=seconds, step=0.3)
        return seen[-1]

    def deferrals(self, server: HarbourServer, rq: str) -> list[dict[str, Any]]:
        answer = server.call("GET", f"/v1/requests/{rq}/logbook", self.audra)
        assert answer.status_code == 200, answer.text
        return [e for e in answer.json()["entries"]
                if e["kind"] == "request.preparation_deferred"]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.bank.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def down(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Down]:
    store = None if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    world = Down(tmp_path, store)
    try:
        yield world
    finally:
        world.stop()


def _assert_failed_unavailable(shown: dict[str, Any]) -> None:
    assert shown["state"] == "failed", shown
    assert shown["failure"]["code"] == "pilot_unavailable", shown["failure"]
    assert "ask for the change again" in shown["failure"]["message"], shown["failure"]
    assert shown["marque"] is None and shown["checkpoint"] is None


def test_two_serve_processes_retry_a_preparation_once_each_then_fail_it(down: Down) -> None:
    """Each scheduled attempt is made exactly once across two processes sharing the store,
    and after the last the request is failed with pilot_unavailable and the next step."""
    first, second = down.serve(*FAST), down.serve(*FAST)
    asked = down.ask(first)
    rq = asked["id"]
    # The other process reads the same stored request. Its 1 s schedule may have run out
    # already on a loaded machine, so either state is right here; the order is checked below.
    waiting = down.show(second, rq)
    assert waiting["state"] in ("preparing", "failed"), waiting
    assert waiting["failure"]["code"] == "pilot_unavailable"  # why it has not moved (yet)
    shown = down.wait_until_not(second, rq, "preparing")
    _assert_failed_unavailable(shown)
    # The first attempt (the submission's) and the two after it were deferred; the fourth,
    # the last, failed the request: no attempt was made twice.
    assert [e["body"]["attempt"] for e in down.deferrals(first, rq)] == [1, 2, 3]
    human = down.cli(first, down.alice, "requests", "show", rq)
    assert "pilot_unavailable" in human.stdout and "failed" in human.stdout, human


def test_a_request_left_preparing_by_a_killed_process_is_finished_by_the_next(
        down: Down) -> None:
    """The process that took the request dies; a new `harbour serve` carries on its
    schedule from the store."""
    dying = down.serve("--preview-retry", "2s,1s")
    rq = down.ask(dying)["id"]
    dying.stop(signal.SIGKILL)
    down.servers.remove(dying)
    again = down.serve("--preview-retry", "2s,1s")
    _assert_failed_unavailable(down.wait_until_not(again, rq, "preparing"))
    assert [e["body"]["attempt"] for e in down.deferrals(again, rq)] == [1, 2]


@pytest.fixture
def down_sqlite(tmp_path: Path) -> Iterator[Down]:
    world = Down(tmp_path, None)
    try:
        yield world
    finally:
        world.stop()


def test_an_attempt_whose_process_died_mid_preview_is_made_again_after_its_lease(
        down_sqlite: Down) -> None:
    """The Pilot's port accepts and never answers, and the process dies while waiting on
    it: nothing was recorded of that attempt, so the next process takes the request over
    once it has been untouched for the lease (60 s), and carries it to the end."""
    down = down_sqlite
    silent = socket.socket()
    silent.bind(("127.0.0.1", down.port))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    try:
        dying = down.serve("--preview-retry", "1s,1s")
        body = request_body(DEBIT, request_id="stuck-1")
        hung = threading.Thread(target=lambda: _ignore_errors(
            lambda: dying.call("POST", "/v1/requests", down.alice, json=body)), daemon=True)
        hung.start()
        listed: list[dict[str, Any]] = wait_until(
            lambda: dying.call("GET", "/v1/requests", down.alice).json()["requests"],
            timeout=30, step=0.1)
        [stuck] = listed
        assert stuck["state"] == "preparing" and stuck["failure"] is None
        dying.stop(signal.SIGKILL)
        down.servers.remove(dying)
    finally:
        silent.close()  # from now on the Pilot's port refuses at once
    again = down.serve("--preview-retry", "1s,1s")
    shown = down.wait_until_not(again, stuck["id"], "preparing", seconds=120)
    _assert_failed_unavailable(shown)
    assert [e["body"]["attempt"] for e in down.deferrals(again, stuck["id"])] == [1, 2]


def _ignore_errors(call: Any) -> None:
    try:
        call()
    except httpx.HTTPError:
        pass  # the process answering it was killed: that is the point


def test_a_pilot_back_in_time_gets_the_request_previewed(down: Down) -> None:
    """A retry that reaches the Pilot previews the request as the submission would have:
    it waits for approval, and the failure it carried while waiting is gone."""
    server = down.serve("--preview-retry", "2s,2s,2s,2s,2s")
    rq = down.ask(server)["id"]
    down.bank.start(listen=f"127.0.0.1:{down.port}")
    shown = down.wait_until_not(server, rq, "preparing")
    assert shown["state"] == "awaiting_approval", shown
    assert shown["failure"] is None and shown["preview"]["total_rows"] == 1


def test_serve_refuses_a_bad_preview_retry(tmp_path: Path) -> None:
    """A schedule that is not durations is input_invalid, before anything listens."""
    harbour = Harbour(tmp_path / "harbour")
    refused = run_cli("harbour", "serve", "--home", harbour.home, "--listen", "127.0.0.1:0",
                      "--preview-retry", "soon", "--json", env=cli_env())
    assert refused.returncode == 2, refused
    assert refused.json["error"]["code"] == "input_invalid"
