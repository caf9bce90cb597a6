"""The diff sealed in a Checkpoint (version 0.2), and a preview whose diff_cid lies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_checkpoint import LITERAL_CHECKPOINT, sealed

from marque.cid import cid
from marque.errors import InvalidInput, PreviewFailed
from marque.harbour.checkpoint import Checkpoint
from marque.harbour.row_diff import over_budget, sealed_diff_cid
from marque.harbour.statement_requests import StatementRequest
from marque.harbour.store.base import PilotRecord
from marque.target.row_images import diff_body, diff_cid
from marque.token import Change, Statement

DIFF = "sha256:" + "d" * 64


def test_a_checkpoint_with_a_diff_is_version_0_2_and_reads_back() -> None:
    """diff_cid is sealed in a 0.2 body (so it is part of checkpoint_cid); without one the
    body is the 0.1 body it always was."""
    with_diff = sealed(diff_cid=DIFF)
    assert with_diff.body["version"] == "marque-checkpoint/0.2"
    assert with_diff.body["diff_cid"] == DIFF
    assert Checkpoint.from_body(with_diff.body, with_diff.cid).diff_cid == DIFF
    without = sealed()
    assert without.body["version"] == "marque-checkpoint/0.1" and "diff_cid" not in without.body
    assert with_diff.cid != without.cid
    other = sealed(diff_cid="sha256:" + "e" * 64)
    assert other.cid != with_diff.cid


@pytest.mark.parametrize("edit", [
    lambda b: b.update(version="marque-checkpoint/0.2"),  # 0.2 without its diff_cid
    lambda b: b.update(diff_cid=DIFF),  # 0.1 with one
    lambda b: b.update(version="marque-checkpoint/0.2", diff_cid="sha256:short"),
])
def test_a_checkpoint_body_whose_diff_does_not_fit_its_version_is_refused(edit: Any) -> None:
    body = json.loads(json.dumps(LITERAL_CHECKPOINT))
    edit(body)
    with pytest.raises(InvalidInput):
        Checkpoint.from_body(body, cid(body))


def _preview(change: Change, pilot: PilotRecord, **extra: Any) -> dict[str, Any]:
    statements = [{"sql": change.statements[0].sql, "rows": 1, "sample": None, "plan": None,
                   "row_images": {"status": "unavailable", "reason": "no key"}}]
    preview: dict[str, Any] = {
        "version": "marque-preview/0.1", "mode": "rollback",
        "pilot": {"id": pilot.pilot_id, "incarnation": pilot.incarnation}, "target": "bank",
        "change_cid": change.change_cid, "statements": statements, "total_rows": 1,
        "max_rows": 1, "within_max_rows": True, "diff_cid": diff_cid(statements),
        "elapsed_ms": 1.0, "at": "2026-12-01T10:00:00Z", **extra}
    preview["preview_cid"] = cid(preview)
    return preview


def test_a_preview_whose_diff_cid_is_not_its_row_images_is_refused() -> None:
    """The Harbourmaster recomputes diff_cid from the statements: a Pilot (or anything in
    between) cannot seal one diff and show another."""
    change = Change((Statement("UPDATE t SET v = 1"),))
    pilot = PilotRecord("p1", "http://p1", "inc-1", ["bank"], 0.0, 0.0)
    request = StatementRequest(change)
    honest = _preview(change, pilot)
    assert request.previewed(honest, pilot, "bank")[1] == honest["preview_cid"]
    assert sealed_diff_cid(honest) == honest["diff_cid"]
    assert diff_body(honest["statements"]) == {
        "version": "marque-row-diff/0.1", "statements": [honest["statements"][0]["row_images"]]}
    lying = _preview(change, pilot, diff_cid="sha256:" + "0" * 64)
    with pytest.raises(PreviewFailed, match="diff_cid does not match its row images"):
        request.previewed(lying, pilot, "bank")


def test_only_a_preview_over_its_budget_is_not_approvable() -> None:
    assert over_budget({"within_max_rows": True, "total_rows": 1, "max_rows": 1}) is None
    assert over_budget({"within_max_rows": None}) is None  # explain: no exact count
    why = over_budget({"within_max_rows": False, "total_rows": 3, "max_rows": 1})
    assert why is not None and "3 row(s)" in why and "max_rows_exceeded" in why


#: One statement's images as previews took them before ``key_source`` existed.
_IMAGES = {"status": "captured", "table": "accounts", "key": ["id"], "total": 1, "shown": 1,
           "truncated": False, "before_cid": "sha256:" + "b" * 64,
           "rows": [{"key": {"id": 1}, "op": "update", "before": {"id": 1, "balance": 100},
                     "after": {"id": 1, "balance": 90}, "changed": ["balance"]}]}


def test_a_schema_keys_images_hash_as_they_did_before_key_source() -> None:
    """key_source is left out of the preimage for a primary key or a unique index, so those
    diffs keep their CIDs (pinned); a declared key is part of what is sealed."""
    before = diff_cid([{"row_images": _IMAGES}])
    # What the code before declared keys gave for these images (computed with it).
    assert before == "sha256:40e79032fba20f918aa18cb5ddcb72cb5b838c640c60b1d67bf2f7ed5b683724"
    assert before == cid({"version": "marque-row-diff/0.1", "statements": [_IMAGES]})
    for source in ("primary_key", "unique_index"):
        assert diff_cid([{"row_images": {**_IMAGES, "key_source": source}}]) == before
    declared = {**_IMAGES, "key_source": "declared"}
    assert diff_body([{"row_images": declared}])["statements"] == [declared]
    assert diff_cid([{"row_images": declared}]) != before


def test_the_console_marks_a_declared_key() -> None:
    """The request page's caption says a key is declared; a schema key is not marked."""
    from marque.harbour.console.row_images import row_images_view

    declared = row_images_view({**_IMAGES, "key_source": "declared"})
    assert declared is not None and declared["key_declared"] is True
    own = row_images_view({**_IMAGES, "key_source": "primary_key"})
    assert own is not None and own["key_declared"] is False
