"""Matrix row 13: forged marques, preview tokens and query tokens, and a byte-mutation fuzz.

Every case hands one forged token to the real verifier of its kind
(:func:`marque.token.verify_marque`, :func:`marque.token.service_tokens.verify_preview_token`,
:func:`~marque.token.service_tokens.verify_query_token`; proofs too, in the fuzz,
through :func:`marque.token.verify_proof`). The invariant: the verifier
refuses with a typed :class:`~marque.errors.Refusal` — the expected code for a
named vector — and never accepts, never raises anything untyped. The label
reader the HTTP layer uses on an unverified token
(:func:`marque.token.unverified_claims`) must not raise either.

The named vectors (``_forge.vectors``: ``alg: none``, HS256 keyed with the
public key, hostile ``kid``s, ``jku``/``x5u``/``x5c``/embedded ``jwk``, wrong
``typ``, duplicate JSON members, edits under the old signature, malformed
serialisations…) run first, all of them; the rest of ``ctx.count`` is fuzz:
a random byte mutation of a valid token, which must be refused unless it
only added whitespace around the token (read as the same token).

Then a sample of the vectors goes through a real ``marque pilot serve``:
``POST /v1/executions`` (with a proof the holder really signed for the
forged token), ``POST /v1/previews`` and ``GET /v1/marques/{id}``, each
answered by a 4xx problem document with the vector's code, and afterwards
the ledger holds no claim, no budget row, no attempt, and the bank no stamp.
Controls prove the server is not refusing everything: a valid preview and
query are answered 200, and a valid marque then executes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from marque.errors import MarqueError, Refusal
from marque.token import (
    TrustedKeys,
    make_proof,
    public_jwk,
    unverified_claims,
    verify_marque,
    verify_proof,
)
from marque.token.service_tokens import verify_preview_token, verify_query_token
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._forge import Vector, mutate, vectors
from soak.scenarios._world import TARGET, TokenWorld

#: Named vectors per run (all three kinds); FULL is these plus 10,000 fuzzed tokens.
VECTORS = 413
FUZZ_FULL = 10_000
#: Vectors also sent to the real service, per kind.
HTTP_SAMPLE = 12
#: Vectors sent to the service in every run: the campaign's findings (see the README).
ALWAYS_OVER_HTTP = ("nested", "surrogate", "2 MB")
#: Request bodies that are not even a JSON object to read a token from.
DEEP_BODY = b"[" * 100_000 + b"]" * 100_000
_TIMEOUT = 30.0

Verifier = Callable[[str], Any]


class Verifiers:
    """The real verifiers of one world, each taking just a token."""

    def __init__(self, world: TokenWorld, marque_token: str) -> None:
        self.world = world
        self.trusted = TrustedKeys([public_jwk(world.issuer)])
        self.marque = self.verify_marque(marque_token)
        self.nonce = "n-fuzz"
        self.by_kind: dict[str, Verifier] = {
            "marque": self.verify_marque, "preview": self.verify_preview,
            "query": self.verify_query, "proof": self.verify_proof,
        }

    def verify_marque(self, token: str) -> Any:
        return verify_marque(token, self.trusted, pilot_id=self.world.pilot_id,
                             incarnation=self.world.incarnation, targets={TARGET})

    def verify_preview(self, token: str) -> Any:
        return verify_preview_token(token, self.trusted, pilot_id=self.world.pilot_id,
                                    incarnation=self.world.incarnation, targets={TARGET},
                                    remember_jti=None)

    def verify_query(self, token: str) -> Any:
        return verify_query_token(token, self.trusted, pilot_id=self.world.pilot_id,
                                  remember_jti=None)

    def verify_proof(self, token: str) -> Any:
        return verify_proof(token, self.marque, nonce=self.nonce, pilot_id=self.world.pilot_id,
                            remember_jti=None)


def judge(verifier: Verifier, token: str) -> tuple[str, str | None]:
    """``("accepted", None)``, ``("refused", code)`` or ``("untyped", exception name)``."""
    try:
        verifier(token)
    except Refusal as exc:
        return "refused", exc.code
    except MarqueError as exc:  # typed, but not a refusal: reported with its code
        return "typed_other", exc.code
    except Exception as exc:  # noqa: BLE001 - exactly what this row looks for
        return "untyped", f"{type(exc).__name__}: {str(exc)[:120]}"
    return "accepted", None


def label_safe(token: str) -> str | None:
    """None if ``unverified_claims`` (the HTTP layer's label reader) copes; else the error."""
    try:
        unverified_claims(token)
    except Exception as exc:  # noqa: BLE001 - it must never raise
        return f"{type(exc).__name__}"
    return None


def _all_vectors(world: TokenWorld, valid: dict[str, str]) -> list[Vector]:
    out: list[Vector] = []
    for kind in ("marque", "preview", "query"):
        others = {k: t for k, t in valid.items() if k != kind}
        out += vectors(kind, valid[kind], issuer=world.issuer, attacker=world.attacker,
                       others=others)
    return out


@scenario(13, "forgery", quick=3_000, full=VECTORS + FUZZ_FULL)
def run(ctx: RunContext, *, verifiers: Callable[[Verifiers], Verifiers] | None = None
        ) -> ScenarioResult:
    """Row 13: every named forgery, then fuzz, refused by the real verifiers and service.

    ``verifiers`` lets a test swap in a deliberately weakened verifier to
    prove the checker reports what it must (never used by the soak).
    """
    result = ScenarioResult("forgery", cases=0)
    started = time.monotonic()
    world = TokenWorld(ctx.workdir / "forgery")
    marque_token = world.marque()
    marque_id = str((unverified_claims(marque_token) or {})["jti"])
    valid = {"marque": marque_token, "preview": world.preview(),
             "query": world.query(marque_id)}
    check = Verifiers(world, marque_token)
    if verifiers is not None:
        check = verifiers(check)
    proof = make_proof(world.holder, marque_token, nonce=check.nonce, pilot_id=world.pilot_id)
    valid["proof"] = proof
    for kind, token in valid.items():  # the controls: each verifier accepts a real token
        verdict, code = judge(check.by_kind[kind], token)
        if verdict != "accepted":
            result.violations.append(f"control: a valid {kind} was not accepted ({verdict} "
                                     f"{code}): the verifier refuses everything")

    named = _all_vectors(world, valid)
    if len(named) != VECTORS:
        result.violations.append(f"expected {VECTORS} named vectors, built {len(named)}: "
                                 "update VECTORS (FULL's count) with the vectors")
    chosen = named if ctx.count >= len(named) else ctx.rng.sample(named, ctx.count)
    refused_by_code: dict[str, int] = {}
    for vector in chosen:
        _one(ctx, result, check.by_kind[vector.kind], vector.kind, vector.name, vector.token,
             expect=vector.code, original=None, tally=refused_by_code)

    fuzz = max(0, ctx.count - len(chosen))
    kinds = ("marque", "preview", "query", "proof")
    for _ in range(fuzz):
        kind = ctx.rng.choice(kinds)
        mutated, what = mutate(valid[kind], ctx.rng)
        _one(ctx, result, check.by_kind[kind], kind, f"{kind} fuzz: {what}", mutated,
             expect=None, original=valid[kind], tally=refused_by_code)

    http = _over_http(ctx, result, world, [v for v in chosen], valid, marque_id)
    result.figures.update({
        "named_vectors": len(chosen), "fuzzed": fuzz, "accepted_forgeries": sum(
            1 for v in result.violations if v.startswith("ACCEPTED")),
        "refused_by_code": dict(sorted(refused_by_code.items())), **http,
        "seconds": round(time.monotonic() - started, 2),
    })
    return result


def _one(ctx: RunContext, result: ScenarioResult, verifier: Verifier, kind: str, name: str,
         token: str, *, expect: str | None, original: str | None,
         tally: dict[str, int]) -> None:
    """One case: hand ``token`` to ``verifier``; record and judge the answer."""
    result.cases += 1
    ctx.history.record("invoke", op="verify", kind=kind, vector=name[:200])
    verdict, code = judge(verifier, token)
    label = label_safe(token)
    if label is not None:
        result.violations.append(f"{name}: unverified_claims raised {label} (an untyped "
                                 "exception at the HTTP layer's label read)")
    if verdict == "refused":
        ctx.history.record("fail", op="verify", kind=kind, vector=name[:200], code=code)
        tally[str(code)] = tally.get(str(code), 0) + 1
        if expect is not None and code != expect:
            result.violations.append(f"{name}: refused with {code}, expected {expect}")
        return
    if verdict == "accepted":
        ctx.history.record("ok", op="verify", kind=kind, vector=name[:200])
        if original is not None and token.strip() == original:
            tally["accepted_same_token"] = tally.get("accepted_same_token", 0) + 1
            return  # whitespace around a token is not part of it: the same token
        result.violations.append(f"ACCEPTED {name}")
        return
    ctx.history.record("info", op="verify", kind=kind, vector=name[:200], code=code,
                       verdict=verdict)
    result.violations.append(f"{name}: {verdict} error {code}")


def _over_http(ctx: RunContext, result: ScenarioResult, world: TokenWorld,
               chosen: list[Vector], valid: dict[str, str], marque_id: str) -> dict[str, Any]:
    """A sample of the vectors against a real ``pilot serve``; nothing may be claimed."""
    by_kind: dict[str, list[Vector]] = {}
    for vector in chosen:
        by_kind.setdefault(vector.kind, []).append(vector)
    sample = [v for kind in sorted(by_kind)
              for v in ctx.rng.sample(by_kind[kind], min(HTTP_SAMPLE, len(by_kind[kind])))]
    # Those that once reached past the verifiers always go (a 500 and an acceptance).
    sample += [v for v in chosen if v not in sample and any(
        word in v.name for word in ALWAYS_OVER_HTTP)]
    statuses: dict[str, int] = {}
    server = world.serve()
    try:
        with httpx.Client(base_url=server.url, timeout=_TIMEOUT) as client:
            for control, response in (
                ("preview", client.post("/v1/previews", json={"preview": valid["preview"]})),
                ("query", client.get(f"/v1/marques/{marque_id}", headers={
                    "Authorization": f"Bearer {valid['query']}"})),
            ):
                if response.status_code != 200:
                    result.violations.append(f"http control: a valid {control} token got "
                                             f"{response.status_code}: {response.text[:200]}")
            for path in ("/v1/executions", "/v1/previews"):
                response = client.post(path, content=DEEP_BODY,
                                       headers={"content-type": "application/json"})
                ctx.history.record("fail" if response.status_code == 400 else "info",
                                   op="http", vector=f"{path}: body nested 100,000 deep",
                                   status=response.status_code)
                _check_problem(result, Vector(f"{path}: body nested 100,000 deep", "body",
                                              "", "input_invalid"), response)
            for n, vector in enumerate(sample):
                response = _send(client, world, vector, n)
                if response is None:
                    continue
                statuses[str(response.status_code)] = statuses.get(
                    str(response.status_code), 0) + 1
                ctx.history.record("fail" if 400 <= response.status_code < 500 else "info",
                                   op="http", kind=vector.kind, vector=vector.name[:200],
                                   status=response.status_code)
                _check_problem(result, vector, response)
            counts = world.ledger_counts()
            if (counts["claims"], counts["budgets"], counts["attempts"]) != (0, 0, 0) \
                    or world.stamps() or world.balance() != 100:
                result.violations.append(f"http: forged tokens left traces: {counts}, "
                                         f"stamps {world.stamps()}, balance {world.balance()}")
            # The last control: the same service honours a valid marque.
            executed = client.post("/v1/executions", json={
                "marque": valid["marque"], "nonce": "n-control",
                "proof": world.proof(valid["marque"], "n-control")})
            if executed.status_code != 200 or '"applied"' not in executed.text:
                result.violations.append(f"http control: a valid marque did not apply: "
                                         f"{executed.status_code} {executed.text[:200]}")
    finally:
        server.stop()
    return {"http_sent": sum(statuses.values()), "http_statuses": statuses}


def _send(client: httpx.Client, world: TokenWorld, vector: Vector,
          n: int) -> httpx.Response | None:
    token = vector.token
    if vector.kind == "marque":
        nonce = f"n-forged-{n}"
        # The holder really signs a proof for the forged token: only the marque is forged.
        proof = (world.proof(token.strip(), nonce) if token.strip() and token.isascii()
                 else None)
        return client.post("/v1/executions", json={"marque": token, "nonce": nonce,
                                                   "proof": proof})
    if vector.kind == "preview":
        return client.post("/v1/previews", json={"preview": token})
    if not token.isascii() or any(c in token for c in "\r\n\x00") or not token.strip():
        return None  # not sendable as an HTTP header value
    claims = unverified_claims(token) or {}
    marque_id = claims.get("marque_id")
    path_id = marque_id if isinstance(marque_id, str) and marque_id.isalnum() else "mq_x"
    return client.get(f"/v1/marques/{path_id}", headers={"Authorization": f"Bearer {token}"})


def _check_problem(result: ScenarioResult, vector: Vector, response: httpx.Response) -> None:
    if not 400 <= response.status_code < 500:
        result.violations.append(f"http {vector.name}: status {response.status_code} (not a "
                                 f"4xx refusal): {response.text[:200]}")
        return
    if not response.headers.get("content-type", "").startswith("application/problem+json"):
        result.violations.append(f"http {vector.name}: {response.status_code} without a "
                                 "problem document")
        return
    body = response.json()
    code = body.get("code")
    if code != vector.code or body.get("type") != f"urn:marque:error:{code}":
        result.violations.append(f"http {vector.name}: problem {body.get('code')!r}, expected "
                                 f"{vector.code}")
