"""Marque issuance from an allowed or approved request, and the service tokens (DESIGN §11.4, §10).

Every issued token is checked by the verifiers a Pilot runs (``verify_marque``,
``verify_preview_token``, ``verify_query_token``) against the issuer's published
JWKS, with real Ed25519 keys.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from marque.change import Budget, Change, Statement
from marque.errors import Forbidden, InvalidInput, MarqueInvalid, RevalidationFailed
from marque.harbour.checkpoint import Checkpoint, seal_checkpoint, seal_resolution, tally
from marque.harbour.issuance import (
    Issuer,
    approval_for_allow,
    approval_for_checkpoint,
    check_ttl,
    issue_request_marque,
    read_request_marque,
)
from marque.token import (
    TrustedKeys,
    issue_marque,
    new_key,
    public_jwk,
    thumbprint,
    verify_marque,
)
from marque.token.service_tokens import (
    PreviewGrant,
    verify_preview_token,
    verify_query_token,
)

NOW = 1796100000
SCOPE = "sha256:" + "1" * 64
CONFIG = "sha256:" + "5" * 64
CHANGE = Change((Statement("UPDATE items SET price = ? WHERE id = ?", (10, 1)),))
BUDGET = Budget(executions=1, max_rows=1)


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(new_key(), "harbour-test")


@pytest.fixture(scope="module")
def holder() -> dict[str, Any]:
    return new_key()


@pytest.fixture(scope="module")
def trusted(issuer: Issuer) -> TrustedKeys:
    # Built from the published JWKS only, as `pilot join` pins it.
    return TrustedKeys(json.loads(json.dumps(issuer.jwks))["keys"])


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return decoded


def checkpoint_for(change: Change = CHANGE, approvals: int = 1,
                   preview_cid: str = "sha256:" + "4" * 64) -> Checkpoint:
    return seal_checkpoint(
        logical_request_scope=SCOPE, intent_fingerprint="sha256:" + "2" * 64,
        change_cid=change.change_cid, preview_cid=preview_cid, config_cid=CONFIG,
        approvals=approvals, pilot_id="pilot-a", incarnation="inc-1", target="shop",
        expires_at=NOW + 3600)


def approved(checkpoint: Checkpoint, approvers: tuple[str, ...] = ("bob",)) -> dict[str, Any]:
    resolutions = [seal_resolution(checkpoint, decision="approve", approver=name, at=NOW - 10)
                   for name in approvers]
    result = tally(checkpoint, resolutions, requester="alice", self_approval_allowed=False)
    return approval_for_checkpoint(checkpoint, result)


def request_args(holder: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(
        requester="alice", requester_jwk=public_jwk(holder), pilot_id="pilot-a",
        incarnation="inc-1", target="shop", change=CHANGE, budget=BUDGET, ttl_seconds=900,
        max_ttl_seconds=3600, logical_request_scope=SCOPE,
        approval=approval_for_allow(CONFIG), now=NOW)
    args.update(overrides)
    return args


def verify(token: str, trusted: TrustedKeys) -> Any:
    return verify_marque(token, trusted, pilot_id="pilot-a", incarnation="inc-1",
                         targets={"shop"}, now=NOW + 1)


def test_an_approved_request_marque_verifies_and_carries_its_claims(
    issuer: Issuer, holder: dict[str, Any], trusted: TrustedKeys
) -> None:
    """sub, cnf.jkt, req and approval are the request's; exp - iat is the TTL, within max_ttl."""
    checkpoint = checkpoint_for()
    approval = approved(checkpoint)
    token = issuer.marque(**request_args(holder, approval=approval, checkpoint=checkpoint))
    marque = verify(token, trusted)
    assert marque.issuer == "harbour-test"
    assert marque.subject == "alice"
    assert marque.jkt == thumbprint(public_jwk(holder))
    assert marque.change.change_cid == checkpoint.change_cid
    assert marque.expires_at - marque.issued_at == 900 <= 3600
    claims = claims_of(token)
    assert claims["req"] == SCOPE
    assert claims["approval"] == {"checkpoint_cid": checkpoint.cid,
                                  "resolutions": approval["resolutions"]}
    read = read_request_marque(token, trusted)
    assert (read.request_scope, read.approval) == (SCOPE, approval)


def test_a_marque_from_another_key_does_not_verify_with_this_issuers_jwks(
    holder: dict[str, Any], trusted: TrustedKeys
) -> None:
    """The JWKS is what decides: the same claims signed by a stranger are marque_invalid."""
    stranger = Issuer(new_key(), "harbour-test")
    token = stranger.marque(**request_args(holder))
    with pytest.raises(MarqueInvalid):
        verify(token, trusted)


def test_an_allowed_request_carries_only_the_config_cid(
    issuer: Issuer, holder: dict[str, Any], trusted: TrustedKeys
) -> None:
    """No Checkpoint, no fabricated approval: the approval claim is {config_cid} alone."""
    token = issuer.marque(**request_args(holder))
    verify(token, trusted)
    assert claims_of(token)["approval"] == {"config_cid": CONFIG}
    with pytest.raises(InvalidInput):
        issuer.marque(**request_args(holder, checkpoint=checkpoint_for()))
    with pytest.raises(InvalidInput):
        issuer.marque(**request_args(holder, approval={"config_cid": CONFIG,
                                                       "resolutions": []}))


def test_a_requester_without_a_registered_key_gets_no_marque(
    issuer: Issuer, holder: dict[str, Any]
) -> None:
    """No key is forbidden (nothing to bind cnf.jkt to); a private key is never accepted."""
    with pytest.raises(Forbidden) as caught:
        issuer.marque(**request_args(holder, requester_jwk=None))
    assert caught.value.code == "forbidden"
    with pytest.raises(InvalidInput):
        issuer.marque(**request_args(holder, requester_jwk=holder))


def test_a_ttl_above_max_ttl_is_refused_not_shortened(
    issuer: Issuer, holder: dict[str, Any], trusted: TrustedKeys
) -> None:
    """ttl 3601 under max_ttl 3600 is refused; exactly max_ttl is issued with that exp."""
    with pytest.raises(InvalidInput) as caught:
        issuer.marque(**request_args(holder, ttl_seconds=3601))
    assert caught.value.detail == {"ttl_seconds": 3601, "max_ttl_seconds": 3600}
    token = issuer.marque(**request_args(holder, ttl_seconds=3600))
    assert verify(token, trusted).expires_at == NOW + 3600
    assert check_ttl(7200, None) == 7200
    for bad in (0, -5, 1.5, True):
        with pytest.raises(InvalidInput):
            check_ttl(bad, 3600)


def test_an_approved_marque_must_carry_what_the_checkpoint_sealed(
    issuer: Issuer, holder: dict[str, Any]
) -> None:
    """Another change, Pilot, incarnation, target or request than the Checkpoint's: refused."""
    checkpoint = checkpoint_for()
    approval = approved(checkpoint)
    other_change = Change((Statement("DELETE FROM items"),))
    for overrides in ({"change": other_change}, {"pilot_id": "pilot-b"},
                      {"incarnation": "inc-2"}, {"target": "crm"},
                      {"logical_request_scope": "sha256:" + "9" * 64}):
        with pytest.raises(RevalidationFailed):
            issuer.marque(**request_args(holder, approval=approval, checkpoint=checkpoint,
                                         **overrides))
    with pytest.raises(InvalidInput):
        issuer.marque(**request_args(holder, approval=approval))
    resealed = checkpoint_for(preview_cid="sha256:" + "8" * 64)
    with pytest.raises(RevalidationFailed) as caught:
        issuer.marque(**request_args(holder, approval=approval, checkpoint=resealed))
    assert caught.value.detail["failed"] == ["checkpoint_cid"]


def test_too_few_resolutions_or_an_unapproved_tally_issue_nothing(
    issuer: Issuer, holder: dict[str, Any]
) -> None:
    """Two approvals sealed, one listed: refused; a pending tally yields no approval claim."""
    checkpoint = checkpoint_for(approvals=2)
    one = seal_resolution(checkpoint, decision="approve", approver="bob", at=NOW - 10)
    pending = tally(checkpoint, [one], requester="alice", self_approval_allowed=False)
    with pytest.raises(InvalidInput):
        approval_for_checkpoint(checkpoint, pending)
    forged = {"checkpoint_cid": checkpoint.cid, "resolutions": [one.cid]}
    with pytest.raises(RevalidationFailed):
        issuer.marque(**request_args(holder, approval=forged, checkpoint=checkpoint))
    twice = {"checkpoint_cid": checkpoint.cid, "resolutions": [one.cid, one.cid]}
    with pytest.raises(InvalidInput):
        issuer.marque(**request_args(holder, approval=twice, checkpoint=checkpoint))
    token = issuer.marque(**request_args(holder, approval=approved(checkpoint, ("bob", "carol")),
                                         checkpoint=checkpoint))
    assert len(claims_of(token)["approval"]["resolutions"]) == 2


def test_a_local_marque_without_req_or_approval_still_verifies(
    issuer: Issuer, holder: dict[str, Any], trusted: TrustedKeys
) -> None:
    """`marque issue` makes marques without the two claims; they stay valid and read as None."""
    token = issue_marque(issuer.key, pilot_id="pilot-a", incarnation="inc-1", target="shop",
                         holder_jwk=holder, change=CHANGE, budget=BUDGET, ttl_seconds=60,
                         now=NOW)
    assert "req" not in claims_of(token) and "approval" not in claims_of(token)
    verify(token, trusted)
    read = read_request_marque(token, trusted)
    assert (read.request_scope, read.approval) == (None, None)


def test_the_module_function_and_the_issuer_sign_the_same_claims(
    issuer: Issuer, holder: dict[str, Any]
) -> None:
    """issue_request_marque with the key and name is what Issuer.marque does."""
    args = request_args(holder, marque_id="mq_fixed")
    direct = issue_request_marque(issuer.key, issuer=issuer.name, **args)
    assert claims_of(direct) == claims_of(issuer.marque(**args))


def test_preview_and_query_tokens_verify_with_the_same_jwks(
    issuer: Issuer, trusted: TrustedKeys
) -> None:
    """One issuer key and name for all three kinds: a Pilot trusting the JWKS accepts them."""
    preview = issuer.preview_token(PreviewGrant(pilot_id="pilot-a", incarnation="inc-1",
                                                target="shop", change=CHANGE, sample_rows=5,
                                                max_rows=1), now=NOW)
    read = verify_preview_token(preview, trusted, pilot_id="pilot-a", incarnation="inc-1",
                                targets={"shop"}, remember_jti=None, now=NOW + 1)
    assert (read.issuer, read.change, read.sample_rows) == ("harbour-test", CHANGE, 5)
    query = issuer.query_token(pilot_id="pilot-a", marque_id="mq_abc", now=NOW)
    asked = verify_query_token(query, trusted, pilot_id="pilot-a", remember_jti=None,
                               now=NOW + 1)
    assert (asked.issuer, asked.marque_id) == ("harbour-test", "mq_abc")


def test_the_issuer_checks_its_key_and_never_shows_it(issuer: Issuer) -> None:
    """A public key cannot issue; the private member d is in neither repr nor JWKS."""
    with pytest.raises(InvalidInput):
        Issuer(public_jwk(new_key()), "harbour")
    with pytest.raises(InvalidInput):
        Issuer(new_key(), "")
    secret = issuer.key["d"]
    assert secret not in repr(issuer)
    assert secret not in json.dumps(issuer.jwks)
    assert issuer.jwks["keys"][0]["kid"] == issuer.kid
