"""The control-plane CLI as real processes against a real `harbour serve` and `pilot serve`.

The whole story runs through `marque` subprocesses only: a requester asks for
a write under the bootstrap profile, sees it wait for approval with its
preview, cannot approve it herself, an approver approves, the requester runs
it with `exec --request`, the Pilot reports, and the logbook verifies over
HTTP. Around it: a POST whose answer is lost is retried under the same id and
lands one request; requests are found by `rq_` id and by the caller's own id;
a saved signed head catches a logbook whose tail was cut (and whose head row
was rewound to match) in the SQLite store.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Result, run_cli
from support.harbour import (
    DEBIT,
    MARQUE,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    cli_json,
    free_port,
    new_public_key,
)


def cli(*args: Any, token: str | None = None, harbour: str | None = None,
        timeout: float = 60) -> Result:
    """``marque ARGS`` with MARQUE_HARBOUR / MARQUE_TOKEN set (never a stray one)."""
    env = cli_env()
    if harbour is not None:
        env["MARQUE_HARBOUR"] = harbour
    if token is not None:
        env["MARQUE_TOKEN"] = token
    return run_cli(*args, env=env, timeout=timeout)


class Stack:
    """A Harbourmaster (bootstrap profile) serving, a joined Pilot serving, four principals."""

    def __init__(self, root: Path) -> None:
        self.harbour = Harbour(root / "harbour")
        self.bank = PilotBank(root / "pilotbank", self.harbour)
        # Alice may also approve, so that approving her own request is refused as
        # self_approval (a matter of who asked), not as a missing role.
        self.alice = self.harbour.add("alice", "requester", "approver",
                                      key=self.bank.holder_pub)
        self.carol = self.harbour.add("carol", "requester",
                                      key=new_public_key(root / "carol.pub.jwk"))
        self.dave = self.harbour.add("dave", "requester",
                                     key=new_public_key(root / "dave.pub.jwk"))
        self.bob = self.harbour.add("bob", "approver")
        self.audra = self.harbour.add("audra", "auditor")
        self.pilot_token = self.harbour.add("p1", "pilot")
        self.admin = self.harbour.tokens["admin"]
        self.server = HarbourServer(self.harbour.home)
        self.url = self.server.url
        # The Pilot joins at the URL it will serve on, then serves there: `pilot serve`
        # registers at start and reports to the Harbourmaster it joined.
        port = free_port()
        joined = cli_json("pilot", "join", "--home", self.bank.home, "--harbour", self.url,
                          "--token", self.pilot_token, "--url", f"http://127.0.0.1:{port}")
        assert joined["pilot_id"] == "p1"
        self.bank.start(listen=f"127.0.0.1:{port}")  # stopped with the bank

    def as_(self, token: str, *args: Any, timeout: float = 60) -> Result:
        return cli(*args, token=token, harbour=self.url, timeout=timeout)

    def stop(self) -> None:
        self.bank.stop()
        self.server.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the tests below the story: each works as a requester of its own."""
    running = Stack(tmp_path_factory.mktemp("shared"))
    try:
        yield running
    finally:
        running.stop()


def request_args(*extra: Any, sql: str = DEBIT) -> list[Any]:
    return ["request", "--pilot", "p1", "--target", "bank", "--sql", sql, "--executions", 1,
            "--max-rows", 1, *extra, "--json"]


def wait_for_state(stack: Stack, rq: str, state: str, seconds: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        shown = stack.as_(stack.alice, "requests", "show", rq, "--json")
        assert shown.returncode == 0, shown
        if shown.json["state"] == state or time.monotonic() > deadline:
            return shown.json
        time.sleep(0.3)


# -- the whole story -------------------------------------------------------------------------


def test_the_whole_story_through_the_cli(stack: Stack) -> None:
    asked = stack.as_(stack.alice, *request_args("--reason", "refund 10"))
    assert asked.returncode == 0, asked
    request = asked.json
    rq = request["id"]
    assert rq.startswith("rq_")
    # No --request-id: one was generated, said on stderr before the POST, and is the request's.
    said = [e for e in asked.events if e.get("event") == "request_id"]
    assert said == [{"event": "request_id", "request_id": request["request_id"],
                     "generated": True}]
    # A write under the bootstrap profile waits for one approver, with the exact preview shown.
    assert request["state"] == "awaiting_approval"
    assert request["routing"]["outcome"] == "delegate"
    assert request["preview"]["total_rows"] == 1 and request["preview"]["within_max_rows"]
    assert request["checkpoint"]["cid"] and request["marque"] is None
    assert stack.bank.balances() == {1: 100, 2: 100}  # the preview was rolled back

    shown = stack.as_(stack.bob, "requests", "show", rq)  # the human form, for an approver
    assert shown.returncode == 0, shown
    assert "awaiting_approval" in shown.stdout and "preview" in shown.stdout
    assert f"marque approve {rq}" in shown.stdout

    own = stack.as_(stack.alice, "approve", rq, "--reason", "looks fine to me", "--json")
    assert own.returncode == 3, own
    assert own.json["error"]["code"] == "self_approval"
    assert stack.as_(stack.alice, "exec", "--request", rq, "--key", stack.bank.holder_key,
                     "--nonce", "n1", "--json").json["error"]["code"] == "conflict"

    approved = stack.as_(stack.bob, "approve", rq, "--reason", "checked the preview", "--json")
    assert approved.returncode == 0, approved
    assert approved.json["state"] == "prepared"
    assert approved.json["marque"]["marque_id"].startswith("mq_")
    [resolution] = approved.json["resolutions"]
    assert (resolution["approver"], resolution["decision"]) == ("bob", "approve")

    ran = stack.as_(stack.alice, "exec", "--request", rq, "--key", stack.bank.holder_key,
                    "--nonce", "n1", "--json")
    assert ran.returncode == 0, ran
    assert ran.json["status"] == "applied" and ran.json["rows_affected"] == 1
    assert ran.json["marque_id"] == approved.json["marque"]["marque_id"]
    again = stack.as_(stack.alice, "exec", "--request", request["request_id"], "--key",
                      stack.bank.holder_key, "--nonce", "n1", "--json")
    assert again.returncode == 0 and again.json["replayed"] is True, again
    assert stack.bank.balances() == {1: 90, 2: 100}  # exactly once
    # Only the requester who owns it may fetch the marque.
    theirs = stack.as_(stack.carol, "exec", "--request", rq, "--key", stack.bank.holder_key,
                       "--nonce", "n2", "--json")
    assert theirs.returncode == 2 and theirs.json["error"]["code"] == "not_found", theirs

    final = wait_for_state(stack, rq, "verified")
    assert final["state"] == "verified", final
    assert [(e["nonce"], e["status"]) for e in final["executions"]] == [("n1", "applied")]

    tail = stack.as_(stack.audra, "logbook", "tail", "--kind", "execution.", "--json")
    assert tail.returncode == 0, tail
    assert [e["kind"] for e in tail.json["entries"]] == ["execution.applied"]
    verified = stack.as_(stack.audra, "logbook", "verify", "--json")
    assert verified.returncode == 0, verified
    assert verified.json["intact"] is True and verified.json["entries"] >= 8
    kinds = [e["kind"] for e in stack.as_(stack.audra, "logbook", "tail",
                                          "--json").json["entries"]]
    for kind in ("checkpoint.sealed", "marque.issued", "execution.applied"):
        assert kinds.count(kind) == 1, kinds


def _doc_heredoc(page: str, name: str) -> str:
    """The file a docs page writes with ``cat > NAME <<'EOF'`` in one of its examples."""
    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text(encoding="utf-8")
    opening = f"cat > {name} <<'EOF'\n"
    start = text.index(opening) + len(opening)
    return text[start:text.index("\nEOF\n", start) + 1]


def test_the_routing_example_for_the_tours_bank_routes_as_docs_harbour_says(
        stack: Stack) -> None:
    """docs/harbour.md's routing config for the README tour's SQLite bank, adopted on a
    real Harbourmaster: the tour's debit waits on a preview for two approvers, a read of
    `accounts` gets its marque at once; the PostgreSQL example's config, adopted on the
    same bank, matches nothing there (`public.accounts` is not SQLite's `main.accounts`)."""
    adopted = stack.harbour.set_routing(_doc_heredoc("harbour.md", "bank-routing.toml"))
    assert adopted["config_cid"].startswith("sha256:"), adopted
    debit = stack.as_(stack.alice, *request_args("--param", "[1]",
                                                 sql=DEBIT.replace("= 1", "= ?")))
    assert debit.returncode == 0, debit
    routed = debit.json
    assert routed["state"] == "awaiting_approval", routed
    assert routed["routing"]["outcome"] == "delegate"
    assert routed["routing"]["approvals"] == 2
    assert routed["routing"]["config_cid"] == adopted["config_cid"]
    assert routed["preview"]["total_rows"] == 1
    read = stack.as_(stack.alice, *request_args(sql="SELECT balance FROM accounts WHERE id = 1"))
    assert read.returncode == 0, read
    assert read.json["state"] == "prepared" and read.json["marque"] is not None, read.json

    stack.harbour.set_routing(_doc_heredoc("harbour.md", "routing.toml"))
    elsewhere = stack.as_(stack.alice, *request_args("--request-id", "pg-shaped"))
    assert elsewhere.returncode == 3, elsewhere
    assert elsewhere.json["error"]["code"] == "account_no_match", elsewhere
    assert stack.bank.balances() == {1: 100, 2: 100}


# -- a lost answer is retried under the same id --------------------------------------------


class DropFirstAnswer:
    """A TCP proxy that forwards everything, except the first connection's answer: the server
    handles that request fully, then the client's connection is closed without a byte."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(self.upstream)
            drop = self.connections == 1
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, drop), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, drop: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or drop:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if drop:
                self.dropped.set()
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_request_whose_answer_was_lost_is_retried_with_the_same_id_and_lands_once(
        shared: Stack) -> None:
    stack = shared
    proxy = DropFirstAnswer(stack.url)
    try:
        asked = cli(*request_args("--reason", "lost answer"), token=stack.dave,
                    harbour=proxy.url)
    finally:
        proxy.close()
    assert asked.returncode == 0, asked
    assert proxy.dropped.is_set() and proxy.connections >= 2
    events = asked.events
    [generated] = [e for e in events if e["event"] == "request_id"]
    retries = [e for e in events if e["event"] == "retrying"]
    assert retries and all(e["request_id"] == generated["request_id"] for e in retries)
    assert asked.json["request_id"] == generated["request_id"]

    listed = stack.as_(stack.dave, "requests", "--json")
    assert listed.returncode == 0, listed
    assert [(r["id"], r["request_id"]) for r in listed.json["requests"]] == [
        (asked.json["id"], generated["request_id"])]
    assert asked.json["state"] == "awaiting_approval"


# -- finding requests; rejecting --------------------------------------------------------------


def test_requests_by_rq_id_and_by_own_request_id_and_reject_needs_a_reason(
        shared: Stack) -> None:
    stack = shared
    asked = stack.as_(stack.alice, *request_args("--request-id", "pay-42"))
    assert asked.returncode == 0, asked
    rq = asked.json["id"]
    assert asked.json["request_id"] == "pay-42"
    assert not [e for e in asked.events if e.get("event") == "request_id"]  # not generated
    # The same id and intent answers the same request; another intent under it is refused.
    same = stack.as_(stack.alice, *request_args("--request-id", "pay-42"))
    assert same.returncode == 0 and same.json["id"] == rq, same
    other = stack.as_(stack.alice, *request_args("--request-id", "pay-42", "--max-rows", 2))
    assert other.returncode == 2 and other.json["error"]["code"] == "conflict", other

    by_rq = stack.as_(stack.alice, "requests", "show", rq, "--json")
    by_own = stack.as_(stack.alice, "requests", "show", "pay-42", "--json")
    assert by_rq.returncode == by_own.returncode == 0, (by_rq, by_own)
    assert by_rq.json["id"] == by_own.json["id"] == rq
    # Another requester sees neither it nor its id; an approver sees everything.
    assert stack.as_(stack.carol, "requests", "show", rq, "--json").json["error"]["code"] \
        == "not_found"
    assert stack.as_(stack.carol, "requests", "show", "pay-42",
                     "--json").json["error"]["code"] == "not_found"
    assert stack.as_(stack.carol, "requests", "list", "--json").json == {"requests": []}
    waiting = stack.as_(stack.bob, "requests", "--state", "awaiting_approval", "--json")
    assert rq in [r["id"] for r in waiting.json["requests"]]
    assert {r["state"] for r in waiting.json["requests"]} == {"awaiting_approval"}
    assert rq not in [r["id"] for r in stack.as_(stack.bob, "requests", "--state", "prepared",
                                                 "--json").json["requests"]]

    bare = stack.as_(stack.bob, "reject", rq, "--json")
    assert bare.returncode == 2 and bare.json["error"]["code"] == "input_invalid", bare
    blank = stack.as_(stack.bob, "reject", rq, "--reason", "  ", "--json")
    assert blank.returncode == 2 and blank.json["error"]["code"] == "input_invalid", blank
    assert stack.as_(stack.bob, "requests", "show", rq,
                     "--json").json["state"] == "awaiting_approval"
    rejected = stack.as_(stack.bob, "reject", rq, "--reason", "wrong account", "--json")
    assert rejected.returncode == 0, rejected
    assert rejected.json["state"] == "rejected"
    assert rejected.json["failure"]["code"] == "delegation_rejected"
    assert rejected.json["marque"] is None
    late = stack.as_(stack.bob, "approve", rq, "--json")  # bob's own rejection stands
    assert late.returncode == 2 and late.json["error"]["code"] == "already_rejected", late
    # Only an admin expires.
    assert stack.as_(stack.bob, "requests", "expire", rq, "--reason", "x",
                     "--json").json["error"]["code"] == "forbidden"


def test_ids_and_credentials_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: a sent request would retry
    started = time.monotonic()
    bad = cli(*request_args("--request-id", "a\tb"), token="t", harbour=nowhere)
    assert bad.returncode == 2 and bad.json["error"]["code"] == "request_id_invalid", bad
    no_token = cli("requests", "--json", harbour=nowhere)
    assert no_token.returncode == 2 and no_token.json["error"]["code"] == "unauthenticated"
    no_harbour = cli("approve", "rq_x", "--json", token="t")
    assert no_harbour.returncode == 2 and no_harbour.json["error"]["code"] == "input_invalid"
    assert time.monotonic() - started < 15  # no retry loop ran
    down = cli("requests", "show", "rq_x", "--json", token="t", harbour=nowhere)
    assert down.returncode == 7 and down.json["error"]["code"] == "harbour_unavailable", down


def test_a_request_to_a_harbourmaster_that_refuses_the_connection_is_final_at_once(
        tmp_path: Path) -> None:
    """Connection refused before anything was sent: no request exists, so `marque request`
    says so once (harbour_unavailable, exit 7) instead of retrying what never left."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    down = cli(*request_args(), token="t", harbour=nowhere)
    assert down.returncode == 7, down
    assert down.json["error"]["code"] == "harbour_unavailable", down
    assert down.json["error"]["detail"] == {"sent": False}
    assert [e["event"] for e in down.events] == ["request_id"]  # no "retrying" event
    assert down.json["request_id"] == down.events[0]["request_id"]

    human = cli(*request_args()[:-1], token="t", harbour=nowhere)
    assert human.returncode == 7, human
    assert human.stdout == ""
    assert human.stderr.count("nothing was sent") == 1, human.stderr
    assert "retrying" not in human.stderr and "gave up" not in human.stderr, human.stderr
    [said] = [line for line in human.stderr.splitlines() if "harbour_unavailable" in line]
    assert said.startswith("unavailable: harbour_unavailable"), said


# -- a saved signed head catches a truncated tail ------------------------------------------


def test_logbook_verify_over_http_with_a_saved_head_detects_a_truncated_tail(
        tmp_path: Path) -> None:
    harbour = Harbour(tmp_path / "harbour")
    audra = harbour.add("audra", "auditor")
    harbour.add("bob", "approver")
    server = HarbourServer(harbour.home)
    try:
        def as_audra(*args: Any) -> Result:
            return cli(*args, token=audra, harbour=server.url)

        head_file = tmp_path / "head.json"
        # The options, not only MARQUE_HARBOUR / MARQUE_TOKEN, name and authenticate it.
        saved = cli("logbook", "head", "--harbour", server.url, "--token", audra, "--out",
                    head_file, "--json")
        assert saved.returncode == 0, saved
        assert json.loads(head_file.read_text()) == saved.json
        assert saved.json["signed"] and saved.json["seq"] >= 3
        clean = as_audra("logbook", "verify", "--head", head_file, "--json")
        assert clean.returncode == 0 and clean.json["intact"] is True, clean
        assert clean.json["entries"] == saved.json["seq"]

        # Cut the last entry, and rewind the store's head row to match: the chain that is
        # left is consistent with itself, so only the saved head can tell.
        last = saved.json["seq"]
        with sqlite3.connect(harbour.home / "harbour.sqlite3") as conn:
            conn.execute("DELETE FROM logbook WHERE seq = ?", (last,))
            prev_hash, at = conn.execute("SELECT hash, at FROM logbook WHERE seq = ?",
                                         (last - 1,)).fetchone()
            conn.execute("UPDATE logbook_head SET seq = ?, hash = ?, at = ? WHERE id = 1",
                         (last - 1, prev_hash, at))
        conn.close()

        unaided = as_audra("logbook", "verify", "--json")
        assert unaided.returncode == 0 and unaided.json["entries"] == last - 1, unaided
        caught = as_audra("logbook", "verify", "--head", head_file, "--json")
        assert caught.returncode == 8, caught
        assert caught.json["intact"] is False
        assert caught.json["error"]["code"] == "logbook_broken"
        assert caught.json["break"]["seq"] == last
        assert caught.json["break"]["kind"] == "truncated"

        # A head whose signature does not verify is refused, not believed.
        forged = dict(saved.json, signed=saved.json["signed"][:-4] + "AAAA")
        head_file.write_text(json.dumps(forged))
        refused = as_audra("logbook", "verify", "--head", head_file, "--json")
        assert refused.returncode == 2 and refused.json["error"]["code"] == "input_invalid"

        # A requester may not read the logbook; nor may anyone without a token.
        assert cli("logbook", "tail", "--json", harbour=server.url,
                   token="mqh_not_a_token").json["error"]["code"] == "unauthenticated"
    finally:
        server.stop()


def test_logbook_tail_follow_prints_new_entries_until_interrupted(tmp_path: Path) -> None:
    harbour = Harbour(tmp_path / "harbour")
    audra = harbour.add("audra", "auditor")
    server = HarbourServer(harbour.home)
    try:
        start = cli("logbook", "tail", "--json", token=audra, harbour=server.url)
        assert start.returncode == 0, start
        after = start.json["next_after"]
        assert after == start.json["entries"][-1]["seq"]
        env = cli_env({"MARQUE_HARBOUR": server.url, "MARQUE_TOKEN": audra})
        follower = subprocess.Popen(
            [str(MARQUE), "logbook", "tail", "--follow", "--after", str(after), "--kind",
             "principal.", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, env=env)
        said: list[str] = []

        def read_stderr() -> None:
            assert follower.stderr is not None
            for line in follower.stderr:  # each streamed entry as it comes
                said.append(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            time.sleep(1.5)  # it is following before the entries are appended
            harbour.add("zed", "requester")  # appended while it follows
            harbour.revoke("zed")
            deadline = time.monotonic() + 10
            while len([line for line in said if line.strip()]) < 2:
                if time.monotonic() > deadline:
                    break  # the assertions below say what did arrive
                time.sleep(0.05)
            assert follower.poll() is None  # both streamed, and still following
        finally:
            follower.terminate()
            follower.wait(timeout=10)
            reader.join(timeout=10)
        assert follower.stdout is not None
        stdout = follower.stdout.read()
        follower.stdout.close()
        stderr = "".join(said)
        assert follower.returncode == 0, (stdout, stderr)
        streamed = [json.loads(line) for line in stderr.splitlines() if line.strip()]
        assert [(e["kind"], e["subject"]) for e in streamed] == [
            ("principal.added", "zed"), ("principal.revoked", "zed")], stderr
        summary = json.loads(stdout)
        assert summary == {"streamed": 2, "next_after": streamed[-1]["seq"]}
    finally:
        server.stop()


def test_logbook_tail_starts_at_the_newest_entries(tmp_path: Path) -> None:
    """Without --after, `logbook tail` prints the newest entries (20, or -n N), of a kind
    too, however long the logbook; --after 0 still reads from the first entry."""
    harbour = Harbour(tmp_path / "harbour")
    audra = harbour.add("audra", "auditor")
    for index in range(30):
        harbour.add(f"user-{index:02d}", "requester")
    server = HarbourServer(harbour.home)
    try:
        head = cli("logbook", "head", "--json", token=audra, harbour=server.url).json["seq"]
        tail = cli("logbook", "tail", "--json", token=audra, harbour=server.url)
        assert tail.returncode == 0, tail
        assert [e["seq"] for e in tail.json["entries"]] == list(range(head - 19, head + 1))
        assert tail.json["next_after"] == head
        three = cli("logbook", "tail", "-n", "3", "--kind", "principal.added", "--json",
                    token=audra, harbour=server.url).json["entries"]
        assert [e["subject"] for e in three] == ["user-27", "user-28", "user-29"]
        everything = cli("logbook", "tail", "--after", "0", "--json", token=audra,
                         harbour=server.url).json["entries"]
        assert [e["seq"] for e in everything] == list(range(1, head + 1))
        human = cli("logbook", "tail", "-n", "2", token=audra, harbour=server.url)
        assert human.returncode == 0 and "user-29" in human.stdout
        assert "user-27" not in human.stdout
    finally:
        server.stop()
