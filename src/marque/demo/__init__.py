"""``marque demo``: the whole story on embedded defaults, narrated.

In a temporary directory it makes a SQLite bank, a Harbourmaster (SQLite
store, bootstrap routing profile) and a Pilot (SQLite ledger) serving the
bank, starts both as real services on free loopback ports, and walks one
change through them: request → routing → preview → self-approval refused →
approval → marque → execution through the Pilot → replay → a spent budget →
the outcome in the logbook → the logbook verified. Each step says what
should happen and checks that it did; the demo exits 0 only if every step
behaved, and it stops both services before it returns.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from marque.demo.stack import Service, ServiceFailed, free_loopback_port
from marque.demo.story import Story, show_balances, show_preview

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient

__all__ = ["run_demo"]

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = ?"
#: How long the Pilot's report may take to reach the Harbourmaster.
REPORT_SECONDS = 30.0


def _make_bank(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
    finally:
        conn.close()


def _balances(path: Path) -> dict[int, int]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
    finally:
        conn.close()


class _Homes:
    """The demo's homes, keys and principals, made with the same library calls as the CLI."""

    def __init__(self, root: Path, story: Story) -> None:
        from marque.harbour.setup import add_principal, init_harbour
        from marque.pilot.setup import add_target, init_home
        from marque.token import new_key, public_jwk

        self.root = root
        self.bank = root / "bank.db"
        _make_bank(self.bank)
        self.harbour_home = root / "harbour"
        made = init_harbour(self.harbour_home)
        self.harbour_id: str = made["harbour_id"]
        story.command("marque harbour init --home ./harbour")
        story.say(f"    Harbourmaster {made['harbour_id']}, issuer key {made['issuer_kid']}, "
                  "the bootstrap routing profile: reads allowed, writes need one approver")
        self.holder = new_key()
        # Alice may approve too (her team's changes), so approving her own is refused for
        # being hers, not for a missing role.
        self.tokens = {
            "alice": add_principal(self.harbour_home, "alice", ["requester", "approver"],
                                   public_jwk=public_jwk(self.holder))["token"],
            "bob": add_principal(self.harbour_home, "bob", ["approver"])["token"],
            "audra": add_principal(self.harbour_home, "audra", ["auditor"])["token"],
            "pilot": add_principal(self.harbour_home, "demo-pilot", ["pilot"])["token"],
        }
        story.command("marque harbour principal add --home ./harbour alice --role requester "
                      "--role approver --key alice.pub.jwk   # and bob (approver), audra "
                      "(auditor), demo-pilot (pilot)")
        self.pilot_home = root / "pilot"
        identity = init_home(self.pilot_home, "demo-pilot")
        self.pilot_id: str = identity["pilot_id"]
        add_target(self.pilot_home, "bank", "sqlite:///" + str(self.bank))
        story.command("marque pilot init --home ./pilot --pilot-id demo-pilot && "
                      "marque pilot target add --home ./pilot bank sqlite:///bank.db")
        story.say(f"    Pilot {identity['pilot_id']}, ledger incarnation "
                  f"{identity['incarnation']}, target 'bank' → bank.db")


def _start(homes: _Homes, story: Story) -> tuple[Service, Service]:
    from marque.pilot.join import join

    harbour = Service("harbour", ["harbour", "serve", "--home", str(homes.harbour_home),
                                  "--listen", "127.0.0.1:0"], homes.root)
    story.command("marque harbour serve --home ./harbour --listen 127.0.0.1:0")
    story.say(f"    the Harbourmaster serves on {harbour.url}")
    try:
        pilot_url = f"http://127.0.0.1:{free_loopback_port()}"
        joined = join(homes.pilot_home, harbour.url, homes.tokens["pilot"], pilot_url)
        story.command(f"marque pilot join --home ./pilot --harbour {harbour.url} "
                      f"--token … --url {pilot_url}")
        story.say(f"    the Pilot pinned the issuer key(s) {', '.join(joined['trusted'])} "
                  "from the Harbourmaster's JWKS and registered")
        pilot = Service("pilot", ["pilot", "serve", "--home", str(homes.pilot_home),
                                  "--listen", pilot_url.removeprefix("http://")], homes.root)
    except BaseException:
        harbour.stop()
        raise
    story.command(f"marque pilot serve --home ./pilot --listen {pilot_url.removeprefix('http://')}")
    story.say(f"    the Pilot serves on {pilot.url} and reports outcomes to the Harbourmaster")
    return harbour, pilot


def _walk(homes: _Homes, harbour_url: str, story: Story) -> dict[str, Any]:
    """The change's walk through both services; returns the final request object."""
    from marque.clients.harbour import HarbourClient

    alice = HarbourClient(harbour_url, homes.tokens["alice"])
    bob = HarbourClient(harbour_url, homes.tokens["bob"])
    audra = HarbourClient(harbour_url, homes.tokens["audra"])
    try:
        rq = _ask(homes, alice, story)
        _approve(rq, alice, bob, story)
        _execute(homes, alice, rq, story)
        final = _reported(alice, rq, story)
        _read_logbook(audra, rq, harbour_url, story)
        return final
    finally:
        for client in (alice, bob, audra):
            client.close()


def _ask(homes: _Homes, alice: HarbourClient, story: Story) -> str:
    """Step 2: Alice's request, routed and previewed; its rq_ id."""
    story.step("2. Alice asks for a change",
               "a debit of 10 from account 1, paying invoice #42")
    story.command("marque request --pilot demo-pilot --target bank --sql '" + DEBIT
                  + "' --param '[1]' --executions 1 --max-rows 1 --reason 'invoice #42' "
                  "--request-id invoice-42")
    body = {"pilot_id": homes.pilot_id, "target": "bank",
            "change": {"statements": [{"sql": DEBIT, "params": [1]}]},
            "budget": {"executions": 1, "max_rows": 1}, "ttl_seconds": 900,
            "reason": "invoice #42"}
    request, created = alice.submit(body, request_id="invoice-42")
    rq: str = request["id"]
    routing = request.get("routing") or {}
    story.say(f"    request {rq} ({request['request_id']}), routing: "
              f"{routing.get('outcome')} to {routing.get('approvals')} approver(s) by "
              f"config {str(routing.get('config_cid'))[:19]}…")
    story.check("routed", created and request["state"] == "awaiting_approval"
                and routing.get("outcome") == "delegate",
                "a write is delegated: it waits for another person's approval")
    preview = request.get("preview") or {}
    show_preview(story, preview)
    story.check("previewed", preview.get("total_rows") == 1
                and preview.get("within_max_rows") is True
                and _balances(homes.bank) == {1: 100, 2: 100},
                "the Pilot previewed it exactly (1 row) and rolled it back: nothing changed")
    again, created_again = alice.submit(body, request_id="invoice-42")
    story.check("same_request", not created_again and again["id"] == rq,
                "asking again with the same request id is the same request, not a second")
    return rq


def _approve(rq: str, alice: HarbourClient, bob: HarbourClient, story: Story) -> None:
    """Steps 3 and 4: Alice's own approval refused, Bob's issuing the marque."""
    from marque.errors import MarqueError

    story.step("3. Alice tries to approve her own change")
    story.command(f"marque approve {rq}")
    try:
        alice.approve(rq, "looks fine to me")
        refused: MarqueError | None = None
    except MarqueError as exc:
        refused = exc
        story.say(f"    [yellow]refused[/]: {exc.code} — {exc.message}")
    story.check("self_approval", refused is not None and refused.code == "self_approval",
                "refused with self_approval: someone else must approve")

    story.step("4. Bob reads the preview and approves")
    story.command(f"marque approve {rq} --reason 'checked the preview: one row'")
    approved = bob.approve(rq, "checked the preview: one row")
    story.check("approved", approved["state"] == "prepared"
                and approved.get("marque_id") is not None,
                f"revalidated and issued: marque {approved.get('marque_id')}, "
                "bound to Alice's key")


def _execute(homes: _Homes, alice: HarbourClient, rq: str, story: Story) -> None:
    """Steps 5 to 7: the marque run through the Pilot, replayed, then refused as spent."""
    from marque.clients.pilot import PilotClient
    from marque.errors import MarqueError
    from marque.token import make_proof

    story.step("5. Alice executes it through the Pilot", "nonce pay-1")
    story.command(f"marque exec --request {rq} --key alice.jwk --nonce pay-1")
    issued = alice.marque_for(rq)
    token = issued["marque"]
    pilot = PilotClient(issued["pilot"]["url"])
    try:
        def run(nonce: str) -> Any:
            def prove() -> str:
                return make_proof(homes.holder, token, nonce=nonce, pilot_id=homes.pilot_id)
            try:
                outcome = pilot.execute(token, nonce, prove, on_event=story.event)
            except MarqueError as exc:
                story.say(f"    [yellow]refused[/]: {exc.code} — {exc.message}")
                return exc
            story.say(f"    → [bold]{outcome.status}[/] attempt={outcome.attempt} "
                      f"rows_affected={outcome.rows_affected} replayed={outcome.replayed}")
            return outcome

        first = run("pay-1")
        story.check("applied", getattr(first, "status", None) == "applied"
                    and not first.replayed and _balances(homes.bank)[1] == 90,
                    "applied once: account 1 is now 90")

        story.step("6. The same nonce again", "a retry after a dropped connection")
        again_run = run("pay-1")
        story.check("replayed", getattr(again_run, "status", None) == "applied"
                    and again_run.replayed and _balances(homes.bank)[1] == 90,
                    "the recorded outcome comes back (replayed): nothing ran twice")

        story.step("7. A new nonce on the spent marque")
        spent = run("pay-2")
        story.check("budget_exhausted", getattr(spent, "code", None) == "budget_exhausted",
                    "refused with budget_exhausted: the budget allowed one execution")
    finally:
        pilot.close()


def _reported(alice: HarbourClient, rq: str, story: Story) -> dict[str, Any]:
    """Step 8: the request as the Pilot's report left it at the Harbourmaster."""
    story.step("8. The outcome reaches the Harbourmaster", "the Pilot's outbox reports it")
    story.command(f"marque requests show {rq}")
    final = _wait_verified(alice, rq)
    executions = final.get("executions") or []
    story.say(f"    request {rq}: {final['state']}; executions "
              + ", ".join(f"{e['nonce']} attempt {e['attempt']} {e['status']}"
                          for e in executions))
    story.check("verified", final["state"] == "verified"
                and [(e["nonce"], e["status"]) for e in executions] == [("pay-1", "applied")],
                "verified: one execution, applied")
    return final


def _read_logbook(audra: HarbourClient, rq: str, harbour_url: str, story: Story) -> None:
    """Step 9: the request's entries in the logbook, and the whole chain verified."""
    from marque.errors import MarqueError
    from marque.logbook.remote import verify_over_http

    story.step("9. The logbook", "Audra, an auditor, reads and verifies it")
    story.command(f"marque logbook tail --harbour {harbour_url}")
    entries = audra.logbook(after=0, limit=1000).get("entries") or []
    mine = [e for e in entries if e.get("subject") == rq]
    for entry in mine:
        story.say(f"    #{entry['seq']:<3} {entry['kind']:<24} by {entry['actor']}")
    kinds = [e["kind"] for e in mine]
    story.check("logbook", "marque.issued" in kinds and "execution.applied" in kinds,
                "the request's whole life is in the logbook, execution.applied included")
    story.command(f"marque logbook verify --harbour {harbour_url}")
    try:
        verified = verify_over_http(audra, None)
        intact, detail = True, f"intact: {verified['entries']} entries, every hash chained"
    except MarqueError as exc:
        intact, detail = False, f"{exc.code}: {exc.message}"
    story.check("logbook_verified", intact, detail)


def _wait_verified(client: Any, rq: str) -> dict[str, Any]:
    deadline = time.monotonic() + REPORT_SECONDS
    while True:
        request: dict[str, Any] = client.get_request(rq)
        if request["state"] != "prepared" and request["state"] != "executing":
            return request
        if time.monotonic() > deadline:
            return request
        time.sleep(0.2)


def run_demo(*, as_json: bool = False) -> int:
    """Run the narrated demo; returns the exit status (0 only if every step behaved)."""
    story = Story(None if as_json else Console(highlight=False, soft_wrap=True))
    final: dict[str, Any] | None = None
    stopped: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="marque-demo-") as tmp:
        root = Path(tmp)
        story.say(f"[bold]Marque demo[/] — a temporary home at {root}")
        story.step("1. A Harbourmaster and a Pilot", "embedded defaults: SQLite everywhere")
        homes = _Homes(root, story)
        before = _balances(homes.bank)
        show_balances(story, "Balances before", before)
        try:
            harbour, pilot = _start(homes, story)
        except ServiceFailed as exc:
            story.check("services", False, str(exc))
        else:
            try:
                final = _walk(homes, harbour.url, story)
            except Exception as exc:  # a step that broke: said, never a traceback alone
                story.check("walk", False, f"{type(exc).__name__}: {exc}")
            finally:
                stopped = {"pilot": pilot.stop(), "harbour": harbour.stop()}
            story.step("10. Both services stop in order", "SIGTERM")
            story.check("stopped", stopped == {"pilot": 0, "harbour": 0},
                        f"exit statuses {stopped}")
        after = _balances(homes.bank)
        show_balances(story, "Balances after", after)
    ok = bool(story.steps) and all(step["ok"] for step in story.steps)
    if as_json:
        sys.stdout.write(json.dumps({"ok": ok, "steps": story.steps, "before": before,
                                     "after": after, "request": final}, sort_keys=True) + "\n")
    else:
        story.say("\n[bold green]Every step behaved.[/]" if ok
                  else "\n[bold red]Some step did not behave — see ✘ above.[/]")
    return 0 if ok else 1
