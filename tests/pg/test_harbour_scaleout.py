"""Two `marque harbour serve` processes on ONE PostgreSQL store behave as one Harbourmaster.

The home is made once with ``harbour init --store postgresql://…`` and served
twice, on two ports. Concurrent callers spread across both processes: sixteen
POSTs of one request id make one request (one 201, fifteen 200, one id), and
concurrent approvals that each complete the Checkpoint make exactly one
marque. Uniqueness and state changes are decided by the database (a partial
unique index and compare-and-set on the version), never by a process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from support.harbour import (
    DEBIT,
    READ,
    READS_ALLOWED,
    Harbour,
    HarbourServer,
    PilotBank,
    request_body,
    routing_toml,
    writes_delegated,
)

CONCURRENT_POSTS = 16
TWO_APPROVALS = routing_toml(READS_ALLOWED, writes_delegated(2))


@dataclass
class Pair:
    """One Harbourmaster home on PostgreSQL, served by two processes, and its Pilot."""

    harbour: Harbour
    servers: tuple[HarbourServer, HarbourServer]
    pilot: PilotBank
    dsn: str

    def marques_issued(self, request: str) -> int:
        """``marque.issued`` logbook entries about one request, read from the store itself."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT kind, subject FROM marque_harbour.logbook").fetchall()
        return sum(1 for kind, subject in rows if kind == "marque.issued" and subject == request)


@pytest.fixture
def pair(tmp_path: Path, pg_dsn: str) -> Iterator[Pair]:
    harbour = Harbour(tmp_path / "harbour", store=pg_dsn)
    pilot = PilotBank(tmp_path / "p1", harbour)
    harbour.add("alice", "requester", key=pilot.holder_pub)
    for name in ("carol", "frank"):
        harbour.add(name, "approver")
    harbour.add("p1", "pilot")
    pilot.start()
    servers: list[HarbourServer] = []
    try:
        servers.append(HarbourServer(harbour.home))
        servers.append(HarbourServer(harbour.home))
        assert servers[0].harbour_id == servers[1].harbour_id == harbour.harbour_id
        registered = servers[1].call("POST", "/v1/pilots", harbour.tokens["p1"],
                                     json=pilot.registration())
        assert registered.status_code == 200, registered.text
        yield Pair(harbour, (servers[0], servers[1]), pilot, pg_dsn)
    finally:
        for server in servers:
            assert server.stop() == 0  # SIGTERM is an orderly stop
        pilot.stop()


def _all_at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run every call in its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(calls))
    answers: list[httpx.Response | BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            answers[index] = calls[index]()
        except BaseException as exc:  # reported below, with the others
            answers[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    failed = [a for a in answers if not isinstance(a, httpx.Response)]
    assert not failed, failed
    return [a for a in answers if isinstance(a, httpx.Response)]


@pytest.mark.parametrize("sql", [READ, DEBIT], ids=["allowed", "delegated"])
def test_sixteen_concurrent_posts_of_one_request_id_across_two_processes_make_one_request(
        pair: Pair, sql: str) -> None:
    """An allowed read is issued at once; a delegated write is previewed and sealed — either
    way, one request: one 201, fifteen 200, the same id from both processes."""
    token = pair.harbour.tokens["alice"]
    body = request_body(sql, request_id="one-id")
    calls = [
        (lambda server=pair.servers[i % 2]: server.call("POST", "/v1/requests", token,
                                                        json=body))
        for i in range(CONCURRENT_POSTS)
    ]
    answers = _all_at_once(calls)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * (CONCURRENT_POSTS - 1) + [201], [a.text for a in answers]
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1
    [rid] = ids
    expected = "prepared" if sql == READ else "awaiting_approval"
    for server in pair.servers:
        listed = server.call("GET", "/v1/requests", token).json()["requests"]
        assert [(r["id"], r["state"]) for r in listed] == [(rid, expected)]
    with psycopg.connect(pair.dsn) as conn:
        [(count,)] = conn.execute("SELECT count(*) FROM marque_harbour.requests").fetchall()
    assert count == 1
    assert pair.marques_issued(rid) == (1 if sql == READ else 0)


def _approve_on_both(pair: Pair, rid: str, approvers: tuple[str, str]) -> list[httpx.Response]:
    calls = [
        (lambda server=server, who=who: server.call(
            "POST", f"/v1/requests/{rid}/approve", pair.harbour.tokens[who],
            json={"reason": f"approved by {who}"}))
        for server, who in zip(pair.servers, approvers, strict=True)
    ]
    return _all_at_once(calls)


def test_two_concurrent_completing_approvals_one_per_process_issue_one_marque(
        pair: Pair) -> None:
    """Each approval alone completes the Checkpoint (one approver needed): an approval stored
    in the same moment answers 200 with the prepared request, one that arrives after the
    Checkpoint was decided is a 409 ``conflict`` saying so; either way exactly one marque."""
    posted = pair.servers[0].call("POST", "/v1/requests", pair.harbour.tokens["alice"],
                                  json=request_body(DEBIT, request_id="race-1"))
    assert posted.status_code == 201 and posted.json()["state"] == "awaiting_approval"
    rid = posted.json()["id"]
    answers = _approve_on_both(pair, rid, ("carol", "frank"))
    texts = [a.text for a in answers]
    assert sorted(a.status_code for a in answers) in ([200, 200], [200, 409]), texts
    late = [a.json() for a in answers if a.status_code == 409]
    assert all(p["code"] == "conflict" for p in late), texts
    granted = [a.json() for a in answers if a.status_code == 200]
    assert {a["state"] for a in granted} == {"prepared"}
    marque_ids = {a["marque_id"] for a in granted}
    assert len(marque_ids) == 1 and None not in marque_ids
    assert pair.marques_issued(rid) == 1
    marque = pair.servers[1].call("GET", f"/v1/requests/{rid}/marque",
                                  pair.harbour.tokens["alice"]).json()
    assert marque["marque_id"] in marque_ids


def test_two_concurrent_approvals_that_together_complete_a_checkpoint_issue_one_marque(
        pair: Pair) -> None:
    """Two approvers needed, both approving at the same moment on different processes:
    neither may miss the other — the request ends prepared, with one marque."""
    pair.harbour.set_routing(TWO_APPROVALS)
    posted = pair.servers[1].call("POST", "/v1/requests", pair.harbour.tokens["alice"],
                                  json=request_body(DEBIT, request_id="race-2"))
    assert posted.status_code == 201, posted.text
    rid = posted.json()["id"]
    answers = _approve_on_both(pair, rid, ("carol", "frank"))
    # Two are needed, so neither approval can come after the Checkpoint was decided.
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    final = pair.servers[0].call("GET", f"/v1/requests/{rid}",
                                 pair.harbour.tokens["carol"]).json()
    assert final["state"] == "prepared", final
    assert sorted(r["approver"] for r in final["resolutions"]) == ["carol", "frank"]
    assert pair.marques_issued(rid) == 1
