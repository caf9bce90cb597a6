"""Whose reports the Harbourmaster takes: real `harbour serve` and `pilot serve` processes.

A report writes an outcome into a request and the logbook, so it is taken only
for a marque issued to the reporting Pilot, and — once that Pilot registered a
report key (`pilot join` does) — only signed with that key. A refused delivery
writes nothing at all: no execution, no logbook entry, the request unmoved. A
Pilot's registration is logged when something about it changed, not every
time it says it is alive.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import run_cli
from support.harbour import (
    READ,
    Harbour,
    HarbourServer,
    PilotBank,
    PilotServe,
    cli_json,
    execute_marque,
    free_port,
    request_body,
)
from support.wait import wait_until

from marque.errors import LogbookBroken
from marque.token import new_key
from marque.token.reports import sign_report, verify_report


@pytest.fixture
def harbour(tmp_path: Path) -> Harbour:
    made = Harbour(tmp_path / "harbour")
    made.add("p1", "pilot")
    made.add("p2", "pilot")
    return made


@pytest.fixture
def server(harbour: Harbour) -> Iterator[HarbourServer]:
    running = HarbourServer(harbour.home)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def bank(tmp_path: Path, harbour: Harbour, server: HarbourServer) -> Iterator[PilotBank]:
    """Pilot p1's home, joined to the Harbourmaster (at a port it serves on once started),
    and a requester alice holding its holder key."""
    made = PilotBank(tmp_path / "site", harbour, pilot_id="p1", trust=False)
    harbour.add("alice", "requester", key=made.holder_pub)
    made.url = f"http://127.0.0.1:{free_port()}"
    cli_json("pilot", "join", "--home", made.home, "--harbour", server.url,
             "--token", harbour.tokens["p1"], "--url", made.url)
    try:
        yield made
    finally:
        made.stop()


def serve(bank: PilotBank) -> PilotServe:
    """`marque pilot serve` on the port the Pilot joined with."""
    bank.pilot = PilotServe(bank.home, listen=bank.url.removeprefix("http://"), cwd=bank.root)
    bank.pilot.start()
    return bank.pilot


def issued(server: HarbourServer, harbour: Harbour, pilot_id: str = "p1") -> dict[str, Any]:
    """A read request for ``pilot_id``, issued at once (bootstrap profile): its marque."""
    response = server.call("POST", "/v1/requests", harbour.tokens["alice"],
                           json=request_body(READ, pilot_id=pilot_id,
                                             request_id=f"read-{time.monotonic_ns()}"))
    assert response.status_code == 201, response.text
    request = response.json()
    assert request["state"] == "prepared", request
    answer = server.call("GET", f"/v1/requests/{request['id']}/marque",
                         harbour.tokens["alice"])
    assert answer.status_code == 200, answer.text
    return {**answer.json(), "id": request["id"]}


def report_of(marque: dict[str, Any], pilot_id: str, incarnation: str, *,
              status: str = "applied") -> dict[str, Any]:
    return {"marque_id": marque["marque_id"], "nonce": "n-forged", "attempt": 1,
            "status": status, "rows_affected": 1, "error": None,
            "pilot": {"id": pilot_id, "incarnation": incarnation}, "cause": "executed"}


def entries(server: HarbourServer, harbour: Harbour, kind: str = "") -> list[dict[str, Any]]:
    response = server.call("GET", "/v1/logbook", harbour.tokens["admin"],
                           params={"kind": kind, "limit": 1000})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["entries"]
    return found


def request_of(server: HarbourServer, harbour: Harbour, rq: str) -> dict[str, Any]:
    response = server.call("GET", f"/v1/requests/{rq}", harbour.tokens["admin"])
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def report_key(bank: PilotBank) -> dict[str, Any]:
    """The Pilot's private report key, from its home."""
    key: dict[str, Any] = json.loads((bank.home / "report-key.jwk").read_text())
    return key


def assert_nothing_written(server: HarbourServer, harbour: Harbour, marque: dict[str, Any],
                           logbook_before: list[dict[str, Any]]) -> None:
    shown = request_of(server, harbour, marque["id"])
    assert shown["state"] == "prepared" and shown["executions"] == [], shown
    assert entries(server, harbour) == logbook_before


def test_a_pilot_cannot_report_a_marque_issued_to_another_pilot(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """p2's token reports `applied` for p1's marque: 403 forbidden, and nothing is written —
    no execution on the request, no logbook entry, the request still prepared."""
    p2 = {"pilot_id": "p2", "url": "http://127.0.0.1:1", "incarnation": "inc_p2",
          "targets": {"bank": {"dialect": "sqlite"}}}
    assert server.call("POST", "/v1/pilots", harbour.tokens["p2"], json=p2).status_code == 200
    marque = issued(server, harbour)
    before = entries(server, harbour)

    refused = server.call("POST", "/v1/reports", harbour.tokens["p2"], json={
        "pilot_id": "p2", "reports": [report_of(marque, "p2", "inc_p2")]})
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "forbidden"
    assert refused.json()["marque_id"] == marque["marque_id"]
    assert_nothing_written(server, harbour, marque, before)


def test_a_delivery_with_one_foreign_report_is_refused_whole(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """p1 delivers a good signed report of its own marque and one of p2's marque: 403, and
    not even the good one is stored."""
    p2 = {"pilot_id": "p2", "url": "http://127.0.0.1:1", "incarnation": "inc_p2",
          "targets": {"bank": {"dialect": "sqlite"}}}
    assert server.call("POST", "/v1/pilots", harbour.tokens["p2"], json=p2).status_code == 200
    own, foreign = issued(server, harbour), issued(server, harbour, "p2")
    before = entries(server, harbour)
    good = report_of(own, "p1", bank.incarnation)
    bad = report_of(foreign, "p1", bank.incarnation)
    key = report_key(bank)
    refused = server.call("POST", "/v1/reports", harbour.tokens["p1"], json={
        "pilot_id": "p1", "reports": [{**r, "signature": sign_report(r, key)}
                                      for r in (good, bad)]})
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "forbidden"
    assert refused.json()["index"] == 1
    assert_nothing_written(server, harbour, own, before)
    assert request_of(server, harbour, foreign["id"])["executions"] == []


def test_reports_are_signed_by_the_pilot_and_a_stolen_token_alone_writes_nothing(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """`pilot join` registered the home's report key; `pilot serve` delivers its outcome
    signed, and the logbook entry keeps the signature, which verifies offline under the
    registered key. With p1's token but not its key: unsigned, signed by another key, or a
    real signature on altered claims — each 403 report_signature_invalid, nothing written."""
    key = report_key(bank)
    assert (bank.home / "report-key.jwk").stat().st_mode & 0o777 == 0o600
    [registration] = entries(server, harbour, "pilot.registered")
    public = registration["body"]["report_key"]
    assert public["x"] == key["x"] and "d" not in public
    serve(bank)
    marque = issued(server, harbour)
    outcome = execute_marque(bank.url, bank.holder_key, marque["marque"], "n-1")
    assert outcome["status"] == "applied", outcome
    applied = wait_until(lambda: entries(server, harbour, "execution.applied"),
                         "the signed report", step=0.2)
    [entry] = applied
    signature = entry["body"]["signature"]
    assert request_of(server, harbour, marque["id"])["state"] == "verified"
    fields = {name: entry["body"][name] for name in
              ("marque_id", "nonce", "attempt", "status", "rows_affected", "error", "pilot",
               "cause")}
    assert isinstance(verify_report(signature, fields, public), int)

    victim = issued(server, harbour)
    before = entries(server, harbour)
    forged = report_of(victim, "p1", bank.incarnation)
    stolen_key = new_key()
    altered = {**fields, "marque_id": victim["marque_id"]}
    for report in (forged, {**forged, "signature": sign_report(forged, stolen_key)},
                   {**altered, "signature": signature}):
        refused = server.call("POST", "/v1/reports", harbour.tokens["p1"],
                              json={"pilot_id": "p1", "reports": [report]})
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "report_signature_invalid", refused.json()
    assert_nothing_written(server, harbour, victim, before)


def test_a_report_of_a_marque_never_issued_here_is_acknowledged_and_kept_nowhere(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """A Pilot that also trusts another issuer reports that marque's outcome too: the
    Harbourmaster acknowledges it (so the outbox lets it go), counts it as ignored, and
    writes nothing."""
    before = entries(server, harbour)
    report = report_of({"marque_id": "mq_from_elsewhere"}, "p1", bank.incarnation)
    answer = server.call("POST", "/v1/reports", harbour.tokens["p1"], json={
        "pilot_id": "p1", "reports": [{**report, "signature": sign_report(
            report, report_key(bank))}]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"acknowledged": 1, "new": 0, "ignored": 1}
    assert entries(server, harbour) == before


def test_registration_is_logged_when_the_pilot_changed_not_every_minute(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """After `pilot join`, `pilot serve`'s start and any number of repeats of the same
    registration add no logbook entry (last_seen moves); a new URL is one entry naming
    what changed; another report key is refused (403 report_key_changed), its attempt a
    finding, and the key held stays."""
    serve(bank)
    body = {"pilot_id": "p1", "url": bank.url, "incarnation": bank.incarnation,
            "targets": {"bank": {"dialect": "sqlite"}},
            "report_key": {k: v for k, v in report_key(bank).items() if k in ("kty", "crv", "x")}}
    seen = []
    for _ in range(5):
        answer = server.call("POST", "/v1/pilots", harbour.tokens["p1"], json=body)
        assert answer.status_code == 200, answer.text
        [pilot] = [p for p in server.call("GET", "/v1/pilots", harbour.tokens["admin"]
                                          ).json()["pilots"] if p["pilot_id"] == "p1"]
        seen.append(pilot["last_seen"])
        time.sleep(0.01)
    assert seen == sorted(seen) and seen[0] < seen[-1]
    assert [e["kind"] for e in entries(server, harbour, "pilot.")] == ["pilot.registered"]

    moved = {**body, "url": "http://127.0.0.1:1"}
    assert server.call("POST", "/v1/pilots", harbour.tokens["p1"], json=moved).status_code == 200
    other = new_key()
    rekeyed = {**moved, "report_key": {k: other[k] for k in ("kty", "crv", "x")}}
    refused = server.call("POST", "/v1/pilots", harbour.tokens["p1"], json=rekeyed)
    assert (refused.status_code, refused.json()["code"]) == (403, "report_key_changed")
    registrations = entries(server, harbour, "pilot.registered")
    assert [e["body"].get("changed") for e in registrations] == [None, ["url"]]
    [finding] = entries(server, harbour, "finding.pilot_report_key_refused")
    assert finding["body"]["report_key"]["x"] == report_key(bank)["x"]
    assert finding["body"]["offered_report_key"]["x"] == other["x"]
    [pilot] = [p for p in server.call("GET", "/v1/pilots", harbour.tokens["admin"]
                                      ).json()["pilots"] if p["pilot_id"] == "p1"]
    assert pilot["report_key"]["x"] == report_key(bank)["x"]


def rewrite_chain(store: Path, seq: int, edit: Any) -> None:
    """What whoever can write the store (but holds no Pilot's key) can do: edit entry ``seq``'s
    body with ``edit``, then recompute every hash from there and the head row."""
    from marque.harbour.store.columns import canonical_json
    from marque.logbook.chain import entry_hash

    conn = sqlite3.connect(store)
    with conn:
        rows = conn.execute("SELECT seq, at, kind, actor, subject, body, prev_hash FROM logbook "
                            "WHERE seq >= ? ORDER BY seq", (seq,)).fetchall()
        prev = rows[0][6]
        for number, at, kind, actor, subject, body, _ in rows:
            body = json.loads(body)
            if number == seq:
                edit(body)
            entry = {"seq": number, "at": at, "kind": kind, "actor": actor,
                     "subject": subject, "body": body, "prev_hash": prev}
            digest = entry_hash(entry)
            conn.execute("UPDATE logbook SET body = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                         (canonical_json(body), prev, digest, number))
            prev = digest
        conn.execute("UPDATE logbook_head SET hash = ? WHERE id = 1", (prev,))
    conn.close()


def test_logbook_verify_checks_every_outcome_against_its_pilots_key(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """`marque logbook verify` (offline and over HTTP) checks each execution entry's signature
    under the key its Pilot registered before it. An outcome edited by whoever can write the
    store, with the whole chain recomputed, still chains — and is named by its seq."""
    serve(bank)
    marque = issued(server, harbour)
    assert execute_marque(bank.url, bank.holder_key, marque["marque"], "n-1")["status"] == \
        "applied"
    applied = wait_until(lambda: entries(server, harbour, "execution.applied"),
                         "the signed report", step=0.2)
    offline = run_cli("logbook", "verify", "--home", harbour.home, "--json")
    assert offline.returncode == 0, offline
    assert offline.json["intact"] is True and offline.json["signed_reports"] == 1
    online = run_cli("logbook", "verify", "--harbour", server.url, "--token",
                     harbour.tokens["admin"], "--json")
    assert online.returncode == 0 and online.json["signed_reports"] == 1, online

    seq = applied[0]["seq"]
    rewrite_chain(harbour.home / "harbour.sqlite3", seq,
                  lambda body: body.update(rows_affected=7))
    broken = run_cli("logbook", "verify", "--home", harbour.home, "--json")
    assert broken.returncode == LogbookBroken.exit_status == 8, broken
    assert broken.json["intact"] is False
    assert broken.json["break"]["seq"] == seq
    assert broken.json["break"]["kind"] == "report_signature"
    human = run_cli("logbook", "verify", "--home", harbour.home)
    assert f"seq {seq}" in human.stderr + human.stdout


def test_a_home_that_lost_its_report_key_is_refused_until_an_admin_accepts_the_new_one(
        harbour: Harbour, server: HarbourServer, bank: PilotBank, tmp_path: Path) -> None:
    """The joined home's report-key.jwk is lost; `pilot serve` makes a new one (0600), and its
    registration is refused (a finding naming both keys): its reports, signed with the new
    key, are refused and wait in its outbox. Once an admin accepts the new key
    (`harbour pilot accept-key`), they are taken."""
    old = report_key(bank)
    (bank.home / "report-key.jwk").unlink()
    serve(bank)
    new = report_key(bank)
    assert new["x"] != old["x"]
    assert (bank.home / "report-key.jwk").stat().st_mode & 0o777 == 0o600
    [finding] = entries(server, harbour, "finding.pilot_report_key_refused")
    assert (finding["body"]["report_key"]["x"], finding["body"]["offered_report_key"]["x"]) \
        == (old["x"], new["x"])
    marque = issued(server, harbour)
    assert execute_marque(bank.url, bank.holder_key, marque["marque"], "n-1")["status"] == \
        "applied"
    time.sleep(3)  # several delivery rounds: each refused, the report kept by the Pilot
    assert request_of(server, harbour, marque["id"])["state"] == "prepared"
    assert not entries(server, harbour, "execution.")

    public = tmp_path / "new-report-key.pub.jwk"
    public.write_text(json.dumps({k: new[k] for k in ("kty", "crv", "x")}))
    accepted = run_cli("harbour", "pilot", "accept-key", "--home", harbour.home, "p1",
                       "--key", public, "--reason", "home rebuilt; key read out by the operator",
                       "--json")
    assert accepted.returncode == 0, accepted
    assert json.loads(accepted.stdout)["report_key"]["x"] == new["x"]
    wait_until(lambda: request_of(server, harbour, marque["id"])["state"] == "verified",
               "the report signed with the accepted key to be taken", timeout=60, step=0.2)
    verified = run_cli("logbook", "verify", "--home", harbour.home, "--json")
    assert verified.returncode == 0, verified
