"""Marques and proofs of possession: issuing, verifying, and every refusal code (DESIGN §2).

Real Ed25519 keys and signatures throughout. Hostile tokens are built by hand
(header and payload JSON, base64url, and a signature made with the
``cryptography`` package directly) so the verifier is tested against bytes it
did not produce itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from marque.cid import cid
from marque.errors import (
    InvalidInput,
    MarqueError,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    PopInvalid,
    PopKeyMismatch,
    PopMissing,
    PopReplayed,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.token import (
    Budget,
    Change,
    Guard,
    Marque,
    Statement,
    TrustedKeys,
    issue_marque,
    make_proof,
    new_key,
    public_jwk,
    thumbprint,
    verify_marque,
    verify_proof,
)

NOW = 1_800_000_000.0
TTL = 600
PILOT = "pilot-a"
INCARNATION = "inc-1"
TARGET = "orders"
NONCE = "nonce-1"


# -- hand-made JWS ------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64json(value: Any) -> str:
    return b64(json.dumps(value, separators=(",", ":")).encode("utf-8"))


def unb64json(segment: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def forge(header: dict[str, Any], claims: Any, signer: dict[str, Any]) -> str:
    """A compact JWS signed with ``signer``'s Ed25519 key, whatever header and claims say."""
    raw = base64.urlsafe_b64decode(signer["d"] + "=" * (-len(signer["d"]) % 4))
    signing_input = f"{b64json(header)}.{b64json(claims)}"
    signature = Ed25519PrivateKey.from_private_bytes(raw).sign(signing_input.encode("ascii"))
    return f"{signing_input}.{b64(signature)}"


def parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    head, payload, _ = token.split(".")
    return unb64json(head), unb64json(payload)


@dataclass
class Recorder:
    """A set-backed replay cache that also records every call made to it."""

    seen: set[str] = field(default_factory=set)
    calls: list[tuple[str, float]] = field(default_factory=list)

    def __call__(self, jti: str, forget_after: float) -> bool:
        self.calls.append((jti, forget_after))
        if jti in self.seen:
            return False
        self.seen.add(jti)
        return True


# -- fixtures -----------------------------------------------------------------------------


@dataclass
class World:
    issuer: dict[str, Any]
    holder: dict[str, Any]
    trusted: TrustedKeys
    change: Change
    budget: Budget

    def issue(self, **overrides: Any) -> str:
        args: dict[str, Any] = {
            "pilot_id": PILOT,
            "incarnation": INCARNATION,
            "target": TARGET,
            "holder_jwk": public_jwk(self.holder),
            "change": self.change,
            "budget": self.budget,
            "ttl_seconds": TTL,
            "now": NOW,
        }
        args.update(overrides)
        issuer = args.pop("issuer_key", self.issuer)
        return issue_marque(issuer, **args)

    def verify(self, token: str, **overrides: Any) -> Marque:
        args: dict[str, Any] = {
            "pilot_id": PILOT,
            "incarnation": INCARNATION,
            "targets": {TARGET, "other"},
            "now": NOW,
        }
        args.update(overrides)
        return verify_marque(token, self.trusted, **args)

    def reissue(self, edit: Callable[[dict[str, Any], dict[str, Any]], None]) -> str:
        """A genuine marque, edited, then re-signed with the trusted issuer key."""
        header, claims = parts(self.issue())
        edit(header, claims)
        return forge(header, claims, self.issuer)


@pytest.fixture
def world() -> World:
    issuer = new_key()
    change = Change(
        statements=(
            Statement("UPDATE orders SET status = ? WHERE id = ?", ("shipped", 42)),
            Statement("DELETE FROM carts WHERE order_id = ?", (42,)),
        ),
        guards=(Guard("SELECT status FROM orders WHERE id = ?", (42,), "paid"),),
        isolation="serializable",
        statement_timeout_ms=5000,
    )
    return World(issuer, new_key(), TrustedKeys([public_jwk(issuer)]), change, Budget(2, 1))


@pytest.fixture
def marque(world: World) -> Marque:
    return world.verify(world.issue())


# -- keys ---------------------------------------------------------------------------------


def test_thumbprint_matches_rfc8037_example() -> None:
    """thumbprint() reproduces the Ed25519 JWK thumbprint of RFC 8037 Appendix A.3."""
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
    assert thumbprint(jwk) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_new_key_is_private_ed25519_with_thumbprint_kid() -> None:
    """new_key() gives an Ed25519 private JWK whose kid is its RFC 7638 thumbprint."""
    key = new_key()
    assert (key["kty"], key["crv"], key["alg"]) == ("OKP", "Ed25519", "EdDSA")
    assert key["d"]
    assert key["kid"] == thumbprint(key) == thumbprint(public_jwk(key))
    assert new_key()["d"] != key["d"]


def test_public_jwk_never_leaks_d() -> None:
    """public_jwk() keeps kty, crv, x, kid and alg, and never the private member d."""
    key = new_key()
    public = public_jwk(key)
    assert "d" not in public
    assert public == {k: key[k] for k in ("kty", "crv", "x", "kid", "alg")}


def test_public_jwk_refuses_non_ed25519() -> None:
    """public_jwk() refuses a key that is not Ed25519 with input_invalid."""
    with pytest.raises(InvalidInput):
        public_jwk({"kty": "OKP", "crv": "X25519", "x": new_key()["x"]})


def test_trusted_keys_store_public_part_only() -> None:
    """TrustedKeys.add keeps only the public key and returns its kid."""
    key = new_key()
    trusted = TrustedKeys()
    assert trusted.add(key) == key["kid"]
    assert len(trusted) == 1
    assert trusted.get(key["kid"]) is not None
    assert trusted.get("nope") is None
    (published,) = trusted.to_jwks()["keys"]
    assert "d" not in published
    assert published == public_jwk(key)


def test_trusted_keys_default_kid_is_thumbprint() -> None:
    """A trusted JWK without kid is filed under its RFC 7638 thumbprint."""
    key = new_key()
    bare = {"kty": "OKP", "crv": "Ed25519", "x": key["x"]}
    assert TrustedKeys().add(bare) == thumbprint(bare)


@pytest.mark.parametrize(
    "jwk",
    [
        {"kty": "RSA", "n": "AQAB", "e": "AQAB"},
        {"kty": "OKP", "crv": "X25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        {"kty": "OKP", "crv": "Ed25519", "x": "AAAA"},
        {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
            "alg": "HS256",
        },
        {"kty": "oct", "k": "c2VjcmV0"},
    ],
    ids=["rsa", "x25519", "short-x", "alg-hs256", "symmetric"],
)
def test_trusted_keys_refuse_non_ed25519(jwk: dict[str, Any]) -> None:
    """TrustedKeys.add refuses anything but an Ed25519 EdDSA key with input_invalid."""
    with pytest.raises(InvalidInput):
        TrustedKeys().add(jwk)


def test_trusted_keys_refuse_kid_reuse_for_another_key() -> None:
    """One kid can never name two different trusted keys."""
    first, second = new_key(), new_key()
    trusted = TrustedKeys([first])
    with pytest.raises(InvalidInput):
        trusted.add({**public_jwk(second), "kid": first["kid"]})


# -- budget and change ---------------------------------------------------------------------


def test_budget_claim_round_trip() -> None:
    """Budget.to_claim and from_claim are inverses."""
    budget = Budget(executions=3, max_rows=0, attempts_per_nonce=1)
    assert budget.to_claim() == {"executions": 3, "max_rows": 0, "attempts_per_nonce": 1}
    assert Budget.from_claim(budget.to_claim()) == budget


@pytest.mark.parametrize(
    "claim",
    [
        {"executions": 0, "max_rows": 1, "attempts_per_nonce": 1},
        {"executions": 1, "max_rows": -1, "attempts_per_nonce": 1},
        {"executions": 1, "max_rows": 1, "attempts_per_nonce": 0},
        {"executions": True, "max_rows": 1, "attempts_per_nonce": 1},
        {"executions": 1.0, "max_rows": 1, "attempts_per_nonce": 1},
        {"executions": "1", "max_rows": 1, "attempts_per_nonce": 1},
        {"executions": 1, "max_rows": 1},
        {"executions": 1, "max_rows": 1, "attempts_per_nonce": 1, "bonus": 1},
        [1, 1, 1],
    ],
    ids=[
        "zero-exec",
        "neg-rows",
        "zero-attempts",
        "bool",
        "float",
        "str",
        "missing",
        "extra",
        "list",
    ],
)
def test_budget_from_claim_refuses_bad_shapes(claim: Any) -> None:
    """Budget.from_claim refuses anything but three integers in range, as marque_invalid."""
    with pytest.raises(MarqueInvalid):
        Budget.from_claim(claim)


def test_budget_constructor_refuses_bad_values() -> None:
    """Building a Budget in code with out-of-range values is input_invalid."""
    with pytest.raises(InvalidInput):
        Budget(executions=0, max_rows=1)


def test_change_claim_round_trip_and_cid(world: World) -> None:
    """Change.to_claim carries its own CID, which excludes itself from the preimage."""
    claim = world.change.to_claim()
    assert claim["change_cid"] == world.change.change_cid
    assert claim["change_cid"] == cid(claim, exclude="change_cid")
    assert claim["statements"][0] == {
        "sql": "UPDATE orders SET status = ? WHERE id = ?",
        "params": ["shipped", 42],
    }
    assert claim["guards"] == [
        {
            "sql": "SELECT status FROM orders WHERE id = ?",
            "params": [42],
            "expect": "paid",
            "when": "before",
        }
    ]
    assert Change.from_claim(json.loads(json.dumps(claim))) == world.change


def _claim_with(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    claim = Change((Statement("SELECT 1"),), (Guard("SELECT 1"),)).to_claim()
    edit(claim)
    claim["change_cid"] = cid(claim, exclude="change_cid")  # only the shape is wrong
    return claim


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.update(statements=[]),
        lambda c: c["statements"][0].update(sql=""),
        lambda c: c["statements"][0].update(sql=7),
        lambda c: c["statements"][0].update(params=[[1]]),
        lambda c: c["statements"][0].update(params=[{"a": 1}]),
        lambda c: c["statements"][0].update(params="1"),
        lambda c: c["statements"][0].pop("params"),
        lambda c: c["statements"][0].update(extra=1),
        lambda c: c.update(isolation="read_uncommitted"),
        lambda c: c.update(statement_timeout_ms=0),
        lambda c: c.update(statement_timeout_ms=True),
        lambda c: c["guards"][0].update(when="sometimes"),
        lambda c: c["guards"][0].update(expect=[1]),
        lambda c: c.update(guards={}),
        lambda c: c.update(effect="x"),
        lambda c: c.pop("isolation"),
    ],
    ids=[
        "no-statements",
        "empty-sql",
        "sql-not-str",
        "list-param",
        "object-param",
        "params-not-list",
        "params-missing",
        "statement-extra",
        "isolation",
        "timeout-zero",
        "timeout-bool",
        "guard-when",
        "guard-expect-list",
        "guards-not-list",
        "unknown-member",
        "isolation-missing",
    ],
)
def test_change_from_claim_refuses_bad_shapes(edit: Callable[[dict[str, Any]], None]) -> None:
    """Change.from_claim refuses any shape to_claim would not produce, as marque_invalid."""
    with pytest.raises(MarqueInvalid):
        Change.from_claim(_claim_with(edit))


def test_change_from_claim_refuses_cid_mismatch() -> None:
    """Change.from_claim refuses a change whose change_cid names different work."""
    claim = Change((Statement("DELETE FROM t WHERE id = ?", (1,)),)).to_claim()
    claim["statements"][0]["params"] = [2]
    with pytest.raises(MarqueInvalid, match="change_cid"):
        Change.from_claim(claim)


def test_change_constructor_refuses_bad_work() -> None:
    """Building an empty or malformed Change in code is input_invalid."""
    with pytest.raises(InvalidInput):
        Change(())
    with pytest.raises(InvalidInput):
        Change((Statement("SELECT 1"),), isolation="chaos")
    with pytest.raises(InvalidInput):
        Statement("SELECT ?", (float("nan"),))
    with pytest.raises(InvalidInput):
        Guard("SELECT 1", when="never")


# -- issuing and verifying marques ----------------------------------------------------------


def test_issue_then_verify_round_trip(world: World) -> None:
    """A marque issued for this Pilot, incarnation and target verifies with every claim intact."""
    token = world.issue(subject="alice", marque_id="mq_test")
    marque = world.verify(token)
    header, claims = parts(token)
    assert header == {"alg": "EdDSA", "typ": "marque+jwt", "kid": world.issuer["kid"]}
    assert marque.claims() == claims
    assert marque.token == token
    assert marque.marque_id == "mq_test"
    assert (marque.issuer, marque.subject) == ("marque-local", "alice")
    assert (marque.issued_at, marque.not_before, marque.expires_at) == (NOW, NOW, NOW + TTL)
    assert (marque.pilot_id, marque.incarnation, marque.target) == (PILOT, INCARNATION, TARGET)
    assert marque.jkt == thumbprint(world.holder)
    assert marque.kid == world.issuer["kid"]
    assert marque.budget == world.budget
    assert marque.change == world.change
    assert claims["change"]["change_cid"] == world.change.change_cid
    digest = hashlib.sha256(token.encode("ascii")).digest()
    assert marque.token_hash == b64(digest)


def test_issue_default_marque_id_is_random() -> None:
    """Without marque_id, each marque gets a fresh mq_ id of 26 base32 characters."""
    issuer, holder = new_key(), new_key()
    change, budget = Change((Statement("SELECT 1"),)), Budget(1, 1)
    ids = {
        parts(
            issue_marque(
                issuer,
                pilot_id=PILOT,
                incarnation=INCARNATION,
                target=TARGET,
                holder_jwk=holder,
                change=change,
                budget=budget,
                ttl_seconds=60,
            )
        )[1]["jti"]
        for _ in range(3)
    }
    assert len(ids) == 3
    for marque_id in ids:
        assert marque_id.startswith("mq_") and len(marque_id) == 3 + 26


@pytest.mark.parametrize(
    "overrides",
    [
        {"ttl_seconds": 0},
        {"ttl_seconds": -5},
        {"pilot_id": ""},
        {"not_before": NOW + 2 * TTL},
        {"issuer_key": "public-only"},
        {"holder_jwk": {"kty": "RSA", "n": "AQAB", "e": "AQAB"}},
    ],
    ids=["ttl-zero", "ttl-negative", "no-pilot", "nbf-after-exp", "issuer-public", "holder-rsa"],
)
def test_issue_refuses_bad_arguments(world: World, overrides: dict[str, Any]) -> None:
    """issue_marque refuses a bad ttl, empty binding, or unusable key with input_invalid."""
    if overrides.get("issuer_key") == "public-only":
        overrides["issuer_key"] = public_jwk(world.issuer)
    with pytest.raises(InvalidInput):
        world.issue(**overrides)


def test_tampered_payload_is_refused(world: World) -> None:
    """Changing the payload of a signed marque breaks its signature: marque_invalid."""
    head, _, signature = world.issue().split(".")
    _, claims = parts(world.issue())
    claims["budget"]["executions"] = 1000
    with pytest.raises(MarqueInvalid) as refused:
        world.verify(f"{head}.{b64json(claims)}.{signature}")
    assert refused.value.code == "marque_invalid"


def test_tampered_signature_is_refused(world: World) -> None:
    """A flipped bit in the signature is marque_invalid."""
    head, payload, signature = world.issue().split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
    raw[0] ^= 1
    with pytest.raises(MarqueInvalid):
        world.verify(f"{head}.{payload}.{b64(bytes(raw))}")


def test_alg_none_is_refused(world: World) -> None:
    """A hand-made unsigned token (alg none) is marque_invalid, whatever it claims."""
    _, claims = parts(world.issue())
    header = {"alg": "none", "typ": "marque+jwt", "kid": world.issuer["kid"]}
    unsigned = f"{b64json(header)}.{b64json(claims)}"
    with pytest.raises(MarqueInvalid):
        world.verify(unsigned + ".")
    with pytest.raises(MarqueInvalid, match="alg"):
        world.verify(unsigned + ".AAAA")


def test_alg_hs256_with_public_key_as_secret_is_refused(world: World) -> None:
    """An HS256 token MACed with the issuer's public key bytes (alg confusion) is refused."""
    _, claims = parts(world.issue())
    header = {"alg": "HS256", "typ": "marque+jwt", "kid": world.issuer["kid"]}
    signing_input = f"{b64json(header)}.{b64json(claims)}"
    for secret in (world.issuer["x"].encode(), json.dumps(public_jwk(world.issuer)).encode()):
        mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
        with pytest.raises(MarqueInvalid, match="alg"):
            world.verify(f"{signing_input}.{b64(mac)}")


@pytest.mark.parametrize("typ", ["JWT", "marque-pop+jwt", None, 1])
def test_wrong_typ_is_refused(world: World, typ: Any) -> None:
    """A marque whose typ is not marque+jwt is marque_invalid even if properly signed."""

    def edit(header: dict[str, Any], claims: dict[str, Any]) -> None:
        if typ is None:
            del header["typ"]
        else:
            header["typ"] = typ

    with pytest.raises(MarqueInvalid, match="typ"):
        world.verify(world.reissue(edit))


def test_unknown_kid_is_refused(world: World) -> None:
    """A marque from a well-formed but untrusted issuer is marque_invalid: unknown kid."""
    stranger = new_key()
    with pytest.raises(MarqueInvalid, match="unknown kid"):
        world.verify(world.issue(issuer_key=stranger))


def test_missing_kid_is_refused(world: World) -> None:
    """A marque with no kid header is marque_invalid."""
    with pytest.raises(MarqueInvalid, match="kid"):
        world.verify(world.reissue(lambda header, claims: header.pop("kid")))


def test_embedded_jwk_confers_no_trust(world: World) -> None:
    """A token signed by an untrusted key carrying that key in its own jwk header is refused."""
    stranger = new_key()
    _, claims = parts(world.issue())
    header = {
        "alg": "EdDSA",
        "typ": "marque+jwt",
        "kid": stranger["kid"],
        "jwk": public_jwk(stranger),
        "jku": "https://attacker.example/jwks.json",
    }
    with pytest.raises(MarqueInvalid, match="unknown kid"):
        world.verify(forge(header, claims, stranger))
    # Naming a trusted kid does not help: the signature is checked against the trusted key.
    header["kid"] = world.issuer["kid"]
    with pytest.raises(MarqueInvalid, match="signature"):
        world.verify(forge(header, claims, stranger))


@pytest.mark.parametrize("name,value", [("crit", ["exp"]), ("b64", False)])
def test_critical_and_unencoded_headers_are_refused(world: World, name: str, value: Any) -> None:
    """crit and b64 headers (extensions Marque never uses) are marque_invalid."""
    with pytest.raises(MarqueInvalid):
        world.verify(world.reissue(lambda header, claims: header.update({name: value})))


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "!!!.!!!.!!!",
        "e30.e30.",
        "W10.e30.AAAA",
        "bm90IGpzb24.e30.AA",
        None,
        7,
    ],
    ids=[
        "empty",
        "one-part",
        "two-parts",
        "four-parts",
        "not-b64",
        "no-signature",
        "header-array",
        "header-not-json",
        "none",
        "int",
    ],
)
def test_garbage_marque_is_refused(world: World, token: Any) -> None:
    """Anything that is not a compact JWS is marque_invalid, never a foreign exception."""
    with pytest.raises(MarqueInvalid):
        world.verify(token)


def test_expired_marque_is_refused(world: World) -> None:
    """A marque past exp plus the skew allowance is marque_expired."""
    token = world.issue()
    with pytest.raises(MarqueExpired) as refused:
        world.verify(token, now=NOW + TTL + 61, skew_seconds=60)
    assert refused.value.code == "marque_expired"


def test_not_yet_valid_marque_is_refused(world: World) -> None:
    """A marque before nbf minus the skew allowance is marque_not_yet_valid."""
    token = world.issue(not_before=NOW + 300)
    with pytest.raises(MarqueNotYetValid) as refused:
        world.verify(token, now=NOW + 239, skew_seconds=60)
    assert refused.value.code == "marque_not_yet_valid"


def test_window_edges_within_skew_are_accepted(world: World) -> None:
    """Clock skew up to skew_seconds either side of nbf and exp is tolerated."""
    token = world.issue(not_before=NOW + 300)
    assert world.verify(token, now=NOW + 240, skew_seconds=60).not_before == NOW + 300
    assert world.verify(token, now=NOW + TTL + 60, skew_seconds=60).expires_at == NOW + TTL
    with pytest.raises(MarqueExpired):
        world.verify(token, now=NOW + TTL + 1, skew_seconds=0)


def test_wrong_pilot_is_refused(world: World) -> None:
    """A marque for another Pilot is wrong_pilot."""
    with pytest.raises(WrongPilot) as refused:
        world.verify(world.issue(), pilot_id="pilot-b")
    assert refused.value.code == "wrong_pilot"


def test_wrong_incarnation_is_refused(world: World) -> None:
    """A marque pinned to another ledger incarnation is wrong_incarnation."""
    with pytest.raises(WrongIncarnation) as refused:
        world.verify(world.issue(), incarnation="inc-2")
    assert refused.value.code == "wrong_incarnation"


def test_unknown_target_is_refused(world: World) -> None:
    """A marque for a target this Pilot does not serve is unknown_target."""
    with pytest.raises(UnknownTarget) as refused:
        world.verify(world.issue(target="payroll"))
    assert refused.value.code == "unknown_target"


def test_change_cid_mismatch_is_refused(world: World) -> None:
    """A trusted-signed marque whose change was edited without updating change_cid is refused."""

    def edit(header: dict[str, Any], claims: dict[str, Any]) -> None:
        claims["change"]["statements"][1]["sql"] = "DELETE FROM carts"

    with pytest.raises(MarqueInvalid, match="change_cid"):
        world.verify(world.reissue(edit))


def test_bad_budget_is_refused(world: World) -> None:
    """A trusted-signed marque with an impossible budget is marque_invalid."""

    def edit(header: dict[str, Any], claims: dict[str, Any]) -> None:
        claims["budget"]["executions"] = 0

    with pytest.raises(MarqueInvalid, match="budget"):
        world.verify(world.reissue(edit))


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.pop("exp"),
        lambda c: c.update(iat="1800000000"),
        lambda c: c.update(nbf=True),
        lambda c: c.update(exp=NOW + TTL + 0.5),
        lambda c: c.update(exp=c["nbf"]),
        lambda c: c.update(pilot=PILOT),
        lambda c: c["pilot"].pop("incarnation"),
        lambda c: c.update(target=""),
        lambda c: c.update(cnf={}),
        lambda c: c.update(jti=None),
        lambda c: c.update(change="sha256:00"),
    ],
    ids=[
        "no-exp",
        "iat-str",
        "nbf-bool",
        "exp-float",
        "exp-not-after-nbf",
        "pilot-str",
        "no-incarnation",
        "empty-target",
        "no-jkt",
        "jti-null",
        "change-str",
    ],
)
def test_malformed_claims_are_refused(world: World, edit: Callable[[dict[str, Any]], None]) -> None:
    """A trusted-signed marque with a missing or mistyped claim is marque_invalid."""
    with pytest.raises(MarqueInvalid):
        world.verify(world.reissue(lambda header, claims: edit(claims)))


def test_payload_not_an_object_is_refused(world: World) -> None:
    """A trusted-signed JWS whose payload is not a JSON object is marque_invalid."""
    header, _ = parts(world.issue())
    with pytest.raises(MarqueInvalid, match="payload"):
        world.verify(forge(header, ["not", "claims"], world.issuer))


# -- proofs of possession -------------------------------------------------------------------


def test_valid_proof_is_accepted_and_jti_remembered(world: World, marque: Marque) -> None:
    """A fresh proof from the bound key returns its jti and records it for the window."""
    proof = make_proof(
        world.holder, marque.token, nonce=NONCE, pilot_id=PILOT, now=NOW, jti="pop-1"
    )
    header, claims = parts(proof)
    assert header == {
        "typ": "marque-pop+jwt",
        "alg": "EdDSA",
        "jwk": {"kty": "OKP", "crv": "Ed25519", "x": world.holder["x"]},
    }
    assert claims == {
        "jti": "pop-1",
        "iat": NOW,
        "ath": marque.token_hash,
        "nonce": NONCE,
        "pilot": PILOT,
    }
    recorder = Recorder()
    jti = verify_proof(
        proof,
        marque,
        nonce=NONCE,
        pilot_id=PILOT,
        remember_jti=recorder,
        now=NOW + 30,
        window_seconds=120,
    )
    assert jti == "pop-1"
    ((remembered, forget_after),) = recorder.calls
    assert remembered == "pop-1"
    assert forget_after >= NOW + 120


def test_proof_default_jti_is_random(world: World, marque: Marque) -> None:
    """Two proofs made without an explicit jti carry different jtis."""
    first, second = (
        parts(make_proof(world.holder, marque.token, nonce=NONCE, pilot_id=PILOT))[1]["jti"]
        for _ in range(2)
    )
    assert first != second


def test_replayed_proof_is_refused(world: World, marque: Marque) -> None:
    """The same proof presented twice is pop_replayed the second time."""
    proof = make_proof(world.holder, marque.token, nonce=NONCE, pilot_id=PILOT, now=NOW)
    recorder = Recorder()
    verify_proof(proof, marque, nonce=NONCE, pilot_id=PILOT, remember_jti=recorder, now=NOW)
    with pytest.raises(PopReplayed) as refused:
        verify_proof(proof, marque, nonce=NONCE, pilot_id=PILOT, remember_jti=recorder, now=NOW)
    assert refused.value.code == "pop_replayed"
    assert len(recorder.calls) == 2


def _pop_header(world: World, **changes: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "typ": "marque-pop+jwt",
        "alg": "EdDSA",
        "jwk": public_jwk(world.holder),
    }
    header.update(changes)
    return {k: v for k, v in header.items() if v is not None}


def _pop_claims(marque: Marque, **changes: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "jti": "pop-x",
        "iat": int(NOW),
        "ath": marque.token_hash,
        "nonce": NONCE,
        "pilot": PILOT,
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _other_marque_token(world: World) -> str:
    return world.issue(marque_id="mq_other")


BadProof = Callable[[World, Marque], Any]

REFUSED_PROOFS: list[tuple[str, BadProof, type[MarqueError]]] = [
    ("missing", lambda w, m: None, PopMissing),
    ("empty", lambda w, m: "", PopMissing),
    ("garbage", lambda w, m: "not-a-proof", PopInvalid),
    ("garbage-3-parts", lambda w, m: "a.b.c", PopInvalid),
    ("not-str", lambda w, m: 42, PopInvalid),
    ("marque-as-proof", lambda w, m: m.token, PopInvalid),
    (
        "wrong-typ",
        lambda w, m: forge(_pop_header(w, typ="dpop+jwt"), _pop_claims(m), w.holder),
        PopInvalid,
    ),
    (
        "alg-none",
        lambda w, m: f"{b64json(_pop_header(w, alg='none'))}.{b64json(_pop_claims(m))}.",
        PopInvalid,
    ),
    (
        "alg-hs256",
        lambda w, m: forge(_pop_header(w, alg="HS256"), _pop_claims(m), w.holder),
        PopInvalid,
    ),
    ("no-jwk", lambda w, m: forge(_pop_header(w, jwk=None), _pop_claims(m), w.holder), PopInvalid),
    (
        "jwk-not-object",
        lambda w, m: forge(_pop_header(w, jwk="key"), _pop_claims(m), w.holder),
        PopInvalid,
    ),
    (
        "jwk-x25519",
        lambda w, m: forge(
            _pop_header(w, jwk={**public_jwk(w.holder), "crv": "X25519"}), _pop_claims(m), w.holder
        ),
        PopInvalid,
    ),
    (
        "jwk-with-d",
        lambda w, m: forge(_pop_header(w, jwk=w.holder), _pop_claims(m), w.holder),
        PopInvalid,
    ),
    (
        "other-key",
        lambda w, m: make_proof(new_key(), m.token, nonce=NONCE, pilot_id=PILOT, now=NOW),
        PopKeyMismatch,
    ),
    (
        "bad-signature-matching-jwk",
        lambda w, m: forge(_pop_header(w), _pop_claims(m), new_key()),
        PopInvalid,
    ),
    (
        "stale-iat",
        lambda w, m: make_proof(w.holder, m.token, nonce=NONCE, pilot_id=PILOT, now=NOW - 121),
        PopInvalid,
    ),
    (
        "future-iat",
        lambda w, m: make_proof(w.holder, m.token, nonce=NONCE, pilot_id=PILOT, now=NOW + 121),
        PopInvalid,
    ),
    (
        "wrong-ath",
        lambda w, m: make_proof(
            w.holder, _other_marque_token(w), nonce=NONCE, pilot_id=PILOT, now=NOW
        ),
        PopInvalid,
    ),
    (
        "wrong-nonce",
        lambda w, m: make_proof(w.holder, m.token, nonce="nonce-2", pilot_id=PILOT, now=NOW),
        PopInvalid,
    ),
    (
        "wrong-pilot",
        lambda w, m: make_proof(w.holder, m.token, nonce=NONCE, pilot_id="pilot-b", now=NOW),
        PopInvalid,
    ),
    ("no-jti", lambda w, m: forge(_pop_header(w), _pop_claims(m, jti=None), w.holder), PopInvalid),
    (
        "iat-str",
        lambda w, m: forge(_pop_header(w), _pop_claims(m, iat=str(int(NOW))), w.holder),
        PopInvalid,
    ),
    (
        "iat-float",
        lambda w, m: forge(_pop_header(w), _pop_claims(m, iat=NOW + 0.5), w.holder),
        PopInvalid,
    ),
    (
        "nonce-int",
        lambda w, m: forge(_pop_header(w), _pop_claims(m, nonce=1), w.holder),
        PopInvalid,
    ),
    ("payload-array", lambda w, m: forge(_pop_header(w), [1], w.holder), PopInvalid),
    (
        "jti-huge",
        lambda w, m: forge(_pop_header(w), _pop_claims(m, jti="j" * 300), w.holder),
        PopInvalid,
    ),
    # The signature is checked over the exact header.payload text the proof carries.
    ("payload-swapped", lambda w, m: _spliced(w, m, payload=b64json(_pop_claims(m, jti="pop-y"))),
     PopInvalid),
    ("header-respelled", lambda w, m: _spliced(w, m, header=base64.urlsafe_b64encode(json.dumps(
        _pop_header(w), indent=1).encode()).rstrip(b"=").decode()), PopInvalid),
    ("signature-of-another-proof", lambda w, m: _spliced(w, m, signature=_valid_proof(
        w, m, jti="pop-z").split(".")[2]), PopInvalid),
    ("signature-padded", lambda w, m: _spliced(w, m, signature=_valid_proof(w, m).split(".")[2]
                                              + "=="), PopInvalid),
    ("signature-not-base64url", lambda w, m: _spliced(w, m, signature="+" + _valid_proof(
        w, m).split(".")[2][1:]), PopInvalid),
    ("signature-short", lambda w, m: _spliced(
        w, m, signature=_valid_proof(w, m).split(".")[2][:-4]), PopInvalid),
]


def _valid_proof(world: World, marque: Marque, jti: str = "pop-x") -> str:
    return make_proof(world.holder, marque.token, nonce=NONCE, pilot_id=PILOT, now=NOW, jti=jti)


def _spliced(world: World, marque: Marque, **segments: str) -> str:
    """A valid proof with some of its three segments replaced."""
    header, payload, signature = _valid_proof(world, marque).split(".")
    parts = {"header": header, "payload": payload, "signature": signature, **segments}
    return f"{parts['header']}.{parts['payload']}.{parts['signature']}"


@pytest.mark.parametrize(
    "make,expected",
    [(make, expected) for _, make, expected in REFUSED_PROOFS],
    ids=[name for name, _, _ in REFUSED_PROOFS],
)
def test_refused_proof_has_its_code_and_burns_no_jti(
    world: World, marque: Marque, make: BadProof, expected: type[MarqueError]
) -> None:
    """Each bad proof is refused with its own code, and remember_jti is never consulted."""
    proof = make(world, marque)
    recorder = Recorder()
    with pytest.raises(expected) as refused:
        verify_proof(
            proof,
            marque,
            nonce=NONCE,
            pilot_id=PILOT,
            remember_jti=recorder,
            now=NOW,
            window_seconds=120,
        )
    assert refused.value.code == expected.code
    assert type(refused.value) is expected
    assert recorder.calls == []


def test_proof_iat_at_window_edge_is_accepted(world: World, marque: Marque) -> None:
    """A proof exactly window_seconds old (or ahead) is accepted; one second more is not."""
    for offset in (-120, 120):
        jti = f"edge{offset}"
        proof = make_proof(
            world.holder, marque.token, nonce=NONCE, pilot_id=PILOT, now=NOW + offset, jti=jti
        )
        recorder = Recorder()
        accepted = verify_proof(
            proof,
            marque,
            nonce=NONCE,
            pilot_id=PILOT,
            remember_jti=recorder,
            now=NOW,
            window_seconds=120,
        )
        assert accepted == jti
        # Remembered once, at least until the proof's own window (after its iat) has passed.
        ((remembered, forget_after),) = recorder.calls
        assert remembered == jti
        assert forget_after >= NOW + offset + 120

        beyond = make_proof(world.holder, marque.token, nonce=NONCE, pilot_id=PILOT,
                            now=NOW + offset + (1 if offset > 0 else -1), jti=jti + "+1")
        late = Recorder()
        with pytest.raises(PopInvalid, match="window"):
            verify_proof(beyond, marque, nonce=NONCE, pilot_id=PILOT, remember_jti=late,
                         now=NOW, window_seconds=120)
        assert late.calls == []


def test_make_proof_refuses_public_key(world: World, marque: Marque) -> None:
    """make_proof needs the holder's private key; a public JWK is input_invalid."""
    with pytest.raises(InvalidInput):
        make_proof(public_jwk(world.holder), marque.token, nonce=NONCE, pilot_id=PILOT)


def test_private_key_with_foreign_x_is_refused(world: World, marque: Marque) -> None:
    """A private JWK whose x is not derived from its d is input_invalid, not a silent mismatch."""
    franken = {**world.holder, "x": new_key()["x"]}
    with pytest.raises(InvalidInput):
        make_proof(franken, marque.token, nonce=NONCE, pilot_id=PILOT)


def test_duplicate_claim_members_are_refused(world: World) -> None:
    """A trusted-signed payload naming a claim twice (parser-differential bait) is refused."""
    header, claims = parts(world.issue())
    body = json.dumps(claims, separators=(",", ":"))
    payload = body[:-1] + ',"target":"payroll"}'
    signing_input = f"{b64json(header)}.{b64(payload.encode())}"
    raw = base64.urlsafe_b64decode(world.issuer["d"] + "=")
    signature = Ed25519PrivateKey.from_private_bytes(raw).sign(signing_input.encode("ascii"))
    with pytest.raises(MarqueInvalid, match="JSON"):
        world.verify(f"{signing_input}.{b64(signature)}")


def test_oversized_header_is_refused_before_parsing(world: World) -> None:
    """A marque whose header segment is implausibly long is marque_invalid."""
    with pytest.raises(MarqueInvalid, match="too long"):
        world.verify(world.reissue(lambda header, claims: header.update(x5t="A" * 2000)))
