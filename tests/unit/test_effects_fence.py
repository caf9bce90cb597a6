"""A fenced Effect Set member (a per-row undo's): declared, previewed, verified; and the
structured conflict key of an undo_conflict error."""

from __future__ import annotations

from typing import Any

import pytest

from marque.cid import cid
from marque.effects.declare import bind, capture_input, parse_declaration
from marque.effects.fence import holds
from marque.effects.preview import build_preview, check_fresh, verify_preview
from marque.errors import EffectDeclarationInvalid, UndoConflict
from marque.harbour.undo import conflict_statement

SCOPE, RUN = cid({"scope": 1}), cid({"run": 1})
WROTE = {"state": "present", "value": {"id": 1, "balance": 0, "note": None}}


def _declaration(**member: Any) -> Any:
    return parse_declaration({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "restore_0", "kind": "update", "table": "t", "key": ["id"],
         "max_items": 1, "failure_policy": "continue", **member}]})


def _preview(read: dict[str, Any], fence: dict[str, Any] = WROTE) -> dict[str, Any]:
    bound = bind(_declaration(fence=fence),
                 {"restore_0": capture_input(b'[{"id": 1, "balance": 100}]', "json")})
    built = build_preview(bound, {"restore_0": {'{"id":1}': read}}, pilot_id="p",
                          target="main", logical_request_scope=SCOPE, run_identity_cid=RUN)
    return built.to_json()


def test_a_fence_is_part_of_the_member_and_its_identity() -> None:
    """The fence is in the member's declaration (so in the declaration's CID); a member
    without one has the declaration it always had."""
    fenced, plain = _declaration(fence=WROTE), _declaration()
    assert fenced.members[0].to_json()["fence"] == WROTE
    assert "fence" not in plain.members[0].to_json()
    assert fenced.declaration_cid != plain.declaration_cid


@pytest.mark.parametrize(("member", "words"), [
    ({"fence": WROTE, "max_items": 2}, "max_items 1"),
    ({"fence": {"state": "absent"}}, "fenced present"),
    ({"fence": {"state": "present", "value": {"v": 1.5}}}, "fence values"),
    ({"fence": {"state": "gone"}}, "row state"),
    ({"fence": WROTE, "kind": "upsert"}, "only an update"),
])
def test_a_fence_that_cannot_hold_is_refused(member: dict[str, Any], words: str) -> None:
    with pytest.raises(EffectDeclarationInvalid) as caught:
        _declaration(**member)
    assert caught.value.detail["rule"] == "fence" and words in caught.value.message


def test_a_row_holding_its_fence_is_previewed_as_the_change() -> None:
    """The read holds the fence: before → after as for any update; the guard is the
    declared fence, so the row's target_version is not_applicable and apply admission
    does not read it (a changed row fails alone, never the whole set)."""
    preview = _preview(WROTE)
    row = preview["members"][0]["changes"][0]
    assert row["before"] == WROTE
    assert row["after"]["value"] == {"id": 1, "balance": 100, "note": None}
    assert row["target_version"] == {"kind": "not_applicable"}
    assert preview["members"][0]["fence"] == WROTE
    verified = verify_preview(preview)
    assert verified.members[0].fence is not None
    check_fresh(verified, {})  # nothing to read at admission: not stale


@pytest.mark.parametrize("read", [
    {"state": "present", "value": {"id": 1, "balance": 55, "note": None}},
    {"state": "present", "value": {"id": 1, "balance": 0, "note": ""}},
    {"state": "absent"},
])
def test_a_row_changed_since_is_previewed_unchanged_not_failed(read: dict[str, Any]) -> None:
    """A read that does not hold the fence (another value, '' for NULL, the row gone) is
    no failed preview: the row is shown as it is, and will not change."""
    row = _preview(read)["members"][0]["changes"][0]
    assert row["before"] == row["after"] == read


def test_a_fence_compares_json_exactly() -> None:
    """1 and true, "1" and 1 are different values to a fence."""
    fence: Any = {"state": "present", "value": {"a": 1}}
    assert holds({"state": "present", "value": {"a": 1}}, fence)
    assert not holds({"state": "present", "value": {"a": True}}, fence)
    assert not holds({"state": "present", "value": {"a": "1"}}, fence)


def test_an_undo_conflict_names_its_statement_in_a_field() -> None:
    """The outcome's error carries detail.statement; the Harbourmaster reads the field
    whatever the message says, and reads a report without it (an older Pilot's) by its
    message; any other error names no statement."""
    error = UndoConflict("statement 3 touched 0 row(s) …", detail={"statement": 3}).to_dict()
    assert error == {"code": "undo_conflict", "message": "statement 3 touched 0 row(s) …",
                     "sqlstate": None, "detail": {"statement": 3}}
    assert conflict_statement({**error, "message": "reworded"}) == 3
    assert conflict_statement({"code": "undo_conflict", "sqlstate": None,
                               "message": "statement 2 touched 0 row(s) where …"}) == 2
    assert conflict_statement({"code": "undo_conflict", "message": "x",
                               "detail": {"statement": True}}) is None
    assert conflict_statement({"code": "guard_failed", "message": "statement 1 touched",
                               "detail": {"statement": 1}}) is None
    assert "detail" not in UndoConflict("no statement").to_dict()
