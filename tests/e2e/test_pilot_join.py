"""Pilots join a Harbourmaster and report to it: real `harbour serve` and `pilot serve`.

`marque pilot join` pins the Harbourmaster's issuer keys from its JWKS and
registers; a join that fails changes nothing. `pilot serve` registers at
start, so a wiped and re-created ledger (a new incarnation) is the
Harbourmaster's finding and its pinned requests go to reconciliation. An
outcome reached while the Harbourmaster is down stays in the Pilot's outbox
(unacknowledged) and is delivered once it is back; a report delivered twice
is one logbook entry there; a pilot token speaks only for its own pilot id.
"""

from __future__ import annotations

import functools
import http.server
import json
import sqlite3
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import (
    MARQUE,
    READ,
    TIMEOUT,
    Harbour,
    HarbourServer,
    PilotBank,
    PilotServe,
    cli_env,
    cli_json,
    free_port,
    request_body,
)
from support.wait import wait_until

from marque.errors import ConfigInvalid
from marque.pilot.config import PilotConfig
from marque.token import make_proof, new_key

PILOT = "p1"


def cli(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``marque ARGS --json`` as a subprocess, whatever its exit status."""
    return subprocess.run([str(MARQUE), *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=TIMEOUT, env=cli_env(env),
                          stdin=subprocess.DEVNULL)


def error_code(proc: subprocess.CompletedProcess[str]) -> str:
    code: str = json.loads(proc.stdout or proc.stderr.splitlines()[-1])["error"]["code"]
    return code


def linked_pilot(bank: PilotBank, port: int) -> PilotServe:
    """`marque pilot serve` on a port chosen up front (its join needs the URL first)."""
    return PilotServe(bank.home, listen=f"127.0.0.1:{port}", cwd=bank.root,
                      log=bank.root / f"pilot-serve-{port}-{time.monotonic_ns()}.log")


@pytest.fixture
def harbour(tmp_path: Path) -> Harbour:
    made = Harbour(tmp_path / "harbour")
    made.add(PILOT, "pilot")
    return made


@pytest.fixture
def server(harbour: Harbour) -> Iterator[HarbourServer]:
    running = HarbourServer(harbour.home)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def bank(tmp_path: Path, harbour: Harbour) -> PilotBank:
    """A Pilot home serving ``bank``; NOT trusting the Harbourmaster yet (join pins it)."""
    return PilotBank(tmp_path / "site", harbour, pilot_id=PILOT, trust=False)


@pytest.fixture
def pilots() -> Iterator[list[PilotServe]]:
    started: list[PilotServe] = []
    try:
        yield started
    finally:
        for pilot in started:
            pilot.stop()


def join(bank: PilotBank, server: HarbourServer, token: str, pilot_url: str
         ) -> subprocess.CompletedProcess[str]:
    return cli("pilot", "join", "--home", bank.home, "--harbour", server.url, "--token", token,
               "--url", pilot_url)


def registered(server: HarbourServer, harbour: Harbour) -> dict[str, dict[str, Any]]:
    response = server.call("GET", "/v1/pilots", harbour.tokens["admin"])
    assert response.status_code == 200, response.text
    return {p["pilot_id"]: p for p in response.json()["pilots"]}


def logbook(server: HarbourServer, harbour: Harbour, kind: str) -> list[dict[str, Any]]:
    response = server.call("GET", "/v1/logbook", harbour.tokens["admin"],
                           params={"kind": kind, "limit": 1000})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["entries"]
    return entries


def outbox(bank: PilotBank) -> list[tuple[str, str, str, float | None]]:
    """The Pilot's outbox, read from its SQLite ledger: (marque_id, nonce, status, acked_at)."""
    conn = sqlite3.connect(bank.home / "ledger.sqlite3")
    try:
        return list(conn.execute("SELECT marque_id, nonce, status, acked_at FROM outbox"))
    finally:
        conn.close()


def prepared_read(server: HarbourServer, harbour: Harbour, bank: PilotBank,
                  requester: str) -> dict[str, Any]:
    """A read request, issued at once under the bootstrap profile; its marque answer."""
    response = server.call("POST", "/v1/requests", harbour.tokens[requester],
                           json=request_body(READ, pilot_id=bank.pilot_id,
                                             request_id=f"read-{time.monotonic_ns()}"))
    assert response.status_code == 201, response.text
    request = response.json()
    assert request["state"] == "prepared", request
    answer = server.call("GET", f"/v1/requests/{request['id']}/marque",
                         harbour.tokens[requester])
    assert answer.status_code == 200, answer.text
    marque: dict[str, Any] = {**answer.json(), "id": request["id"]}
    return marque


def execute(bank: PilotBank, pilot_url: str, marque: dict[str, Any], nonce: str) -> Any:
    """Execute a marque through the Pilot's service; the outcome (the stream's last line)."""
    key = json.loads(bank.holder_key.read_text())
    proof = make_proof(key, marque["marque"], nonce=nonce, pilot_id=bank.pilot_id)
    with httpx.stream("POST", f"{pilot_url}/v1/executions", timeout=TIMEOUT,
                      json={"marque": marque["marque"], "nonce": nonce, "proof": proof}) as r:
        assert r.status_code == 200, r.read()
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert lines[-1]["event"] == "outcome", lines
    return lines[-1]["outcome"]


def request_state(server: HarbourServer, harbour: Harbour, request_id: str) -> str:
    response = server.call("GET", f"/v1/requests/{request_id}", harbour.tokens["admin"])
    assert response.status_code == 200, response.text
    state: str = response.json()["state"]
    return state


# -- joining ------------------------------------------------------------------------------


def test_join_pins_the_jwks_registers_and_keeps_the_token_owner_only(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """After `pilot join`: the JWKS keys trusted, the Pilot registered with its dialects,
    pilot.json 0600 with {url, token, pilot_url}; `pilot show` never shows the token."""
    assert cli_json("pilot", "show", "--home", bank.home)["issuers"] == []
    pilot_url = f"http://127.0.0.1:{free_port()}"
    joined = join(bank, server, harbour.tokens[PILOT], pilot_url)
    assert joined.returncode == 0, joined.stderr
    result = json.loads(joined.stdout)
    jwks = server.call("GET", "/.well-known/jwks.json").json()
    report_key = json.loads((bank.home / "report-key.jwk").read_text())
    assert result == {"pilot_id": PILOT, "incarnation": bank.incarnation,
                      "harbour": server.url, "pilot_url": pilot_url,
                      "trusted": [k["kid"] for k in jwks["keys"]],
                      "report_key": report_key["kid"], "previous_incarnation": None}

    shown = cli_json("pilot", "show", "--home", bank.home)
    assert shown["issuers"] == [k["kid"] for k in jwks["keys"]]
    assert shown["harbour"] == {"url": server.url, "pilot_url": pilot_url}
    assert harbour.tokens[PILOT] not in json.dumps(shown)

    config_file = bank.home / "pilot.json"
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    assert json.loads(config_file.read_text())["harbour"] == {
        "url": server.url, "token": harbour.tokens[PILOT], "pilot_url": pilot_url}

    known = registered(server, harbour)[PILOT]
    assert (known["url"], known["incarnation"]) == (pilot_url, bank.incarnation)
    assert json.dumps(known["targets"]).count("sqlite") == 1 and "bank" in known["targets"]
    assert known["report_key"] == {"kty": "OKP", "crv": "Ed25519", "x": report_key["x"],
                                   "kid": report_key["kid"]}

    # Joining again is harmless: same keys, same registration, nothing duplicated.
    again = join(bank, server, harbour.tokens[PILOT], pilot_url)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["previous_incarnation"] == bank.incarnation
    assert cli_json("pilot", "show", "--home", bank.home)["issuers"] == shown["issuers"]


def test_a_failed_join_changes_nothing(
        tmp_path: Path, harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """Unreachable, unknown token, another Pilot's token, not a JWKS, a private key in it:
    each refused with its code, pilot.json byte for byte as it was, nothing registered."""
    config_file = bank.home / "pilot.json"
    before = config_file.read_bytes()
    pilot_url = f"http://127.0.0.1:{free_port()}"
    token = harbour.tokens[PILOT]

    nobody = cli("pilot", "join", "--home", bank.home, "--harbour",
                 f"http://127.0.0.1:{free_port()}", "--token", token, "--url", pilot_url)
    assert error_code(nobody) == "harbour_unavailable"
    assert error_code(join(bank, server, "mqh_not-a-token", pilot_url)) == "unauthenticated"

    # Another Pilot's token: the Harbourmaster refuses it for this pilot id.
    harbour.add("p2", "pilot")
    assert error_code(join(bank, server, harbour.tokens["p2"], pilot_url)) == "forbidden"
    # A requester's token is no Pilot's.
    harbour.add("bob", "requester")
    assert error_code(join(bank, server, harbour.tokens["bob"], pilot_url)) == "forbidden"

    for name, content in {
        "html": "<html>not a Harbourmaster</html>",
        "empty": json.dumps({"keys": []}),
        "private": json.dumps({"keys": [new_key()]}),
        "rsa": json.dumps({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB", "kid": "r"}]}),
    }.items():
        site = tmp_path / f"not-a-harbour-{name}"
        (site / ".well-known").mkdir(parents=True)
        (site / ".well-known" / "jwks.json").write_text(content)
        with _static_site(site) as url:
            refused = cli("pilot", "join", "--home", bank.home, "--harbour", url, "--token",
                          token, "--url", pilot_url)
        assert error_code(refused) == "harbour_unavailable", (name, refused.stdout)

    for bad in ("ftp://example.org", "http://h/x?y=1"):
        refused = cli("pilot", "join", "--home", bank.home, "--harbour", bad, "--token",
                      token, "--url", pilot_url)
        assert error_code(refused) == "input_invalid", bad
    spaced = cli("pilot", "join", "--home", bank.home, "--harbour", server.url, "--token",
                 "two words", "--url", pilot_url)
    assert error_code(spaced) == "input_invalid"
    assert "two words" not in spaced.stdout + spaced.stderr  # a token is never echoed

    assert config_file.read_bytes() == before
    assert PILOT not in registered(server, harbour)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


class _static_site:  # noqa: N801 - used as a context manager, like a function
    """A real HTTP server that is not a Harbourmaster: static files from ``root``."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_Quiet, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_harbour_section_is_read_strictly() -> None:
    """pilot.json's `harbour`: exactly {url, token, pilot_url}, URLs http(s), a token that is
    one visible word — every problem a ConfigInvalid naming the key, never the token."""
    good = {"url": "https://harbour.example", "token": "mqh_secret",
            "pilot_url": "http://10.0.0.5:8750"}
    config = PilotConfig.from_dict({"pilot_id": "p1", "harbour": good})
    assert config.harbour is not None and config.harbour.to_dict() == good
    assert config.to_dict()["harbour"] == good
    assert "harbour" not in PilotConfig.from_dict({"pilot_id": "p1"}).to_dict()
    for harbour, named in [
        ({**good, "extra": 1}, "harbour.extra"),
        ({k: v for k, v in good.items() if k != "token"}, "harbour.token"),
        ({**good, "url": "ftp://h"}, "harbour.url"),
        ({**good, "url": "https://h/"}, "harbour.url"),
        ({**good, "pilot_url": 8750}, "harbour.pilot_url"),
        ({**good, "token": "mqh_has space"}, "harbour.token"),
        ({**good, "token": ""}, "harbour.token"),
        ("https://h", "harbour"),
    ]:
        with pytest.raises(ConfigInvalid) as refused:
            PilotConfig.from_dict({"pilot_id": "p1", "harbour": harbour})
        assert named in refused.value.message, (harbour, refused.value.message)
        assert "mqh_has space" not in refused.value.message


# -- registering and reporting ------------------------------------------------------------


def test_serve_registers_at_start_and_a_new_incarnation_is_a_finding(
        harbour: Harbour, server: HarbourServer, bank: PilotBank,
        pilots: list[PilotServe]) -> None:
    """`pilot serve` registers as it starts; after the ledger is wiped and re-created, the
    next start registers the new incarnation: the finding, and the request pinned to the
    old one goes to reconciliation."""
    harbour.add("alice", "requester", key=bank.holder_pub)
    port = free_port()
    assert join(bank, server, harbour.tokens[PILOT], f"http://127.0.0.1:{port}"
                ).returncode == 0
    first = linked_pilot(bank, port)
    pilots.append(first)
    assert first.start()["incarnation"] == bank.incarnation
    assert registered(server, harbour)[PILOT]["incarnation"] == bank.incarnation
    pinned = prepared_read(server, harbour, bank, "alice")
    assert pinned["pilot"]["incarnation"] == bank.incarnation
    first.stop()

    for suffix in ("", "-wal", "-shm"):
        (bank.home / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    again = cli_json("pilot", "init", "--home", bank.home, "--pilot-id", PILOT)
    assert again["incarnation"] != bank.incarnation and again["adopted"] is False
    # pilot init keeps what the home knew: its Harbourmaster is still joined.
    assert cli_json("pilot", "show", "--home", bank.home)["harbour"]["url"] == server.url

    second = linked_pilot(bank, port)
    pilots.append(second)
    assert second.start()["incarnation"] == again["incarnation"]
    # Registered before it said it serves: no waiting needed.
    assert registered(server, harbour)[PILOT]["incarnation"] == again["incarnation"]
    findings = logbook(server, harbour, "finding.ledger_incarnation_changed")
    assert len(findings) == 1, findings
    assert json.dumps(findings[0]).count(again["incarnation"]) >= 1
    assert request_state(server, harbour, pinned["id"]) == "reconciliation"
    assert "warning" not in second.stderr()


def test_a_ledger_wiped_with_an_unreported_outcome_is_settled_from_the_targets_stamps(
        harbour: Harbour, server: HarbourServer, bank: PilotBank,
        pilots: list[PilotServe]) -> None:
    """One marque ran while the Harbourmaster was away, then the ledger (and its unreported
    outcome) was wiped: the new incarnation is the finding, both pinned requests go to
    reconciliation, the Pilot refuses their old marques, and the stamps settle them — the
    one that ran is verified, the one that never ran stays waiting (its marque unexpired)."""
    harbour.add("alice", "requester", key=bank.holder_pub)
    port = free_port()
    assert join(bank, server, harbour.tokens[PILOT], f"http://127.0.0.1:{port}"
                ).returncode == 0
    first = linked_pilot(bank, port)
    pilots.append(first)
    first.start()
    ran = prepared_read(server, harbour, bank, "alice")
    idle = prepared_read(server, harbour, bank, "alice")
    harbour_port = int(server.url.rsplit(":", 1)[1])
    server.stop()
    assert execute(bank, first.url, ran, "n-1")["status"] == "applied"
    assert [acked for *_, acked in outbox(bank)] == [None]  # never reported
    first.stop()

    for suffix in ("", "-wal", "-shm"):
        (bank.home / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    again = cli_json("pilot", "init", "--home", bank.home, "--pilot-id", PILOT)
    assert again["incarnation"] != bank.incarnation

    back = HarbourServer(harbour.home, port=harbour_port)
    try:
        second = linked_pilot(bank, port)
        pilots.append(second)
        assert second.start()["incarnation"] == again["incarnation"]
        findings = logbook(back, harbour, "finding.ledger_incarnation_changed")
        assert len(findings) == 1, findings
        assert request_state(back, harbour, ran["id"]) == "reconciliation"
        assert request_state(back, harbour, idle["id"]) == "reconciliation"

        key = json.loads(bank.holder_key.read_text())
        for old in (ran, idle):
            proof = make_proof(key, old["marque"], nonce="n-2", pilot_id=bank.pilot_id)
            refused = httpx.post(f"{second.url}/v1/executions", timeout=TIMEOUT,
                                 json={"marque": old["marque"], "nonce": "n-2", "proof": proof})
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "wrong_incarnation"

        for request, state in ((ran, "verified"), (idle, "reconciliation")):
            settled = back.call("POST", f"/v1/requests/{request['id']}/expire",
                                harbour.tokens["admin"], json={"reason": "ledger was wiped"})
            assert settled.status_code == 200, settled.text
            assert settled.json()["state"] == state
        kinds = [e["kind"] for e in logbook(back, harbour, "reconciliation.")
                 if e["subject"] == ran["id"]]
        assert kinds == ["reconciliation.settled"]
    finally:
        back.stop()
    # Nothing ran twice: the read's stamp is the only one the target holds for it.
    conn = sqlite3.connect(bank.bank)
    try:
        stamps = conn.execute("SELECT marque_id, nonce FROM marque_stamps").fetchall()
    finally:
        conn.close()
    assert stamps == [(ran["marque_id"], "n-1")]


def test_serve_without_a_reachable_harbourmaster_serves_and_warns(
        harbour: Harbour, server: HarbourServer, bank: PilotBank,
        pilots: list[PilotServe]) -> None:
    """A Harbourmaster that is down when the Pilot starts is a warning, never fatal."""
    port = free_port()
    assert join(bank, server, harbour.tokens[PILOT], f"http://127.0.0.1:{port}"
                ).returncode == 0
    server.stop()
    pilot = linked_pilot(bank, port)
    pilots.append(pilot)
    assert pilot.start()["pilot_id"] == PILOT
    assert httpx.get(f"{pilot.url}/v1/health", timeout=TIMEOUT).status_code == 200
    assert "could not register Pilot p1" in pilot.stderr()
    assert "harbour_unavailable" in pilot.stderr()


def test_registration_repeats_and_survives_the_harbourmaster_going_away(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """The registrar registers again every interval (last_seen moves); while the
    Harbourmaster is down each round is a logged warning, and once it is back on its URL
    the Pilot registers again — the Pilot itself keeps running throughout."""
    from marque.pilot.harbour_link import open_linked_pilot

    assert join(bank, server, harbour.tokens[PILOT], "http://127.0.0.1:1").returncode == 0
    said: list[str] = []
    pilot = open_linked_pilot(bank.home, log=said.append, register_interval=0.3)
    try:
        first = registered(server, harbour)[PILOT]["last_seen"]
        wait_until(lambda: registered(
            server, harbour)[PILOT]["last_seen"] > first, "a second registration", step=0.1)
        port = int(server.url.rsplit(":", 1)[1])
        server.stop()
        wait_until(lambda: any("could not register" in s for s in said), "a logged failure",
                   step=0.1)
        assert pilot.stats() is not None  # still usable
        back = HarbourServer(harbour.home, port=port)
        try:
            wait_until(lambda: any("registered Pilot p1" in s and "again" in s for s in said),
                       "the registration after the outage", step=0.1)
        finally:
            back.stop()
    finally:
        pilot.close()


def test_an_outcome_reached_while_the_harbourmaster_is_down_is_delivered_once_it_is_back(
        harbour: Harbour, server: HarbourServer, bank: PilotBank,
        pilots: list[PilotServe]) -> None:
    """Executed while the Harbourmaster is stopped: applied, but the outbox entry stays
    unacknowledged; once the Harbourmaster is back on its URL the report arrives, the
    request is verified, and the Pilot's own logbook has it too. Delivered again (a lost
    acknowledgement), it is still one entry in the Harbourmaster's logbook."""
    harbour.add("alice", "requester", key=bank.holder_pub)
    port = free_port()
    assert join(bank, server, harbour.tokens[PILOT], f"http://127.0.0.1:{port}"
                ).returncode == 0
    pilot = linked_pilot(bank, port)
    pilots.append(pilot)
    pilot.start()
    marque = prepared_read(server, harbour, bank, "alice")
    harbour_port = int(server.url.rsplit(":", 1)[1])
    server.stop()

    outcome = execute(bank, pilot.url, marque, "n-1")
    assert outcome["status"] == "applied", outcome
    # The reporter's first round to the stopped Harbourmaster is refused (it says so once).
    wait_until(lambda: "outcome reports not delivered" in pilot.stderr(),
               "a refused report round", step=0.1)
    assert [(m, n, s) for m, n, s, _ in outbox(bank)] == [(marque["marque_id"], "n-1",
                                                          "applied")]
    assert all(acked is None for *_, acked in outbox(bank)), "acked without the Harbourmaster"

    back = HarbourServer(harbour.home, port=harbour_port)
    try:
        wait_until(lambda: all(
            acked is not None for *_, acked in outbox(bank)), "the report to be acknowledged",
            step=0.1)
        assert request_state(back, harbour, marque["id"]) == "verified"
        entries = [e for e in logbook(back, harbour, "execution.")
                   if e["body"].get("marque_id") == marque["marque_id"]]
        assert [e["kind"] for e in entries] == ["execution.applied"], entries

        # The acknowledgement lost: the Pilot delivers the same report again.
        conn = sqlite3.connect(bank.home / "ledger.sqlite3")
        with conn:
            conn.execute("UPDATE outbox SET acked_at = NULL")
        conn.close()
        wait_until(lambda: all(
            acked is not None for *_, acked in outbox(bank)),
            "the redelivery to be acknowledged", step=0.1)
        again = [e for e in logbook(back, harbour, "execution.")
                 if e["body"].get("marque_id") == marque["marque_id"]]
        assert again == entries
        assert request_state(back, harbour, marque["id"]) == "verified"
    finally:
        back.stop()
    # The Pilot's own journal has the outcome too, once.
    assert cli_json("logbook", "verify", "--home", bank.home)["intact"] is True
    local = sqlite3.connect(bank.home / "logbook.sqlite3")
    try:
        kinds = [row[0] for row in local.execute(
            "SELECT kind FROM logbook WHERE kind LIKE 'execution.%'")]
    finally:
        local.close()
    assert kinds == ["execution.applied"]


def test_a_pilot_token_speaks_only_for_its_own_pilot_id(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """p1's token may register and report for p1 only: for p2 both are 403 forbidden."""
    token = harbour.tokens[PILOT]
    body = {"pilot_id": "p2", "url": "http://127.0.0.1:1", "incarnation": "inc_x",
            "targets": {"bank": {"dialect": "sqlite"}}}
    refused = server.call("POST", "/v1/pilots", token, json=body)
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "forbidden"
    report = {"marque_id": "mq_x", "nonce": "n", "attempt": 1, "status": "applied",
              "rows_affected": 1, "error": None, "pilot": {"id": "p2", "incarnation": "inc_x"},
              "cause": None}
    refused = server.call("POST", "/v1/reports", token,
                          json={"pilot_id": "p2", "reports": [report]})
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "forbidden"
    assert "p2" not in registered(server, harbour)
    # Its own pilot id is fine.
    own = server.call("POST", "/v1/pilots", token, json={**body, "pilot_id": PILOT})
    assert own.status_code == 200, own.text
    assert own.json()["pilot_id"] == PILOT


def test_the_registration_names_each_target_with_its_dialect(
        harbour: Harbour, server: HarbourServer, bank: PilotBank) -> None:
    """A SQLite target registers as `sqlite`, a PostgreSQL one as `postgres`: the dialect
    the Harbourmaster's routing reads its statements in."""
    from marque.pilot.config import HarbourLink
    from marque.pilot.harbour_link import register, registration_body

    link = HarbourLink(server.url, harbour.tokens[PILOT], "http://127.0.0.1:1")
    body = registration_body(PILOT, bank.incarnation, link,
                             {"bank": f"sqlite:///{bank.bank}", "pg": "postgresql://u@h/db"})
    assert body == {"pilot_id": PILOT, "url": "http://127.0.0.1:1",
                    "incarnation": bank.incarnation,
                    "targets": {"bank": {"dialect": "sqlite"}, "pg": {"dialect": "postgres"}}}
    assert register(link, body)["pilot_id"] == PILOT
    assert set(registered(server, harbour)[PILOT]["targets"]) == {"bank", "pg"}
