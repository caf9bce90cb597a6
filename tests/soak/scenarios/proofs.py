"""Matrix row 14: proof-of-possession abuse, refused with its code, claiming and spending nothing.

Each case presents a real marque with an abused proof to a real Pilot opened
on its home (the same ``open_pilot`` every command uses), cycling through
:data:`KINDS`:

* ``replay_other_nonce`` — a proof ``jti`` already spent by an applied
  execution, re-signed for a new nonce (``pop_replayed``);
* ``replay_same_nonce`` — the very proof of an applied execution sent again
  (``pop_replayed``, not the recorded outcome);
* ``replay_after_restart`` — as ``replay_other_nonce``, but the Pilot is
  closed and reopened in between: the jti cache lives in the ledger;
* ``replay_write_behind_after_restart`` — a fresh proof that read an applied
  outcome again (its jti written *behind* the answer, ``ledger/jtis.py``),
  then the Pilot restarts and the same proof comes back (``pop_replayed``);
* ``iat_past`` / ``iat_future`` — ``iat`` outside the window by a random
  1 s to 1 day (``pop_invalid``);
* ``other_key`` — signed by a key the marque does not name (``pop_key_mismatch``);
* ``other_key_claiming_holder`` — the holder's public key in the header, the
  attacker's signature (``pop_invalid``);
* ``other_nonce``, ``other_pilot``, ``wrong_ath`` (a proof for another
  marque of the same holder) — ``pop_invalid``;
* ``missing`` — no proof at all (``pop_missing``).

After each refusal the nonce has no claim, the marque's budget and the
ledger's attempts are unchanged and the bank holds no new stamp. A valid
execution every round proves the Pilot honours real proofs. Once per run the
replay also crosses a real ``marque pilot serve`` restart, over HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from marque.errors import MarqueError, Refusal
from marque.pilot import Pilot
from marque.token import make_proof, unverified_claims
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._forge import assemble, parts
from soak.scenarios._world import TokenWorld

#: Each abuse and the code it must be refused with.
KINDS: dict[str, str] = {
    "replay_other_nonce": "pop_replayed",
    "replay_same_nonce": "pop_replayed",
    "replay_after_restart": "pop_replayed",
    "replay_write_behind_after_restart": "pop_replayed",
    "iat_past": "pop_invalid",
    "iat_future": "pop_invalid",
    "other_key": "pop_key_mismatch",
    "other_key_claiming_holder": "pop_invalid",
    "other_nonce": "pop_invalid",
    "other_pilot": "pop_invalid",
    "wrong_ath": "pop_invalid",
    "missing": "pop_missing",
}
FULL_EACH = 100


class _Round:
    """What one case needs: the world, the open Pilot (reopened on a restart), the marque."""

    def __init__(self, world: TokenWorld, marque: str, other_marque: str) -> None:
        self.world = world
        self.marque = marque
        self.marque_id = str((unverified_claims(marque) or {})["jti"])
        self.other_marque = other_marque
        self.pilot: Pilot = world.open()
        self.window = self.pilot.options.pop_window_seconds

    def restart(self) -> None:
        self.pilot.close()
        self.pilot = self.world.open()

    def applied(self, nonce: str, proof: str) -> bool:
        try:
            return self.pilot.execute(self.marque, proof, nonce).status == "applied"
        except MarqueError:
            return False


def _abuse(kind: str, r: _Round, nonce: str, rng: Any) -> tuple[str, str | None, str]:
    """Set up the case; returns (nonce to send, proof to send, what was done)."""
    world, now = r.world, time.time()
    if kind.startswith("replay"):
        spent_nonce = nonce + "-spent"
        proof = world.proof(r.marque, spent_nonce)
        if not r.applied(spent_nonce, proof):
            raise RuntimeError("the setup execution did not apply")
        jti = parts(proof)[1]["jti"]
        if kind == "replay_same_nonce":
            return spent_nonce, proof, f"the proof of applied nonce {spent_nonce} again"
        if kind == "replay_write_behind_after_restart":
            reread = world.proof(r.marque, spent_nonce)
            outcome = r.pilot.execute(r.marque, reread, spent_nonce)
            if not outcome.replayed:
                raise RuntimeError("the re-read was not answered as a replay")
            r.restart()
            return spent_nonce, reread, "a re-read's proof (jti written behind), after restart"
        if kind == "replay_after_restart":
            r.restart()
        return nonce, world.proof(r.marque, nonce, jti=jti), f"jti {jti} re-signed for {nonce}"
    if kind == "iat_past":
        late = r.window + rng.randint(2, 86_400)
        return nonce, world.proof(r.marque, nonce, now=now - late), f"iat {late} s old"
    if kind == "iat_future":
        early = r.window + rng.randint(2, 86_400)
        return nonce, world.proof(r.marque, nonce, now=now + early), f"iat {early} s ahead"
    if kind == "other_key":
        return nonce, world.proof(r.marque, nonce, key=world.attacker), "signed by the attacker"
    if kind == "other_key_claiming_holder":
        real = world.proof(r.marque, nonce)
        header, claims, _ = parts(real)
        header["jwk"] = {k: world.holder[k] for k in ("kty", "crv", "x")}
        return nonce, assemble(header, claims, world.attacker), "holder's jwk, attacker's signature"
    if kind == "other_nonce":
        return nonce, world.proof(r.marque, nonce + "-other"), "a proof for another nonce"
    if kind == "other_pilot":
        return nonce, world.proof(r.marque, nonce, pilot_id="p2"), "a proof for Pilot p2"
    if kind == "wrong_ath":
        return nonce, world.proof(r.other_marque, nonce), "a proof for another marque"
    if kind == "missing":
        return nonce, None, "no proof"
    raise AssertionError(kind)


@scenario(14, "proofs", quick=600, full=FULL_EACH * len(KINDS))
def run(ctx: RunContext, *, accept: Callable[[str], bool] | None = None) -> ScenarioResult:
    """Row 14: every abuse kind in turn, each refused with its code and leaving no trace.

    ``accept`` (tests only) names kinds to send with a *valid* proof instead, so
    a test can show that an abuse that is not refused is reported.
    """
    result = ScenarioResult("proofs", cases=0)
    started = time.monotonic()
    world = TokenWorld(ctx.workdir / "proofs")
    marque = world.marque(executions=1_000_000)
    r = _Round(world, marque, world.marque())
    by_kind: dict[str, int] = {}
    controls = 0
    try:
        names = list(KINDS)
        for index in range(ctx.count):
            kind = names[index % len(names)]
            nonce = f"n{index}"
            if index % len(names) == 0:  # a valid execution each round: proofs do work
                control = f"control-{index}"
                controls += 1
                if not r.applied(control, world.proof(marque, control)):
                    result.violations.append(f"round {index}: a valid proof did not apply")
            _case(ctx, result, r, kind, nonce, accept, by_kind)
    finally:
        r.pilot.close()
    http = _across_service_restart(ctx, result, world, marque)
    spent = world.budget_left(r.marque_id)
    applied_expected = controls + sum(1 for i in range(ctx.count)
                                      if list(KINDS)[i % len(KINDS)].startswith("replay"))
    if spent is None or 1_000_000 - spent != applied_expected + http:
        result.violations.append(f"budget: {1_000_000 - (spent or 0)} executions spent, "
                                 f"expected {applied_expected + http} (setups and controls)")
    result.figures.update({"refused_by_kind": by_kind, "controls_applied": controls,
                           "http_restart_replays": http,
                           "seconds": round(time.monotonic() - started, 2)})
    return result


def _case(ctx: RunContext, result: ScenarioResult, r: _Round, kind: str, nonce: str,
          accept: Callable[[str], bool] | None, tally: dict[str, int]) -> None:
    result.cases += 1
    world = r.world
    try:
        sent_nonce, proof, what = _abuse(kind, r, nonce, ctx.rng)
    except (MarqueError, RuntimeError) as exc:
        result.violations.append(f"{kind} {nonce}: setup failed: {exc}")
        return
    if accept is not None and accept(kind):
        proof = world.proof(r.marque, sent_nonce)  # the weakened run: a valid proof instead
    before = (world.budget_left(r.marque_id), world.ledger_counts()["attempts"], world.stamps())
    claimed_before = _claimed(r, sent_nonce)
    ctx.history.record("invoke", op="exec", kind=kind, nonce=sent_nonce, what=what)
    expected = KINDS[kind]
    try:
        outcome = r.pilot.execute(r.marque, proof, sent_nonce)
    except Refusal as exc:
        ctx.history.record("fail", op="exec", kind=kind, nonce=sent_nonce, code=exc.code)
        tally[kind] = tally.get(kind, 0) + 1
        if exc.code != expected:
            result.violations.append(f"{kind} ({what}): refused with {exc.code}, expected "
                                     f"{expected}")
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
        ctx.history.record("info", op="exec", kind=kind, nonce=sent_nonce,
                           error=type(exc).__name__)
        result.violations.append(f"{kind} ({what}): {type(exc).__name__}: {exc}")
        return
    else:
        ctx.history.record("ok", op="exec", kind=kind, nonce=sent_nonce,
                           status=str(outcome.status))
        result.violations.append(f"ACCEPTED {kind} ({what}): answered {outcome.status}")
    after = (world.budget_left(r.marque_id), world.ledger_counts()["attempts"], world.stamps())
    if after != before or _claimed(r, sent_nonce) != claimed_before:
        result.violations.append(f"{kind} ({what}): left a trace: budget/attempts/stamps "
                                 f"{before} -> {after}, claimed {claimed_before} -> "
                                 f"{_claimed(r, sent_nonce)}")


def _claimed(r: _Round, nonce: str) -> int:
    return len(r.pilot.ledger.attempts(r.marque_id, nonce))


def _across_service_restart(ctx: RunContext, result: ScenarioResult, world: TokenWorld,
                            marque: str) -> int:
    """One proof applied through ``pilot serve``, replayed through a restarted one; 1 spent."""
    nonce = "n-http"
    body = {"marque": marque, "nonce": "n-http-2", "proof": ""}
    first = {"marque": marque, "nonce": nonce, "proof": world.proof(marque, nonce)}
    jti = parts(str(first["proof"]))[1]["jti"]
    body["proof"] = make_proof(world.holder, marque, nonce="n-http-2", pilot_id=world.pilot_id,
                               jti=jti)
    server = world.serve()
    try:
        applied = httpx.post(server.url + "/v1/executions", json=first, timeout=30)
        if applied.status_code != 200 or '"applied"' not in applied.text:
            result.violations.append(f"http: the first execution did not apply: "
                                     f"{applied.status_code} {applied.text[:200]}")
    finally:
        server.stop()
    server = world.serve()
    try:
        ctx.history.record("invoke", op="http_exec", kind="replay_across_service_restart",
                           nonce="n-http-2")
        again = httpx.post(server.url + "/v1/executions", json=body, timeout=30)
        code = again.json().get("code") if again.headers.get(
            "content-type", "").startswith("application/problem+json") else None
        ctx.history.record("fail" if code else "info", op="http_exec",
                           kind="replay_across_service_restart", status=again.status_code,
                           code=code)
        if again.status_code != 403 or code != "pop_replayed":
            result.violations.append(f"http: a jti replayed across a service restart got "
                                     f"{again.status_code} {again.text[:200]}")
    finally:
        server.stop()
    return 1
