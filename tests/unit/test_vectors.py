"""Pinned test vectors (DESIGN §8): fixed inputs, the exact preimage bytes and hex digests.

Computed once and written here by hand, so any change to a preimage — a field
renamed, added or dropped, a different canonical form, another hash — fails
these tests instead of silently changing every identity already issued or
chained. Each vector pins both the preimage (what is hashed) and the digest.
"""

from __future__ import annotations

import hashlib

import pytest

from marque.change import Change, Guard, Statement
from marque.cid import canonicalize, cid
from marque.logbook.embedded import GENESIS, legacy_entry_hash

# -- change_cid -------------------------------------------------------------------------

MINIMAL_CHANGE = Change((Statement("UPDATE accounts SET balance = balance - 10 WHERE id = 1"),))
MINIMAL_PREIMAGE = (
    b'{"guards":[],"isolation":"read_committed","statement_timeout_ms":null,'
    b'"statements":[{"params":[],"sql":"UPDATE accounts SET balance = balance - 10 '
    b'WHERE id = 1"}]}'
)
MINIMAL_CID = "sha256:1739d9ef301e31b6673a9fc4f39d2c529e73f35bbddbf20fe16961783b8be1f2"

FULL_CHANGE = Change(
    (
        Statement("UPDATE accounts SET balance = balance - ? WHERE id = ?", (10, 1)),
        Statement("INSERT INTO audit (note, amount, ok, extra) VALUES (?, ?, ?, ?)",
                  ("débit €", 2.5, True, None)),
    ),
    (
        Guard("SELECT balance >= 10 FROM accounts WHERE id = ?", (1,), True, "before"),
        Guard("SELECT count(*) FROM audit", (), 1, "after"),
    ),
    "serializable",
    5000,
)
FULL_PREIMAGE = (
    '{"guards":[{"expect":true,"params":[1],"sql":"SELECT balance >= 10 FROM accounts '
    'WHERE id = ?","when":"before"},{"expect":1,"params":[],"sql":"SELECT count(*) FROM '
    'audit","when":"after"}],"isolation":"serializable","statement_timeout_ms":5000,'
    '"statements":[{"params":[10,1],"sql":"UPDATE accounts SET balance = balance - ? '
    'WHERE id = ?"},{"params":["débit €",2.5,true,null],"sql":"INSERT INTO audit (note, '
    'amount, ok, extra) VALUES (?, ?, ?, ?)"}]}'
).encode()
FULL_CID = "sha256:417a1c0e3ffced72ea032a0b78c0bad4dcdc2183c90f89d3b4db751095cca4f8"

CHANGE_VECTORS = [
    pytest.param(MINIMAL_CHANGE, MINIMAL_PREIMAGE, MINIMAL_CID, id="minimal"),
    pytest.param(FULL_CHANGE, FULL_PREIMAGE, FULL_CID, id="params-guards-isolation-timeout"),
]


@pytest.mark.parametrize(("change", "preimage", "expected"), CHANGE_VECTORS)
def test_change_cid_vector(change: Change, preimage: bytes, expected: str) -> None:
    """change_cid is sha256 over the pinned JCS preimage of the claim without change_cid."""
    claim = change.to_claim()
    assert claim["change_cid"] == expected
    assert canonicalize({k: v for k, v in claim.items() if k != "change_cid"}) == preimage
    assert "sha256:" + hashlib.sha256(preimage).hexdigest() == expected
    assert change.change_cid == expected
    assert cid(claim, exclude="change_cid") == expected


@pytest.mark.parametrize(("change", "preimage", "expected"), CHANGE_VECTORS)
def test_change_cid_vector_survives_the_claim_round_trip(
    change: Change, preimage: bytes, expected: str
) -> None:
    """A change read back from its claim names the same pinned CID."""
    assert Change.from_claim(change.to_claim()).change_cid == expected


def test_change_cid_vector_moves_with_every_member() -> None:
    """Each member of the preimage is in it: changing any one moves the pinned CID."""
    statement = MINIMAL_CHANGE.statements[0]
    variants = [
        Change((Statement(statement.sql + " "),)),
        Change((Statement(statement.sql.replace("10", "11")),)),
        Change(MINIMAL_CHANGE.statements, isolation="serializable"),
        Change(MINIMAL_CHANGE.statements, statement_timeout_ms=1),
        Change(MINIMAL_CHANGE.statements, (Guard("SELECT 1"),)),
    ]
    cids = {v.change_cid for v in variants}
    assert MINIMAL_CID not in cids
    assert len(cids) == len(variants)


# -- the logbook's entry hash -------------------------------------------------------------

APPLIED_BODY = {"marque_id": "mq_0123", "nonce": "pay-1", "attempt": 1, "status": "applied",
                "rows_affected": 1}
FIRST_KEY = "outcome/mq_0123/pay-1/1/applied"
FIRST_AT = 1900000000.123456
FIRST_PREIMAGE = (
    b'{"at":1900000000.123456,"body":{"attempt":1,"marque_id":"mq_0123","nonce":"pay-1",'
    b'"rows_affected":1,"status":"applied"},"key":"outcome/mq_0123/pay-1/1/applied",'
    b'"kind":"execution.applied","prev":"' + GENESIS.encode() + b'"}'
)
FIRST_HASH = "20b8fb3500ec57fad17829996f8c958c58b751a26f12652f96049eb1642e6cbc"
SECOND_HASH = "4aad3dae1a43ddc3b35d2777e7cdbc729057dbe0b852ba778a868f966ca75eeb"


def test_logbook_genesis_is_64_zeros() -> None:
    """The first entry chains to a pinned genesis hash of 64 zero digits."""
    assert GENESIS == "0000000000000000000000000000000000000000000000000000000000000000"


def test_legacy_logbook_entry_hash_vector() -> None:
    """An entry's hash is sha256 over the pinned JCS of {prev, kind, key, body, at}."""
    digest = legacy_entry_hash(GENESIS, "execution.applied", FIRST_KEY, APPLIED_BODY, FIRST_AT)
    assert digest == FIRST_HASH
    assert hashlib.sha256(FIRST_PREIMAGE).hexdigest() == FIRST_HASH
    assert canonicalize({"prev": GENESIS, "kind": "execution.applied", "key": FIRST_KEY,
                         "body": APPLIED_BODY, "at": FIRST_AT}) == FIRST_PREIMAGE


def test_legacy_logbook_chained_entry_hash_vector() -> None:
    """A second entry, chained to the first, with non-ASCII text and mixed scalars."""
    body = {"note": "naïve ✓", "n": [1, 2.5, None, False]}
    digest = legacy_entry_hash(FIRST_HASH, "finding.ledger_regressed", "finding/rotate/inc_1", body,
                        1900000001.0)
    assert digest == SECOND_HASH


def test_legacy_logbook_entry_hash_covers_every_field() -> None:
    """Changing any one input (prev, kind, key, body, at) moves the pinned hash."""
    base = (GENESIS, "execution.applied", FIRST_KEY, APPLIED_BODY, FIRST_AT)
    variants = [
        ("1" * 64, *base[1:]),
        (base[0], "execution.indeterminate", *base[2:]),
        (*base[:2], FIRST_KEY + "x", *base[3:]),
        (*base[:3], {**APPLIED_BODY, "rows_affected": 2}, base[4]),
        (*base[:4], FIRST_AT + 0.000001),
    ]
    digests = {legacy_entry_hash(*v) for v in variants}
    assert FIRST_HASH not in digests
    assert len(digests) == len(variants)
