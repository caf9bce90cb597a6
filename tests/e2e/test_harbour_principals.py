"""Principals as real processes: one key is one principal, and principals can be managed.

A real `harbour serve` and `pilot serve`; every administration step is a `marque
harbour principal …` subprocess on the Harbourmaster's home, every call a
principal makes is a `marque …` subprocess (or plain HTTP). What is proved:

* a second principal holding the requester's key is refused (`conflict`), and
  an approval by whoever holds the key the requester asked with is
  `self_approval` under any name — even after the requester rotated to a new
  key and the old one was registered again; where routing allows
  self-approval, the requester's key counts as the requester; an approver's
  key counts once per Checkpoint, under any name;
* `principal rotate` kills the old token and its console sessions at once,
  `principal roles` changes what the principal may do on its next call, and a
  revoked name can be added again as a new principal — each a `principal.*`
  logbook entry;
* a token is never printed in an error, and one with a space inside is
  `input_invalid` before anything is sent.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import Result, run_cli
from support.harbour import (
    DEBIT,
    MARQUE,
    READS_ALLOWED,
    TIMEOUT,
    Harbour,
    HarbourServer,
    PilotBank,
    cli_env,
    free_port,
    new_public_key,
    request_body,
    routing_toml,
    writes_delegated,
)


class World:
    """A Harbourmaster serving (routing as given), one Pilot registered, alice with a key."""

    def __init__(self, root: Path, routing: str | None = None) -> None:
        self.root = root
        self.harbour = Harbour(root / "harbour", routing=routing)
        self.bank = PilotBank(root / "p1", self.harbour)
        self.alice_pub = self.bank.holder_pub
        self.alice = self.harbour.add("alice", "requester", key=self.alice_pub)
        self.bob = self.harbour.add("bob", "approver")
        pilot_token = self.harbour.add("p1", "pilot")
        self.bank.start()
        self.server = HarbourServer(self.harbour.home)
        registered = self.server.call("POST", "/v1/pilots", pilot_token,
                                      json=self.bank.registration())
        assert registered.status_code == 200, registered.text

    def admin(self, *args: Any) -> Result:
        """``marque harbour principal ARGS --home H --json``."""
        return run_cli("harbour", "principal", args[0], "--home", self.harbour.home, *args[1:],
                       "--json")

    def as_(self, token: str, *args: Any) -> Result:
        """``marque ARGS`` as the principal holding ``token``."""
        return run_cli(*args, env={"MARQUE_HARBOUR": self.server.url, "MARQUE_TOKEN": token})

    def ask(self, token: str, request_id: str) -> dict[str, Any]:
        """A delegated write, asked over HTTP; the request object (awaiting approval)."""
        made = self.server.call("POST", "/v1/requests", token,
                                json=request_body(DEBIT, request_id=request_id))
        assert made.status_code == 201, made.text
        assert made.json()["state"] == "awaiting_approval", made.json()
        return dict(made.json())

    def entries(self, kind: str) -> list[dict[str, Any]]:
        page = self.server.call("GET", f"/v1/logbook?kind={kind}&limit=1000",
                                self.harbour.tokens["admin"])
        assert page.status_code == 200, page.text
        return list(page.json()["entries"])

    def stop(self) -> None:
        self.bank.stop()
        self.server.stop()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    running = World(tmp_path)
    try:
        yield running
    finally:
        running.stop()


# -- one key is one principal --------------------------------------------------------------


def test_a_second_principal_with_the_requesters_key_is_refused(world: World) -> None:
    """`principal add alice_twin --key alice.pub.jwk` is `conflict` (exit 2): nothing added."""
    twin = world.admin("add", "alice_twin", "--role", "approver", "--key", world.alice_pub)
    assert twin.returncode == 2, twin
    assert twin.json["error"]["code"] == "conflict"
    assert twin.json["error"]["detail"]["holder"] == "alice"
    listed = world.admin("list").json["principals"]
    assert "alice_twin" not in {p["name"] for p in listed}
    # Rotating someone else onto alice's key is refused the same way.
    onto = world.admin("rotate", "bob", "--key", world.alice_pub)
    assert onto.returncode == 2 and onto.json["error"]["code"] == "conflict", onto


def test_an_approval_by_the_key_the_requester_asked_with_is_self_approval(
        world: World) -> None:
    """alice asks, rotates to a new key, her old key is registered as alice_twin: the twin's
    approval is `self_approval` (exit 3) and the request keeps waiting; bob's approval issues."""
    asked = world.ask(world.alice, "twin-1")
    rotated = world.admin("rotate", "alice", "--key",
                          new_public_key(world.root / "alice-2.pub.jwk"))
    assert rotated.returncode == 0, rotated
    world.alice = rotated.json["token"]
    twin = world.admin("add", "alice_twin", "--role", "approver", "--key", world.alice_pub)
    assert twin.returncode == 0, twin  # the old key is nobody's now
    approved = world.as_(twin.json["token"], "approve", asked["id"], "--json")
    assert approved.returncode == 3, approved
    assert approved.json["error"]["code"] == "self_approval"
    assert approved.json["error"]["detail"]["reason"] == "same_key"
    shown = world.as_(world.alice, "requests", "show", asked["id"], "--json").json
    assert shown["state"] == "awaiting_approval" and shown["resolutions"] == []
    # The console does not offer the twin the approval either, and says why.
    console = console_login(world.server, twin.json["token"])
    try:
        page = console.get(f"/requests/{asked['id']}")
        assert page.status_code == 200, page.text
        assert 'data-testid="approve"' not in page.text
        assert "You hold the key this change was asked with" in page.text
    finally:
        console.close()
    # A request alice asks with her new key: the twin's old key is no longer hers.
    later = world.ask(world.alice, "twin-2")
    assert world.as_(twin.json["token"], "approve", later["id"], "--json").returncode == 0
    assert world.as_(world.bob, "approve", asked["id"], "--json").json["state"] == "prepared"


def test_a_revoked_requesters_key_registered_again_cannot_approve_her_requests(
        world: World) -> None:
    """alice asks and is revoked; her key, registered as mallory, still cannot approve."""
    asked = world.ask(world.alice, "revoked-1")
    assert world.admin("revoke", "alice").returncode == 0
    mallory = world.admin("add", "mallory", "--role", "approver", "--key", world.alice_pub)
    assert mallory.returncode == 0, mallory
    approved = world.as_(mallory.json["token"], "approve", asked["id"], "--json")
    assert approved.returncode == 3 and approved.json["error"]["code"] == "self_approval"


def test_where_routing_allows_self_approval_the_requesters_key_counts_as_the_requester(
        tmp_path: Path) -> None:
    """`self_approval = true`: alice's old key under another name may approve, as alice may."""
    routing = routing_toml(READS_ALLOWED, writes_delegated(1, self_approval=True))
    running = World(tmp_path, routing=routing)
    try:
        asked = running.ask(running.alice, "allowed-1")
        rotated = running.admin("rotate", "alice", "--key",
                                new_public_key(tmp_path / "alice-2.pub.jwk"))
        assert rotated.returncode == 0, rotated
        twin = running.admin("add", "alice_twin", "--role", "approver", "--key",
                             running.alice_pub)
        approved = running.as_(twin.json["token"], "approve", asked["id"], "--json")
        assert approved.returncode == 0, approved
        assert approved.json["state"] == "prepared"
    finally:
        running.stop()


def test_an_approvers_old_key_under_a_second_name_does_not_count_twice(
        tmp_path: Path) -> None:
    """Two approvals needed: carol approves, rotates to a new key, her old key is registered as
    carol_twin; the twin's approval is `conflict` (exit 2) and the request keeps waiting."""
    routing = routing_toml(READS_ALLOWED, writes_delegated(2))
    running = World(tmp_path, routing=routing)
    try:
        carol_pub = new_public_key(tmp_path / "carol.pub.jwk")
        carol = running.admin("add", "carol", "--role", "approver", "--key", carol_pub)
        asked = running.ask(running.alice, "two-1")
        first = running.as_(carol.json["token"], "approve", asked["id"], "--json")
        assert first.returncode == 0 and first.json["state"] == "awaiting_approval", first
        assert running.admin("rotate", "carol", "--key",
                             new_public_key(tmp_path / "carol-2.pub.jwk")).returncode == 0
        twin = running.admin("add", "carol_twin", "--role", "approver", "--key", carol_pub)
        again = running.as_(twin.json["token"], "approve", asked["id"], "--json")
        assert again.returncode == 2 and again.json["error"]["code"] == "conflict", again
        assert again.json["error"]["detail"]["holder"] == "carol"
        shown = running.as_(running.alice, "requests", "show", asked["id"], "--json").json
        assert shown["state"] == "awaiting_approval"
        assert [r["approver"] for r in shown["resolutions"]] == ["carol"]
        done = running.as_(running.bob, "approve", asked["id"], "--json")
        assert done.returncode == 0 and done.json["state"] == "prepared", done
    finally:
        running.stop()


# -- managing principals --------------------------------------------------------------------


def console_login(server: HarbourServer, token: str) -> httpx.Client:
    """A client logged in to the console through its form (its cookie kept)."""
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    form = client.get("/login")
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert match, form.text
    answer = client.post("/login", data={"token": token, "csrf": match.group(1)})
    assert answer.status_code == 303, answer.text
    return client


def test_rotate_kills_the_old_token_and_its_console_sessions_at_once(world: World) -> None:
    """`principal rotate bob`: the new token (printed once) works, the old one is
    `unauthenticated`, bob's console session is over; `principal.rotated` is logged."""
    console = console_login(world.server, world.bob)
    try:
        assert console.get("/").status_code == 200
        rotated = world.admin("rotate", "bob")
        assert rotated.returncode == 0, rotated
        new = rotated.json["token"]
        assert new.startswith("mqh_") and new != world.bob
        old = world.as_(world.bob, "requests", "--json")
        assert old.returncode == 2 and old.json["error"]["code"] == "unauthenticated", old
        assert world.bob not in old.stdout + old.stderr
        assert world.as_(new, "requests", "--json").returncode == 0
        assert console.get("/", follow_redirects=False).status_code in (302, 303, 401)
    finally:
        console.close()
    logged = world.entries("principal.rotated")
    assert [(e["subject"], e["body"]["sessions_ended"]) for e in logged] == [("bob", 1)]
    assert new not in json.dumps(logged) and world.bob not in json.dumps(logged)


def test_roles_are_replaced_and_apply_to_the_next_call(world: World) -> None:
    """`principal roles bob --role auditor`: bob may no longer approve (`forbidden`), may read
    the logbook; `principal.roles_set` records both lists."""
    asked = world.ask(world.alice, "roles-1")
    changed = world.admin("roles", "bob", "--role", "auditor")
    assert changed.returncode == 0 and changed.json["roles"] == ["auditor"], changed
    refused = world.as_(world.bob, "approve", asked["id"], "--json")
    assert refused.returncode == 2 and refused.json["error"]["code"] == "forbidden", refused
    assert world.as_(world.bob, "logbook", "tail", "--json").returncode == 0
    [entry] = world.entries("principal.roles_set")
    assert entry["body"]["roles"] == ["auditor"] and entry["body"]["previous"] == ["approver"]
    unknown = world.admin("roles", "nobody", "--role", "auditor")
    assert unknown.returncode == 2 and unknown.json["error"]["code"] == "not_found"


def test_a_revoked_name_is_added_again_as_a_new_principal(world: World) -> None:
    """Revoke bob, add bob again: a new id and token, the old token stays dead, both rows
    are listed, and the logbook keeps every step."""
    first = next(p for p in world.admin("list").json["principals"] if p["name"] == "bob")
    assert world.admin("revoke", "bob").returncode == 0
    again = world.admin("add", "bob", "--role", "approver")
    assert again.returncode == 0, again
    assert again.json["id"] != first["id"]
    assert world.as_(world.bob, "requests", "--json").json["error"]["code"] == "unauthenticated"
    assert world.as_(again.json["token"], "requests", "--json").returncode == 0
    bobs = [p for p in world.admin("list").json["principals"] if p["name"] == "bob"]
    assert [(p["id"], p["revoked_at"] is None) for p in bobs] == [
        (first["id"], False), (again.json["id"], True)]
    twice = world.admin("add", "bob", "--role", "auditor")
    assert twice.returncode == 2 and twice.json["error"]["code"] == "conflict"
    kinds = [(e["kind"], e["body"].get("id")) for e in world.entries("principal.")
             if e["subject"] == "bob"]
    assert kinds == [("principal.added", first["id"]), ("principal.revoked", first["id"]),
                     ("principal.added", again.json["id"])]


# -- a token is never printed -----------------------------------------------------------------


def test_a_token_with_surrounding_whitespace_is_stripped_and_one_with_inner_space_refused(
        world: World) -> None:
    """`--token "$TOKEN "` works (stripped, as the server strips it); a space or control
    character inside is `input_invalid` (exit 2) before anything is sent; neither is
    printed."""
    padded = run_cli("requests", "--harbour", world.server.url, "--token", world.alice + " \n",
                     "--json")
    assert padded.returncode == 0, padded
    nowhere = f"http://127.0.0.1:{free_port()}"
    for bad in (world.alice[:10] + " " + world.alice[10:], world.alice + "\x01",
                world.alice[:5] + "\t" + world.alice[5:]):
        for args in (["--json"], []):
            answer = run_cli("requests", "--harbour", nowhere, "--token", bad, *args)
            assert answer.returncode == 2, answer
            assert world.alice[10:] not in answer.stdout + answer.stderr
            assert world.alice[:10] not in answer.stdout + answer.stderr
            if args:
                assert answer.json["error"]["code"] == "input_invalid"


def test_a_token_never_appears_when_the_harbourmaster_cannot_be_reached(tmp_path: Path) -> None:
    """A well-formed token and a Harbourmaster that is down: `harbour_unavailable`, exit 7,
    the token nowhere in the output."""
    token = "mqh_" + "Zq9" * 14
    nowhere = f"http://127.0.0.1:{free_port()}"
    for args in (["--json"], []):
        answer = run_cli("requests", "--harbour", nowhere, "--token", token, *args)
        assert answer.returncode == 7, answer
        assert token not in answer.stdout + answer.stderr


class _EchoingProxy(http.server.BaseHTTPRequestHandler):
    """A misconfigured proxy: answers 502 with an HTML page that echoes the request's
    headers — the Authorization header included."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        sent = self.headers.get("Authorization")
        page = f"<html><body>bad gateway for {sent}</body></html>".encode()
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_token_echoed_back_by_whatever_answered_is_masked(tmp_path: Path) -> None:
    """A proxy page that echoes the Authorization header: `harbour_unavailable` (exit 7), its
    text quoted with the token masked."""
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoingProxy)
    serving = threading.Thread(target=proxy.serve_forever, daemon=True)
    serving.start()
    token = "mqh_" + "Qw7" * 14
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}"
        for args in (["--json"], []):
            answer = run_cli("requests", "--harbour", url, "--token", token, *args)
            assert answer.returncode == 7, answer
            assert "bad gateway" in answer.stdout + answer.stderr
            assert token not in answer.stdout + answer.stderr
    finally:
        proxy.shutdown()
        proxy.server_close()


def run_login(*args: Any, stdin: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``marque ARGS`` with the token on stdin and ``XDG_CONFIG_HOME`` at ``config``."""
    return subprocess.run([str(MARQUE), *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT,
                          env=cli_env({"XDG_CONFIG_HOME": str(config)}))


# -- marque login / logout ---------------------------------------------------------------------


def test_login_checks_the_token_keeps_it_owner_only_and_makes_marque_token_optional(
        world: World, tmp_path: Path) -> None:
    """`marque login` reads the token on stdin, checks it with `GET /v1/whoami`, keeps it 0600
    in a 0700 directory, never prints it; commands then need no MARQUE_TOKEN (the URL
    normalised), `--token` and MARQUE_TOKEN still win, `logout` forgets it."""
    config = tmp_path / "config"
    whoami = world.server.call("GET", "/v1/whoami", world.alice).json()
    assert (whoami["name"], whoami["roles"]) == ("alice", ["requester"])
    done = run_login("login", "--harbour", world.server.url + "/", "--json",
                     stdin=world.alice + "\n", config=config)
    assert done.returncode == 0, done
    assert world.alice not in done.stdout + done.stderr
    body = json.loads(done.stdout)
    assert (body["principal"], body["harbour"]) == ("alice", world.server.url)
    stored = config / "marque" / "credentials.json"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert (config / "marque").stat().st_mode & 0o777 == 0o700
    upper = world.server.url.replace("http://", "HTTP://")
    env = {"XDG_CONFIG_HOME": str(config), "MARQUE_HARBOUR": upper}
    listed = run_cli("requests", "--json", env=env)
    assert listed.returncode == 0, listed
    # Precedence: MARQUE_TOKEN over the stored login, --token over both.
    wrong = "mqh_" + "x" * 43
    env_wins = run_cli("requests", "--json", env={**env, "MARQUE_TOKEN": wrong})
    assert env_wins.json["error"]["code"] == "unauthenticated", env_wins
    flag_wins = run_cli("requests", "--token", world.bob, "--json",
                        env={**env, "MARQUE_TOKEN": wrong})
    assert flag_wins.returncode == 0, flag_wins
    # A rotated token kept by login is answered `unauthenticated`.
    assert world.admin("rotate", "alice").returncode == 0
    stale = run_cli("requests", "--json", env=env)
    assert stale.returncode == 2 and stale.json["error"]["code"] == "unauthenticated", stale
    out = run_login("logout", "--harbour", world.server.url, "--json", stdin="", config=config)
    # A principal's token: nothing to end at the Harbourmaster, nothing to revoke.
    assert out.returncode == 0 and json.loads(out.stdout) == {
        "removed": [world.server.url], "sessions": [], "revocations": []}
    assert world.alice not in stored.read_text()
    gone = run_cli("requests", "--json", env=env)
    assert gone.returncode == 2 and "marque login" in gone.json["error"]["message"], gone


def test_login_with_a_bad_token_saves_nothing(world: World, tmp_path: Path) -> None:
    """An unknown, a revoked and an empty token: `unauthenticated` / `input_invalid`, exit 2,
    and no credentials file is written."""
    config = tmp_path / "config"
    assert world.admin("revoke", "bob").returncode == 0
    for token, code in (("mqh_" + "y" * 43, "unauthenticated"), (world.bob, "unauthenticated"),
                        ("  \n", "input_invalid")):
        done = run_login("login", "--harbour", world.server.url, "--json", stdin=token + "\n",
                         config=config)
        assert done.returncode == 2, done
        assert json.loads(done.stdout)["error"]["code"] == code
        assert token.strip() == "" or token not in done.stdout + done.stderr
    assert not (config / "marque" / "credentials.json").exists()


def test_credentials_others_can_read_are_refused(world: World, tmp_path: Path) -> None:
    """A credentials file made group-readable since is not used: `input_invalid`, exit 2."""
    config = tmp_path / "config"
    done = run_login("login", "--harbour", world.server.url, stdin=world.alice, config=config)
    assert done.returncode == 0, done
    assert world.alice not in done.stdout + done.stderr
    stored = config / "marque" / "credentials.json"
    stored.chmod(0o640)
    used = run_cli("requests", "--json",
                   env={"XDG_CONFIG_HOME": str(config), "MARQUE_HARBOUR": world.server.url})
    assert used.returncode == 2 and used.json["error"]["code"] == "input_invalid", used
    assert world.alice not in used.stdout + used.stderr
