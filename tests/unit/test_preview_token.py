"""Preview and query tokens (DESIGN §10): issued, verified, and refused for every broken rule."""

from __future__ import annotations

import base64
import json
from dataclasses import fields
from typing import Any

import pytest
from joserfc import jws
from joserfc.jwk import OKPKey

from marque.errors import (
    InvalidInput,
    MarqueExpired,
    MarqueInvalid,
    MarqueNotYetValid,
    PopReplayed,
    UnknownTarget,
    WrongIncarnation,
    WrongPilot,
)
from marque.token import (
    Change,
    Statement,
    TrustedKeys,
    new_key,
    public_jwk,
)
from marque.token.service_tokens import (
    PREVIEW_TYP,
    PreviewGrant,
    issue_preview_token,
    issue_query_token,
    verify_preview_token,
    verify_query_token,
)

NOW = 1_800_000_000.0
CHANGE = Change((Statement("UPDATE t SET x = 1"),))


class Seen:
    """A replay cache like the ledger's pop_jtis table: False for a jti seen before."""

    def __init__(self) -> None:
        self.jtis: dict[str, float] = {}

    def __call__(self, jti: str, forget_after: float) -> bool:
        if jti in self.jtis:
            return False
        self.jtis[jti] = forget_after
        return True


@pytest.fixture
def issuer() -> dict[str, Any]:
    return new_key()


@pytest.fixture
def trusted(issuer: dict[str, Any]) -> TrustedKeys:
    return TrustedKeys([public_jwk(issuer)])


def preview(issuer: dict[str, Any], **kw: Any) -> str:
    """A preview token for p1/i1/bank; ``kw`` overrides grant fields and signing arguments."""
    grant_names = {f.name for f in fields(PreviewGrant)}
    args: dict[str, Any] = {"pilot_id": "p1", "incarnation": "i1", "target": "bank",
                            "change": CHANGE, "sample_rows": 3, "max_rows": 7, "now": NOW, **kw}
    grant = PreviewGrant(**{k: v for k, v in args.items() if k in grant_names})
    return issue_preview_token(issuer, grant,
                               **{k: v for k, v in args.items() if k not in grant_names})


def verify(token: str, trusted: TrustedKeys, seen: Any = None, now: float = NOW) -> Any:
    return verify_preview_token(token, trusted, pilot_id="p1", incarnation="i1",
                                targets={"bank"}, remember_jti=seen, now=now)


def test_preview_token_round_trips(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """A preview token issued for this Pilot verifies to its change, sample_rows and max_rows."""
    read = verify(preview(issuer), trusted)
    assert (read.target, read.sample_rows, read.max_rows) == ("bank", 3, 7)
    assert read.change.change_cid == CHANGE.change_cid
    assert read.expires_at - read.issued_at == 300


def test_preview_token_lifetime_over_five_minutes_is_not_issued(issuer: dict[str, Any]) -> None:
    """issue_preview_token refuses a lifetime over 300 seconds."""
    with pytest.raises(InvalidInput):
        preview(issuer, ttl_seconds=301)


@pytest.mark.filterwarnings("ignore::joserfc.errors.SecurityWarning")
def test_preview_token_with_a_long_lifetime_is_refused(
    issuer: dict[str, Any], trusted: TrustedKeys
) -> None:
    """A token signed with exp more than 5 minutes after iat is marque_invalid."""
    claims = {"iss": "x", "jti": "j1", "iat": int(NOW), "exp": int(NOW) + 301,
              "pilot": {"id": "p1", "incarnation": "i1"}, "target": "bank",
              "change": CHANGE.to_claim(), "sample_rows": 1, "max_rows": None}
    key = OKPKey.import_key(issuer)
    token = jws.serialize_compact({"alg": "EdDSA", "typ": PREVIEW_TYP, "kid": issuer["kid"]},
                                  json.dumps(claims).encode(), key, algorithms=["EdDSA"])
    with pytest.raises(MarqueInvalid, match="at most 300"):
        verify(token, trusted)


def test_untrusted_issuer_and_wrong_typ_are_refused(
    issuer: dict[str, Any], trusted: TrustedKeys
) -> None:
    """A preview token from an unknown key, or a query token offered as one, is marque_invalid."""
    with pytest.raises(MarqueInvalid, match="unknown kid"):
        verify(preview(new_key()), trusted)
    query = issue_query_token(issuer, pilot_id="p1", marque_id="mq_1", now=NOW)
    with pytest.raises(MarqueInvalid, match="typ must be marque-preview"):
        verify(query, trusted)


def test_alg_none_is_refused(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """An unsigned (alg none) preview token is refused before anything in it is read."""
    header, payload, _ = preview(issuer).split(".")
    forged = json.dumps({"alg": "none", "typ": PREVIEW_TYP, "kid": issuer["kid"]}).encode()
    token = base64.urlsafe_b64encode(forged).rstrip(b"=").decode() + "." + payload + ".AA"
    with pytest.raises(MarqueInvalid, match="alg must be EdDSA"):
        verify(token, trusted)


def test_window_pilot_incarnation_target(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """Expired, future, other Pilot, other incarnation and unknown target each have their code."""
    with pytest.raises(MarqueExpired):
        verify(preview(issuer), trusted, now=NOW + 300 + 61)
    with pytest.raises(MarqueNotYetValid):
        verify(preview(issuer), trusted, now=NOW - 61)
    with pytest.raises(WrongPilot):
        verify(preview(issuer, pilot_id="p2"), trusted)
    with pytest.raises(WrongIncarnation):
        verify(preview(issuer, incarnation="i2"), trusted)
    with pytest.raises(UnknownTarget):
        verify(preview(issuer, target="vault"), trusted)


def test_replay_is_refused_and_a_refusal_burns_no_jti(
    issuer: dict[str, Any], trusted: TrustedKeys
) -> None:
    """A jti is recorded only once a token passed every other check; its reuse is pop_replayed."""
    seen = Seen()
    with pytest.raises(WrongPilot):
        verify(preview(issuer, pilot_id="p2", jti="j-1"), trusted, seen)
    assert seen.jtis == {}
    token = preview(issuer, jti="j-1")
    verify(token, trusted, seen)
    with pytest.raises(PopReplayed, match="preview token"):
        verify(token, trusted, seen)


def test_query_token_checks(issuer: dict[str, Any], trusted: TrustedKeys) -> None:
    """A query token verifies for its Pilot only, names its marque, and runs once."""
    seen = Seen()
    token = issue_query_token(issuer, pilot_id="p1", marque_id="mq_1", now=NOW)
    read = verify_query_token(token, trusted, pilot_id="p1", remember_jti=seen, now=NOW)
    assert read.marque_id == "mq_1"
    with pytest.raises(PopReplayed, match="query token"):
        verify_query_token(token, trusted, pilot_id="p1", remember_jti=seen, now=NOW)
    with pytest.raises(WrongPilot, match="query token"):
        verify_query_token(token, trusted, pilot_id="p2", remember_jti=None, now=NOW)
    with pytest.raises(MarqueInvalid, match="typ must be marque-query"):
        verify_query_token(preview(issuer), trusted, pilot_id="p1", remember_jti=None, now=NOW)
