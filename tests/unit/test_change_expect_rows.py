"""A statement's ``expect_rows`` (an undo's fence): part of the claim, the CID and the intent.

Absent, a statement's claim, its change's ``change_cid`` and its request's
intent fingerprint are exactly what they were before ``expect_rows`` existed;
present, it is a whole number of rows and changes all three. The expected CIDs
are computed here with :mod:`hashlib` and :mod:`json` (``sort_keys``, no
whitespace: JCS for these ASCII-only objects), independently of
:func:`marque.cid.cid`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from marque.change import Budget, Change, Statement
from marque.errors import InvalidInput, MarqueInvalid
from marque.harbour.identity import request_identity

SQL = 'UPDATE "a" SET "v" = ? WHERE "id" = ? AND "v" IS ?'


def independent_cid(obj: dict[str, Any]) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def _preimage(statement: dict[str, Any]) -> dict[str, Any]:
    return {"statements": [statement], "guards": [], "isolation": "read_committed",
            "statement_timeout_ms": None}


def test_absent_it_changes_nothing_present_it_is_in_the_cid() -> None:
    plain = Change((Statement(SQL, (1, 2, 0)),))
    fenced = Change((Statement(SQL, (1, 2, 0), expect_rows=1),))
    assert plain.to_claim()["statements"] == [{"sql": SQL, "params": [1, 2, 0]}]
    assert plain.change_cid == independent_cid(_preimage({"sql": SQL, "params": [1, 2, 0]}))
    assert fenced.change_cid == independent_cid(
        _preimage({"sql": SQL, "params": [1, 2, 0], "expect_rows": 1}))
    assert Change.from_claim(fenced.to_claim()) == fenced


@pytest.mark.parametrize("value", [None, -1, 1.0, True, "1", 2**60])
def test_a_claim_with_anything_but_a_row_count_is_invalid(value: Any) -> None:
    claim = Change((Statement(SQL, (1, 2, 0), expect_rows=1),)).to_claim()
    claim["statements"][0]["expect_rows"] = value
    with pytest.raises(MarqueInvalid, match="expect_rows"):
        Change.from_claim(claim)
    if value is not None:
        with pytest.raises(InvalidInput, match="expect_rows"):
            Statement(SQL, (1, 2, 0), expect_rows=value)


def test_it_is_part_of_the_intent_only_where_given() -> None:
    budget = Budget(1, 1)

    def fingerprint(*statements: Statement) -> str:
        return request_identity("hb_1", "alice", "undo-1", Change(statements), budget, 60,
                                "p1", "bank").intent_fingerprint

    plain = fingerprint(Statement(SQL, (1, 2, 0)))
    assert fingerprint(Statement(SQL, (1, 2, 0), expect_rows=None)) == plain
    assert fingerprint(Statement(SQL, (1, 2, 0), expect_rows=1)) != plain
    assert fingerprint(Statement(SQL, (1, 2, 0), expect_rows=0)) != \
        fingerprint(Statement(SQL, (1, 2, 0), expect_rows=1))
