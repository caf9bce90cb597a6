"""Row 11: the Harbourmaster down half of the time while outcomes stream in; SIGKILL at the
outbox step.

A real Harbourmaster (``marque harbour init`` with a routing config that
allows reads and writes at once, ``harbour serve`` on a fixed loopback port)
issues every marque; a real Pilot (``pilot serve``, joined with ``marque
pilot join``) runs them, each inserting one row into the effects table. The
work goes in rounds: while the Harbourmaster is up the next round's
requests are made and a quarter of this round's marques run; then it is
stopped (SIGTERM or SIGKILL) and the rest run while it is down. The
Pilot's outbox keeps what it cannot deliver; its reporter retries.

The Pilot runs armed with ``MARQUE_CRASH_AT=before_report_ack@N`` (N drawn
per start): it dies after the Harbourmaster acknowledged a batch and before
its outbox records that, so every such batch is delivered twice. A dead
Pilot is restarted (armed again); a call it did not answer is retried with
the same nonce. During a quarter of the outages an operator also runs
``marque reconcile --home`` on the stopped Pilot's home: its reports for the
Harbourmaster must stay in the outbox, not be acknowledged to the local
logbook alone.

Afterwards, with the Harbourmaster up and the Pilot unarmed until its
outbox is drained: the shared checker on the Pilot's side (effects, ledger,
its own logbook), then the Harbourmaster's store read directly — exactly one
``execution.<status>`` entry per reported ``(marque_id, nonce, attempt,
status)`` and none the Pilot never reported, each request's state agreeing
with the ledger (applied ⇔ verified), its logbook verifying.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from support.harbour import Harbour, HarbourServer, free_port, routing_toml

from marque.token import public_jwk
from soak.harness import finish, invoke
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._loss import ListeningPilot
from soak.world import MARQUE, Answer, DiedAtStart, Op, PilotProcess, SoakWorld, _env

ROUTING = routing_toml({"operation": ["read", "write"], "outcome": "allow"})
REQUESTER = "soaker"
ROUND = 24
#: The first of ROUND marques of a round run while the Harbourmaster is up.
UP_SHARE = 6
INSERT = "INSERT INTO effects (op, at) VALUES (?, 0)"
DRAIN_SECONDS = 180.0
#: The share of outages during which an operator runs `marque reconcile --home`.
RECONCILE_SHARE = 0.25


class Harbourmaster:
    """A harbour home and its ``harbour serve``, started and stopped on one port."""

    def __init__(self, root: Path, world: SoakWorld) -> None:
        self.harbour = Harbour(root / "harbour", routing=ROUTING)
        self.pilot_token = self.harbour.add(world.pilot_id, "pilot")
        holder = root / "holder.pub.jwk"
        holder.write_text(json.dumps(public_jwk(world.holder)))
        self.token = self.harbour.add(REQUESTER, "requester", key=holder)
        self.port = free_port()
        self.server: HarbourServer | None = None
        self.up_seconds = 0.0
        self.down_seconds = 0.0
        self._since = time.monotonic()
        self.outages = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.server is None:
            self.down_seconds += time.monotonic() - self._since
            self._since = time.monotonic()
            self.server = HarbourServer(self.harbour.home, port=self.port)
            # Starting counts as down: nothing answered until it said it listens.
            self.down_seconds += time.monotonic() - self._since
            self._since = time.monotonic()

    def stop(self, sig: int) -> None:
        if self.server is not None:
            self.up_seconds += time.monotonic() - self._since
            self.server.stop(sig)
            self.server = None
            self._since = time.monotonic()
            self.outages += 1

    def issue(self, world: SoakWorld, name: str) -> Op:
        """A request for one effect row tagged ``name``, allowed at once; its marque."""
        assert self.server is not None
        body = {"pilot_id": world.pilot_id, "target": "t", "request_id": name,
                "change": {"statements": [{"sql": INSERT, "params": [name]}]},
                "budget": {"executions": 1, "max_rows": 1}, "ttl_seconds": 6 * 3600,
                "reason": "soak row 11"}
        made = self.server.call("POST", "/v1/requests", self.token, json=body)
        assert made.status_code == 201, made.text
        request = made.json()
        assert request["state"] == "prepared", request
        answer = self.server.call("GET", f"/v1/requests/{request['id']}/marque", self.token)
        assert answer.status_code == 200, answer.text
        marque = answer.json()
        return Op(name, marque["marque"], marque["marque_id"], 1)

    def store(self, sql: str) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.harbour.home / "harbour.sqlite3")
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()


class Pilots:
    """The joined Pilot's ``pilot serve``, armed to die at the outbox step, restarted."""

    def __init__(self, ctx: RunContext, world: SoakWorld, port: int) -> None:
        self.ctx, self.world, self.port = ctx, world, port
        self.current: PilotProcess | None = None
        self.kills = 0
        self.starts = 0

    def ensure(self, *, armed: bool = True) -> PilotProcess:
        if self.current is not None and self.current.alive:
            return self.current
        if self.current is not None:
            self.current.kill()  # reap it
            self.kills += 1
            self.ctx.history.record("fault", fault="sigkill", point="before_report_ack")
        for _ in range(20):
            env = None
            if armed:
                # The first start dies at its first acknowledged batch: every run has a kill.
                n = 1 if self.starts == 0 else self.ctx.rng.randint(1, 6)
                env = {"MARQUE_CRASH_AT": f"before_report_ack@{n}"}
            self.starts += 1
            try:
                self.current = ListeningPilot(self.world, self.port, env=env)
                return self.current
            except DiedAtStart as dead:
                # Start-up recovery reports what the outbox holds: the armed point can
                # come before the service listens. A kill like any other; start again.
                self.kills += 1
                self.ctx.history.record("fault", fault="sigkill", point="before_report_ack",
                                        at_start=True, exit=dead.status)
        raise RuntimeError("pilot serve died at start 20 times in a row")

    def stop(self) -> None:
        if self.current is not None:
            if self.current.alive:
                self.current.stop()
            else:
                self.current.kill()
            self.current = None


def _run_one(ctx: RunContext, world: SoakWorld, pilots: Pilots, op: Op, up: bool) -> None:
    """Execute one marque; a Pilot that died under the call is restarted and asked again."""
    for tries in range(5):
        pilot = pilots.ensure()
        answer: Answer = invoke(ctx, world, pilot.url, op, "n-1", harbour_up=up,
                                retry=tries > 0)
        if answer.type != "info" or answer.status not in ("lost", "error"):
            return
        pilot.wait_dead(1.0)


def _drain(world: SoakWorld, pilots: Pilots) -> float:
    """Wait for the Pilot (unarmed) to empty its outbox into the Harbourmaster; seconds."""
    pilots.stop()
    pilots.ensure(armed=False)
    started = time.monotonic()
    ledger = world.home / "ledger.sqlite3"
    while time.monotonic() - started < DRAIN_SECONDS:
        conn = sqlite3.connect(ledger)
        try:
            [(left,)] = conn.execute("SELECT count(*) FROM outbox WHERE acked_at IS NULL")
        finally:
            conn.close()
        if left == 0:
            break
        time.sleep(0.2)
    pilots.stop()
    return time.monotonic() - started


def _harbour_checks(world: SoakWorld, master: Harbourmaster) -> tuple[list[str], dict[str, Any]]:
    """The Harbourmaster's side, from its store: once each, nothing extra, states agree."""
    violations: list[str] = []
    ledger = sqlite3.connect(world.home / "ledger.sqlite3")
    try:
        outbox = {(m, n, int(a), s) for m, n, a, s in ledger.execute(
            "SELECT marque_id, nonce, attempt, status FROM outbox")}
        latest: dict[str, str] = {}
        for m, _n, _a, s in ledger.execute(
                "SELECT marque_id, nonce, attempt, status FROM attempts "
                "ORDER BY marque_id, nonce, attempt"):
            latest[m] = s
    finally:
        ledger.close()
    entries: Counter[tuple[str, str, int, str]] = Counter()
    for kind, body in master.store("SELECT kind, body FROM logbook WHERE kind LIKE "
                                   "'execution.%' AND kind != 'execution.reconciliation'"):
        b = json.loads(body)
        if "attempt" in b:
            entries[(b["marque_id"], b["nonce"], int(b["attempt"]),
                     kind.removeprefix("execution."))] += 1
    for key in sorted(outbox):
        if entries[key] != 1:
            violations.append(f"harbour: {entries[key]} execution.{key[3]} entries for "
                              f"{key[0]}/{key[1]} attempt {key[2]} (exactly one expected)")
    for key in sorted(set(entries) - outbox):
        violations.append(f"harbour: an execution.{key[3]} entry for {key[:3]} the Pilot "
                          "never reported")
    states = dict(master.store("SELECT marque_id, state FROM requests"))
    for marque_id, state in sorted(states.items()):
        status = latest.get(marque_id)
        want = {"applied": "verified", None: "prepared",
                "indeterminate": "reconciliation"}.get(status)
        if want is not None and state != want:
            violations.append(f"harbour: request of {marque_id} is {state}, the ledger says "
                              f"{status}")
        if status == "aborted_not_applied" and state not in ("executing", "failed"):
            violations.append(f"harbour: request of {marque_id} is {state}, the ledger says "
                              f"{status}")
    verified = subprocess.run([str(MARQUE), "logbook", "verify", "--home",
                               str(master.harbour.home), "--json"], capture_output=True,
                              text=True, timeout=120, env=_env(None), stdin=subprocess.DEVNULL)
    if verified.returncode != 0 or json.loads(verified.stdout).get("intact") is not True:
        violations.append(f"harbour: the logbook does not verify: {verified.stdout} "
                          f"{verified.stderr}")
    [(reports,)] = master.store("SELECT count(*) FROM reports")
    return violations, {"harbour_reports": reports, "harbour_requests": len(states),
                        "outbox_entries": len(outbox),
                        "verified": sum(s == "verified" for s in states.values())}


@scenario(11, "harbour_down", quick=200, full=10000)
def run(ctx: RunContext) -> ScenarioResult:
    """Rounds of ROUND marques: issued while up, run a quarter up and the rest down."""
    world = SoakWorld(ctx.workdir / "world")
    master = Harbourmaster(ctx.workdir, world)
    pilot_port = free_port()
    master.start()
    joined = subprocess.run(
        [str(MARQUE), "pilot", "join", "--home", str(world.home), "--harbour", master.url,
         "--token", master.pilot_token, "--url", f"http://127.0.0.1:{pilot_port}", "--json"],
        capture_output=True, text=True, timeout=60, env=_env(None), stdin=subprocess.DEVNULL)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    pilots = Pilots(ctx, world, pilot_port)
    made = 0
    reconciles = 0
    batch: list[Op] = []
    try:
        while batch or made < ctx.count:
            master.start()
            upcoming = [master.issue(world, f"hb-{made + i}")
                        for i in range(min(ROUND, ctx.count - made))]
            made += len(upcoming)
            for op in batch[:UP_SHARE]:
                _run_one(ctx, world, pilots, op, up=True)
            master.stop(ctx.rng.choice((signal.SIGTERM, signal.SIGKILL)))
            down_started = time.monotonic()
            for op in batch[UP_SHARE:]:
                _run_one(ctx, world, pilots, op, up=False)
            if batch and ctx.rng.random() < RECONCILE_SHARE:
                # An operator reconciles the stopped Pilot's home while the Harbourmaster
                # is away: what the outbox holds for it must stay there.
                pilots.stop()
                done = subprocess.run([str(MARQUE), "reconcile", "--home", str(world.home),
                                       "--json"], capture_output=True, text=True, timeout=120,
                                      env=_env(None), stdin=subprocess.DEVNULL)
                ctx.history.record("fault", fault="offline_reconcile", exit=done.returncode)
                reconciles += 1
            # Down at least as long as it was up this round: half of the time.
            time.sleep(max(0.0, min(2.0, master.up_seconds - master.down_seconds
                                    - (time.monotonic() - down_started))))
            batch = upcoming
        master.start()
        drain = _drain(world, pilots)
        harbour_violations, harbour_figures = _harbour_checks(world, master)
        total = master.up_seconds + master.down_seconds + (time.monotonic() - master._since)
        figures: dict[str, Any] = {
            "outcomes": made, "pilot_kills": pilots.kills, "pilot_starts": pilots.starts,
            "harbour_outages": master.outages, "offline_reconciles": reconciles,
            "harbour_down_fraction": round(master.down_seconds / total, 2) if total else None,
            "drain_seconds": round(drain, 1), **harbour_figures}
        return finish(ctx, world, made, figures=figures,
                      extra_violations=harbour_violations)
    finally:
        pilots.stop()
        if master.server is not None:
            master.stop(signal.SIGTERM)
