"""The Effect Set preview: row states by kind and strength, refusals, verification, freshness."""

from __future__ import annotations

from typing import Any

import pytest

from marque.cid import cid
from marque.effects.declare import bind, capture_input, parse_declaration
from marque.effects.preview import Strength, build_preview, check_fresh, verify_preview
from marque.errors import EffectPreviewInvalid, PreviewFailed, StalePreview

SCOPE, RUN = cid({"scope": 1}), cid({"run": 1})


def _preview(kind: str, data: bytes, reads: dict[str, Any] | None = None, *,
             key: list[str] | None = None, strength: Strength = Strength.FULL_DIFF,
             **extra: Any) -> Any:
    member = {"effect_id": "m", "kind": kind, "table": "t", "max_items": 10, **extra}
    if key is not None:
        member["key"] = key
    bound = bind(parse_declaration({"version": "marque-effect-set/0.1", "members": [member]}),
                 {"m": capture_input(data, "json")})
    return build_preview(bound, {"m": reads} if reads is not None else {}, pilot_id="p",
                         target="main", logical_request_scope=SCOPE, run_identity_cid=RUN,
                         strength=strength)


def _row(preview: Any) -> dict[str, Any]:
    return preview.to_json()["members"][0]["changes"][0]  # type: ignore[no-any-return]


def present(value: dict[str, Any]) -> dict[str, Any]:
    return {"state": "present", "value": value}


ABSENT = {"state": "absent"}


def test_update_full_diff_shows_the_read_row_and_the_merged_after() -> None:
    """An update's before is the read row; after is it with the new values; guarded by content."""
    row = _row(_preview("update", b'[{"id": 1, "email": "new"}]',
                        {'{"id":1}': present({"id": 1, "email": "old", "name": "Ann"})},
                        key=["id"]))
    assert row["before"] == present({"id": 1, "email": "old", "name": "Ann"})
    assert row["after"] == present({"id": 1, "email": "new", "name": "Ann"})
    assert row["intended_changes"] == {"values": {"email": "new"}}
    assert row["target_version"]["kind"] == "row_content"


def test_a_present_empty_row_is_present_with_an_empty_value() -> None:
    """A row read with no columns is {state: present, value: {}}, never null or omitted."""
    row = _row(_preview("delete", b'[{"id": 1}]', {'{"id":1}': present({})}, key=["id"]))
    assert row["before"] == {"state": "present", "value": {}}
    assert row["after"] == ABSENT


def test_upsert_of_an_absent_row_shows_absent_before_and_key_plus_values_after() -> None:
    """An upsert whose row is missing previews absent → key and values."""
    row = _row(_preview("upsert", b'[{"id": 5, "email": "e"}]', {'{"id":5}': ABSENT},
                        key=["id"]))
    assert (row["before"], row["after"]) == (ABSENT, present({"id": 5, "email": "e"}))


def test_create_and_command_encodings() -> None:
    """create is absent → present(row); command is not_applicable on both sides, unguarded."""
    create = _row(_preview("create", b'[{"msg": "x"}]'))
    assert (create["before"], create["after"]) == (ABSENT, present({"msg": "x"}))
    assert create["target_version"] == {"kind": "not_applicable"}
    command = _row(_preview("command", b'[{"job": "j"}]', command="enqueue"))
    assert command["before"] == command["after"] == {"state": "not_applicable"}
    assert command["target_version"] == {"kind": "not_applicable"}


def test_a_create_with_a_key_reads_its_row_and_guards_its_absence() -> None:
    """A keyed create reads the key: absent is guarded, present is refused."""
    row = _row(_preview("create", b'[{"id": 1, "msg": "x"}]', {'{"id":1}': ABSENT}, key=["id"]))
    assert row["target_version"]["kind"] == "row_content"
    with pytest.raises(PreviewFailed) as caught:
        _preview("create", b'[{"id": 1, "msg": "x"}]', {'{"id":1}': present({"id": 1})},
                 key=["id"])
    assert caught.value.detail["rule"] == "create_target_present"


@pytest.mark.parametrize("kind", ["update", "upsert", "delete", "create"])
def test_targeted_preview_hides_state_but_keeps_changes_and_guard(kind: str) -> None:
    """targeted: before unavailable; after unavailable unless deleting; change and guard kept."""
    data = b'[{"id": 1}]' if kind == "delete" else b'[{"id": 1, "email": "n"}]'
    before = ABSENT if kind == "create" else present({"id": 1, "email": "o"})
    row = _row(_preview(kind, data, {'{"id":1}': before}, key=["id"],
                        strength=Strength.TARGETED))
    assert row["before"] == {"state": "unavailable"}
    assert row["after"] == (ABSENT if kind == "delete" else {"state": "unavailable"})
    assert row["target_version"]["kind"] == "row_content"
    values = {"delete": {}, "create": {"id": 1, "email": "n"}}.get(kind, {"email": "n"})
    assert row["intended_changes"]["values"] == values


@pytest.mark.parametrize(("rule", "kind", "data", "reads"), [
    ("missing_read", "update", b'[{"id": 1, "e": "n"}]', {}),
    ("unexpected_read", "update", b'[{"id": 1, "e": "n"}]',
     {'{"id":1}': present({"id": 1, "e": "o"}), '{"id":2}': ABSENT}),
    ("read_state", "update", b'[{"id": 1, "e": "n"}]', {'{"id":1}': {"state": "unavailable"}}),
    ("read_state", "update", b'[{"id": 1, "e": "n"}]', {'{"id":1}': None}),
    ("update_target_absent", "update", b'[{"id": 1, "e": "n"}]', {'{"id":1}': ABSENT}),
    ("delete_target_absent", "delete", b'[{"id": 1}]', {'{"id":1}': ABSENT}),
    ("unknown_column", "update", b'[{"id": 1, "e": "n"}]', {'{"id":1}': present({"id": 1})}),
])
def test_reads_that_contradict_the_change_fail_the_preview(rule: str, kind: str, data: bytes,
                                                           reads: dict[str, Any]) -> None:
    """A preview refuses reads that are missing, extra, not a state, or contradict the kind."""
    with pytest.raises(PreviewFailed) as caught:
        _preview(kind, data, reads, key=["id"])
    assert caught.value.detail["rule"] == rule


def _update_preview() -> Any:
    return _preview("update", b'[{"id": 1, "e": "n"}, {"id": 2, "e": "m"}]',
                    {'{"id":1}': present({"id": 1, "e": "o"}),
                     '{"id":2}': present({"id": 2, "e": "p"})}, key=["id"])


def test_verify_preview_accepts_a_preview_exactly_as_built() -> None:
    """A transported preview re-verifies to the same preview; executed is false."""
    preview = _update_preview()
    assert verify_preview(preview.to_json()) == preview
    assert preview.to_json()["executed"] is False


@pytest.mark.parametrize(("rule", "tamper"), [
    ("row_preview_cid", lambda p: p["members"][0]["changes"][0]["after"]["value"]
     .update(e="evil")),
    ("effect_member_preview_cid", lambda p: p["members"][0].update(max_items=9)),
    ("item_count", lambda p: p["members"][0].update(item_count=1)),
    ("effect_preview_cid", lambda p: p.update(target="other")),
    ("row_idempotency_key", lambda p: p["members"][0]["changes"][1].update(
        row_idempotency_key=cid({"forged": 1}))),
    ("executed", lambda p: p.update(executed=True)),
    ("shape", lambda p: p["members"][0]["changes"][0].pop("before")),
    ("shape", lambda p: p["members"][0].update(kind="merge")),
])
def test_verify_preview_names_the_first_identity_that_does_not_hold(rule: str,
                                                                    tamper: Any) -> None:
    """Changing any semantic part of a preview breaks the CID that covers it, in seed order."""
    body = _update_preview().to_json()
    tamper(body)
    with pytest.raises(EffectPreviewInvalid) as caught:
        verify_preview(body)
    assert caught.value.detail["rule"] == rule


def _current(preview: Any) -> dict[str, str]:
    return {row.row_preview_cid: row.target_version["cid"] for _, row in preview.rows()}


def test_fresh_guards_pass_apply_admission() -> None:
    """Every guard matching its current version admits the preview."""
    preview = _update_preview()
    check_fresh(preview, _current(preview), bindings={"capability": "a"},
                current_bindings={"capability": "a"})


@pytest.mark.parametrize("problem", ["mismatched", "missing", "unexpected", "bindings"])
def test_any_difference_or_missing_evidence_is_stale(problem: str) -> None:
    """A changed row, a row without evidence, a stray entry or a changed binding is stale."""
    preview = _update_preview()
    current = _current(preview)
    first = next(iter(current))
    bindings = ({"capability": "a"}, {"capability": "a"})
    if problem == "mismatched":
        current[first] = cid({"changed": 1})
    elif problem == "missing":
        del current[first]
    elif problem == "unexpected":
        current[cid({"stray": 1})] = cid({"x": 1})
    else:
        bindings = ({"capability": "a"}, {"capability": "b"})
    with pytest.raises(StalePreview) as caught:
        check_fresh(preview, current, bindings=bindings[0], current_bindings=bindings[1])
    assert caught.value.detail[problem]
    assert caught.value.code == "stale_preview" and caught.value.exit_status == 4
