"""A marque read from a file keeps its trailing newline: whitespace is not part of a token."""

from __future__ import annotations

from marque.change import Budget, Change, Statement
from marque.token import (
    TrustedKeys,
    issue_marque,
    make_proof,
    new_key,
    public_jwk,
    read_marque,
    verify_proof,
)


def test_surrounding_whitespace_is_ignored_by_read_and_proof() -> None:
    """read_marque and make_proof strip the token alike, so ath still matches."""
    issuer, holder = new_key(), new_key()
    token = issue_marque(issuer, pilot_id="p1", incarnation="inc_" + "0" * 32, target="bank",
                         holder_jwk=public_jwk(holder), change=Change((Statement("SELECT 1"),)),
                         budget=Budget(1, 1, 1), ttl_seconds=60)
    padded = f"  {token}\n"
    marque = read_marque(padded, TrustedKeys([public_jwk(issuer)]))
    assert marque.token == token
    proof = make_proof(holder, padded, nonce="n1", pilot_id="p1")
    jti = verify_proof(proof, marque, nonce="n1", pilot_id="p1", remember_jti=None)
    assert isinstance(jti, str) and jti
