"""A change's ``access`` member (DESIGN §11.3): part of the claim and of ``change_cid``.

``"access": "read_only"`` is what a read approval adds to a change; absent is
read-write, the default, and is never written out, so every change issued
before ``access`` existed keeps its CID. The expected CIDs are computed here
with :mod:`hashlib` and :mod:`json` (``sort_keys``, no whitespace: JCS for
these ASCII-only objects), independently of :func:`marque.cid.cid`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from marque.change import ACCESS_MODES, READ_ONLY, Change, Guard, Statement
from marque.errors import InvalidInput, MarqueInvalid
from marque.token import (
    Budget,
    TrustedKeys,
    issue_marque,
    new_key,
    public_jwk,
    read_marque,
    unverified_claims,
)

SELECT = "SELECT id, balance FROM accounts WHERE id = ?"


def independent_cid(obj: dict[str, Any]) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def change(access: str | None = None) -> Change:
    return Change((Statement(SELECT, (1,)),), (Guard("SELECT 1", (), 1, "before"),),
                  "repeatable_read", 2_000, access)


PREIMAGE: dict[str, Any] = {
    "statements": [{"sql": SELECT, "params": [1]}],
    "guards": [{"sql": "SELECT 1", "params": [], "expect": 1, "when": "before"}],
    "isolation": "repeatable_read",
    "statement_timeout_ms": 2_000,
}


def test_absent_access_keeps_the_claim_and_cid_of_before() -> None:
    """Without access, the claim has no access member and the CID is the old preimage's."""
    plain = change()
    claim = plain.to_claim()
    assert "access" not in claim
    assert plain.access is None and plain.read_only is False
    assert plain.change_cid == independent_cid(PREIMAGE)
    assert claim == {**PREIMAGE, "change_cid": independent_cid(PREIMAGE)}


def test_read_only_is_in_the_claim_and_the_cid() -> None:
    """read_only is written into the claim and hashed into change_cid, which differs."""
    read = change(READ_ONLY)
    claim = read.to_claim()
    assert claim["access"] == "read_only"
    assert read.read_only is True
    expected = independent_cid({**PREIMAGE, "access": "read_only"})
    assert read.change_cid == expected == claim["change_cid"]
    assert read.change_cid != change().change_cid
    assert read != change()  # equality follows the approved work, access included


def test_read_only_survives_the_strict_reader() -> None:
    """from_claim gives back the same change, access and CID included."""
    read = change(READ_ONLY)
    again = Change.from_claim(read.to_claim())
    assert again == read
    assert again.access == READ_ONLY and again.change_cid == read.change_cid
    assert Change.from_claim(change().to_claim()).access is None
    assert ACCESS_MODES == ("read_only",)


@pytest.mark.parametrize("value", ["read_write", "READ_ONLY", "read-only", "", None, 1, True,
                                   ["read_only"], {"mode": "read_only"}])
def test_any_other_access_value_is_refused_by_the_reader(value: Any) -> None:
    """Present means exactly "read_only": read_write, null or anything else is MarqueInvalid."""
    claim = change(READ_ONLY).to_claim()
    claim["access"] = value
    # Even with a CID that matches what the claim says, the value itself is refused.
    claim["change_cid"] = independent_cid({k: v for k, v in claim.items() if k != "change_cid"})
    with pytest.raises(MarqueInvalid) as caught:
        Change.from_claim(claim)
    assert caught.value.code == "marque_invalid"
    assert "access" in caught.value.message


@pytest.mark.parametrize("value", ["read_write", "READ_ONLY", "", 0, True])
def test_any_other_access_value_is_refused_in_code(value: Any) -> None:
    """Building a change with any access but read_only or None is InvalidInput."""
    with pytest.raises(InvalidInput) as caught:
        change(value)
    assert "access" in caught.value.message


def test_access_cannot_be_stripped_or_added_without_changing_the_cid() -> None:
    """Dropping read_only from a claim, or adding it to one, breaks the change_cid match."""
    stripped = change(READ_ONLY).to_claim()
    del stripped["access"]
    with pytest.raises(MarqueInvalid, match="change_cid"):
        Change.from_claim(stripped)
    added = change().to_claim()
    added["access"] = READ_ONLY
    with pytest.raises(MarqueInvalid, match="change_cid"):
        Change.from_claim(added)


def test_unknown_change_members_are_still_refused() -> None:
    """The one optional member does not open the claim to others."""
    claim = change(READ_ONLY).to_claim()
    claim["mode"] = "read_only"
    with pytest.raises(MarqueInvalid, match="unknown member"):
        Change.from_claim(claim)


def test_a_signed_marque_carries_read_only_to_the_pilot() -> None:
    """issue_marque signs the access member; the Pilot's reader gets read_only back."""
    issuer, holder = new_key(), new_key()
    token = issue_marque(issuer, pilot_id="p", incarnation="i", target="bank",
                         holder_jwk=public_jwk(holder), change=change(READ_ONLY),
                         budget=Budget(1, 5, 1), ttl_seconds=60)
    claims = unverified_claims(token)
    assert claims is not None and claims["change"]["access"] == "read_only"
    marque = read_marque(token, TrustedKeys([public_jwk(issuer)]))
    assert marque.change.read_only is True
    assert marque.change.change_cid == change(READ_ONLY).change_cid
