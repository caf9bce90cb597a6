"""Row 10: the Pilot's clock against the issuer's, at the window's edges, and a jump mid-run.

The Pilot runs as ``pilot serve`` under Debian's libfaketime with a fixed
offset ``D`` from the real clock (``_loss.faketime_env``; the uvicorn
``Date`` header is read back to prove the offset took). The world's
settings fix the allowances the edges are measured against: ``skew_seconds``
around a marque's ``nbf``/``exp``, ``pop_window_seconds`` around a proof's
``iat``. The harness issues marques and proofs with an explicit ``now``.

**The boundary grid.** For each offset ``D`` of :data:`OFFSETS` and each
margin ``m`` (seconds inside or outside an edge):

* *issuer's clock*: a marque and a proof made at the real time, against a
  Pilot ``D`` off — accepted iff ``-skew ≤ D ≤ ttl + skew`` (the marque) and
  ``|D| ≤ window`` (the proof); ``D`` itself sits on those edges ± m;
* *the Pilot's edges*: tokens placed ``m`` inside and outside each edge as
  the Pilot's clock reads it: ``nbf - skew``, ``exp + skew``,
  ``iat ± window``.

Inside the window is ``applied`` with one effect row; outside is refused
with exactly ``marque_not_yet_valid`` / ``marque_expired`` / ``pop_invalid``
and nothing claimed (the shared checker: rows per nonce, and no refused
nonce in the ledger).

**A jump mid-run.** A Pilot at ``D1`` dies at a crash point inside an
execution; the next one starts at ``D2 = D1 + J`` (an hour or a day, either
way) and the client retries the same nonce. The lease was written by the
first clock and is read by the second: the retry must settle (never
``in_progress`` for a dead owner), nothing may apply twice. In the
``unknown_owner`` variant the dead owner's process lock is removed first —
standing in for an owner on another host sharing the ledger, where the
lease alone decides. Clean jumps check that a settled nonce replays, a
second nonce spends the rest of the budget and a third is refused, and that
a proof replayed after ``ledger reap`` ran under a clock a day ahead (which
forgets proof ids) is still refused.
"""

from __future__ import annotations

import email.utils
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

from soak.harness import invoke
from soak.scenario import History, RunContext, ScenarioResult, scenario
from soak.scenarios._loss import check_kept, faketime_env
from soak.world import MARQUE, Op, PilotProcess, SoakWorld, _env

SKEW = 30.0
WINDOW = 60.0
TTL = 300
#: The Pilot's offsets from the issuer's clock: far off, and on every edge of framing 1.
EDGES = (-SKEW, WINDOW, TTL + SKEW)
FAR = (-86400.0, -3600.0, 0.0, 3600.0, 86400.0)
MARGINS_QUICK = (3.0,)
MARGINS_FULL = (3.0, 2.0, 5.0, 20.0)
JUMPS = (-86400.0, -3600.0, 3600.0, 86400.0)
JUMP_POINTS = ("after_claim", "after_stamp", "before_commit", "after_commit",
               "after_outcome_recorded")
DAY = 86400.0


def _pilot_clock_offset(url: str) -> float:
    """The Pilot's clock minus ours, from its ``Date`` header (1 s resolution)."""
    before = time.time()
    answer = httpx.get(f"{url}/v1/health", timeout=30)
    said = email.utils.parsedate_to_datetime(answer.headers["date"]).timestamp()
    return said - before


class Grid:
    """The boundary grid's cases, under one Pilot at one offset."""

    def __init__(self, ctx: RunContext, world: SoakWorld, offset: float, margin: float,
                 violations: list[str], figures: dict[str, Any]) -> None:
        self.ctx, self.world, self.offset, self.margin = ctx, world, offset, margin
        self.violations, self.figures = violations, figures
        self.index = 0

    def case(self, pilot: PilotProcess, edge: str, want: str,
             tokens: Callable[[float], dict[str, Any]]) -> None:
        """One token pair: ``tokens(p)`` places it, ``p`` being the Pilot's clock right now
        (read just before signing, so the margin is not eaten by the cases before)."""
        self.index += 1
        name = f"d{self.offset:+.0f}-m{self.margin:g}-{edge}-{self.index}"
        placed = tokens(time.time() + self.offset)
        proof_now = placed.pop("proof_now")
        op = self.world.op(name, **placed)
        nonce = "n-1"
        proof = self.world.proof(op, nonce, now=proof_now)
        answer = invoke(self.ctx, self.world, pilot.url, op, nonce, proof=proof,
                        offset=self.offset, margin=self.margin, edge=edge, want=want)
        got = answer.status if answer.type == "ok" else answer.code or answer.status
        self.figures[f"{'accepted' if want == 'applied' else 'refused'}"] += 1
        if got != want:
            self.violations.append(f"{name}: expected {want}, got {answer.type} "
                                   f"{answer.status} {answer.code}")

    def run(self, pilot: PilotProcess) -> None:
        d, m = self.offset, self.margin
        # Framing 1: the issuer's and holder's clock is the real one; the Pilot is D off.
        if d < -SKEW:
            want = "marque_not_yet_valid"
        elif d > TTL + SKEW:
            want = "marque_expired"
        elif abs(d) > WINDOW:
            want = "pop_invalid"
        else:
            want = "applied"
        self.case(pilot, "issuer_clock", want,
                  lambda p: {"now": p - d, "ttl_seconds": TTL, "proof_now": p - d})
        # The Pilot's own edges, as its clock reads them (a marque's times are whole
        # seconds, floored; a proof's iat too, hence the extra second outside).
        self.case(pilot, "nbf_inside", "applied", lambda p: {
            "now": p - 10, "not_before": p + SKEW - m, "ttl_seconds": TTL, "proof_now": p})
        self.case(pilot, "nbf_outside", "marque_not_yet_valid", lambda p: {
            "now": p - 10, "not_before": p + SKEW + m + 1, "ttl_seconds": TTL,
            "proof_now": p})
        self.case(pilot, "exp_inside", "applied", lambda p: {
            "now": p - SKEW + m - 60, "ttl_seconds": 60, "proof_now": p})
        self.case(pilot, "exp_outside", "marque_expired", lambda p: {
            "now": p - SKEW - m - 60, "ttl_seconds": 60, "proof_now": p})
        self.case(pilot, "iat_past_inside", "applied", lambda p: {
            "now": p, "proof_now": p - WINDOW + m})
        self.case(pilot, "iat_past_outside", "pop_invalid", lambda p: {
            "now": p, "proof_now": p - WINDOW - m})
        self.case(pilot, "iat_future_inside", "applied", lambda p: {
            "now": p, "proof_now": p + WINDOW - m})
        self.case(pilot, "iat_future_outside", "pop_invalid", lambda p: {
            "now": p, "proof_now": p + WINDOW + m + 1})


def _offsets(margin: float, limit: int) -> list[float]:
    """The Pilot's offsets for one margin: each edge from both sides first, then far off
    (``limit`` of them: a small count, as in make test, keeps the edges)."""
    near = [edge + side * margin for edge in EDGES for side in (-1, 1)]
    ordered = list(dict.fromkeys([*near, *FAR]))
    return sorted(ordered[:max(1, limit)])


def _grid(ctx: RunContext, world: SoakWorld, violations: list[str],
          figures: dict[str, Any]) -> int:
    cases = 0
    margins = MARGINS_FULL if ctx.full else MARGINS_QUICK
    per_offset = 9
    limit = len(EDGES) * 2 + len(FAR) if ctx.full else ctx.count // per_offset
    for margin in margins:
        for offset in _offsets(margin, limit):
            pilot = PilotProcess(world, env=faketime_env(offset))
            try:
                seen = _pilot_clock_offset(pilot.url)
                if abs(seen - offset) > 2.5:
                    violations.append(f"faketime did not take: asked {offset:+.0f} s, the "
                                      f"Pilot's Date header is {seen:+.1f} s off")
                grid = Grid(ctx, world, offset, margin, violations, figures)
                grid.run(pilot)
                cases += grid.index
            finally:
                pilot.stop()
    return cases


def _long_op(world: SoakWorld, name: str, executions: int = 1) -> Op:
    """A marque valid two days either side of now: every clock of the jumps accepts it."""
    return world.op(name, executions=executions, now=time.time() - 2 * DAY,
                    ttl_seconds=int(4 * DAY))


def _jump_crash(ctx: RunContext, world: SoakWorld, index: int, violations: list[str],
                figures: dict[str, Any]) -> None:
    unknown_owner = index % 2 == 1
    jump = JUMPS[(index // 2) % len(JUMPS)]
    point = JUMP_POINTS[index % len(JUMP_POINTS)]
    first = ctx.rng.choice((0.0, -3600.0, 3600.0))
    second = first + jump
    op = _long_op(world, f"jump-{index}")
    pilot = PilotProcess(world, env={"MARQUE_CRASH_AT": point, **faketime_env(first)})
    invoke(ctx, world, pilot.url, op, "n-1", proof=world.proof(op, "n-1",
                                                               now=time.time() + first),
           offset=first, point=point)
    died = pilot.wait_dead(3.0)
    if died is None:
        pilot.kill()
        said = pilot.stderr().strip().splitlines()
        violations.append(f"jump-{index}: crash point {point} never reached"
                          + (f" (the Pilot's last log line: {said[-1]})" if said else ""))
        return
    ctx.history.record("fault", op=op.op, point=point, offset=first, jump=jump)
    if unknown_owner:
        # The owner's lock gone: as if it ran on another host, only the lease can tell.
        for lock in (world.home / "processes").glob("*.lock"):
            lock.unlink()
    pilot = PilotProcess(world, env=faketime_env(second))
    try:
        started = time.monotonic()
        answer = invoke(ctx, world, pilot.url, op, "n-1", retry=True, offset=second,
                        proof=world.proof(op, "n-1", now=time.time() + second),
                        unknown_owner=unknown_owner)
        figures["jump_retry_seconds_max"] = max(figures.get("jump_retry_seconds_max", 0.0),
                                                round(time.monotonic() - started, 2))
        if answer.status == "in_progress":
            violations.append(f"jump-{index} ({point}, {first:+.0f} → {second:+.0f} s"
                              f"{', owner unknown' if unknown_owner else ''}): the retry "
                              "found the dead owner's lease live (in_progress)")
        if answer.type == "fail" and answer.status == "aborted_not_applied":
            # A new attempt of the same nonce may follow a proven abort: the client's retry.
            invoke(ctx, world, pilot.url, op, "n-1", retry=True, offset=second,
                   proof=world.proof(op, "n-1", now=time.time() + second))
    finally:
        pilot.stop()
    figures[f"jump_{'unknown_owner' if unknown_owner else 'known_owner'}"] += 1


def _jump_clean(ctx: RunContext, world: SoakWorld, index: int, violations: list[str],
                figures: dict[str, Any]) -> None:
    """Run, jump, replay, spend the rest, be refused; and a proof replayed after a reap
    under a clock a day ahead."""
    jump = JUMPS[index % len(JUMPS)]
    op = _long_op(world, f"clean-{index}", executions=2)
    pilot = PilotProcess(world)
    proof = world.proof(op, "n-1")
    try:
        first = invoke(ctx, world, pilot.url, op, "n-1", proof=proof)
    finally:
        pilot.stop()
    reap = subprocess.run([str(MARQUE), "ledger", "reap", "--home", str(world.home), "--json"],
                          capture_output=True, text=True, timeout=60,
                          env=_env(faketime_env(DAY)), stdin=subprocess.DEVNULL)
    if reap.returncode != 0:
        violations.append(f"clean-{index}: ledger reap under +1 day failed: {reap.stderr}")
    pilot = PilotProcess(world)
    try:
        # The same proof, still inside its window by the real clock; its id was reaped.
        replay = invoke(ctx, world, pilot.url, op, "n-1", proof=proof, replay=True)
        if first.type == "ok" and not (replay.code == "pop_replayed" or replay.replayed):
            violations.append(f"clean-{index}: a replayed proof after a reap under a clock a "
                              f"day ahead was {replay.type} {replay.status} {replay.code}")
    finally:
        pilot.stop()
    pilot = PilotProcess(world, env=faketime_env(jump))
    try:
        skewed = time.time() + jump
        expect = [("n-1", "applied"), ("n-2", "applied"), ("n-3", "budget_exhausted")]
        for nonce, want in expect:
            answer = invoke(ctx, world, pilot.url, op, nonce, offset=jump,
                            proof=world.proof(op, nonce, now=skewed))
            got = answer.status if answer.type == "ok" else answer.code or answer.status
            if got != want:
                violations.append(f"clean-{index} {nonce} after a {jump:+.0f} s jump: "
                                  f"expected {want}, got {answer.type} {answer.status} "
                                  f"{answer.code}")
    finally:
        pilot.stop()
    figures["jump_clean"] += 1


@scenario(10, "clock_skew", quick=120, full=600)
def run(ctx: RunContext) -> ScenarioResult:
    """The boundary grid under faketime, then clock jumps between attempts.

    The clean jumps run ``ledger reap`` under a clock a day ahead, which would
    reap the grid's short marques from the ledger the checker reads: they get
    a world of their own, checked on its own.
    """
    settings = {"skew_seconds": SKEW, "pop_window_seconds": WINDOW}
    world = SoakWorld(ctx.workdir / "world", settings=settings)
    reaped = SoakWorld(ctx.workdir / "world-reap", settings=settings)
    violations: list[str] = []
    figures: dict[str, Any] = _Counter()
    cases = _grid(ctx, world, violations, figures)
    jumps = max(len(JUMPS), ctx.count - cases)
    crash_jumps = jumps * 3 // 4
    for index in range(crash_jumps):
        _jump_crash(ctx, world, index, violations, figures)
    for index in range(jumps - crash_jumps):
        _jump_clean(ctx, reaped, index, violations, figures)
    figures["grid_cases"] = cases
    history = History.read(ctx.history.path)
    ops = {e["op"] for e in history if "op" in e and "marque_id" in e}
    clean = {op for op in ops if op.startswith("clean-")}
    for where, kept in ((world, ops - clean), (reaped, clean)):
        # Times to resolve are not kept: the logbook that dates a resolution was written
        # on a shifted clock, so they would measure the offset, not the resolution.
        found, counted, _seconds = check_kept(where, history, kept)
        violations += found
        for key, value in counted.items():
            if isinstance(value, int):
                figures[key] += value
    return ScenarioResult(ctx.name, cases + jumps, violations, dict(figures))


class _Counter(dict[str, Any]):
    def __missing__(self, key: str) -> int:
        return 0
