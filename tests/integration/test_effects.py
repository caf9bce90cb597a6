"""Effect Sets through a real Pilot (DESIGN §7, seed 002), on a SQLite and a PostgreSQL target.

Preview reads the exact scope and stores the preview by its CID; a marque names
that CID; apply revalidates every guard, dispatches row by row under the
halt/continue planner with a stamp per row, and seals receipts. Every test runs
once per target engine (``shop`` is a real SQLite file or PostgreSQL database).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.effects_world import EffectWorld, apply_killed_after_row_2, build_effect_world, member

from marque.effects.declare import read_key
from marque.effects.preview import build_preview, verify_preview
from marque.errors import EffectPreviewInvalid, PreviewFailed, StalePreview
from marque.outcome import Status


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EffectWorld]:
    """A Pilot home whose target ``shop`` is a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        dsn = "sqlite:///" + str(tmp_path / "shop.db")
    else:
        dsn = request.getfixturevalue("pg_dsn")
    made = build_effect_world(tmp_path, dsn)
    try:
        yield made
    finally:
        made.close()


ALL_KINDS = [member("fix", "update"), member("add", "create"), member("up", "upsert"),
             member("rm", "delete")]
ALL_INPUTS: dict[str, list[dict[str, Any]]] = {
    "fix": [{"id": 1, "qty": 50}],
    "add": [{"id": 10, "name": "dinghy", "qty": 1}],
    "up": [{"id": 2, "name": "buoy II", "qty": 8}, {"id": 11, "name": "oar", "qty": 2}],
    "rm": [{"id": 3}],
}


def states(receipts: dict[str, Any], effect_id: str) -> list[str]:
    """The row states of one member's (latest) receipt."""
    found = [m for m in receipts["member_receipts"] if m["effect_id"] == effect_id]
    return [row["state"] for row in found[-1]["rows"]]


def test_preview_reads_the_scope_stores_it_by_cid_and_changes_nothing(world: EffectWorld) -> None:
    """A preview holds each row's before/after and guard, is kept under its CID, and claims,
    stamps and changes nothing."""
    preview = world.preview(ALL_KINDS, ALL_INPUTS)
    body = preview.to_json()
    assert body["executed"] is False
    fix = preview.member("fix").changes[0]
    assert fix.before == {"state": "present", "value": {"id": 1, "name": "anchor", "qty": 5}}
    assert fix.after == {"state": "present", "value": {"id": 1, "name": "anchor", "qty": 50}}
    assert fix.target_version["kind"] == "row_content"
    up = {c.row_or_item_key["id"]: c for c in preview.member("up").changes}
    assert up[11].before == {"state": "absent"}
    assert preview.member("rm").changes[0].after == {"state": "absent"}
    stored = world.pilot.ledger.effect_preview(preview.effect_preview_cid)
    assert stored is not None
    assert verify_preview(stored).effect_preview_cid == preview.effect_preview_cid
    assert world.items() == {1: ("anchor", 5), 2: ("buoy", 7), 3: ("chart", 9)}
    stats = world.pilot.ledger.stats(world.pilot.clock())
    assert (stats["claims"], stats["attempts"]) == (0, 0)
    assert world.row_stamps() == []


def test_a_preview_whose_read_the_database_refuses_is_preview_failed(world: EffectWorld) -> None:
    """A member on a table the target lacks: the read fails, so the preview is
    preview_failed (rule read_failed, the database's SQLSTATE kept), not a statement error
    a caller would retry for ever; nothing is stored."""
    absent = {**member("fix", "update"), "table": "no_such_table"}

    with pytest.raises(PreviewFailed) as refused:
        world.preview([absent], {"fix": [{"id": 1, "qty": 50}]})

    assert refused.value.detail["rule"] == "read_failed"
    assert refused.value.detail["effect_id"] == "fix"
    assert "no_such_table" in refused.value.message
    if world.dsn.startswith("postgresql"):
        assert refused.value.sqlstate == "42P01"  # undefined_table
    stats = world.pilot.ledger.stats(world.pilot.clock())
    assert (stats["claims"], stats["attempts"]) == (0, 0)


NOTES_DDL = "CREATE TABLE notes (id INTEGER PRIMARY KEY, value TEXT NOT NULL)"
NOKEY = {"effect_id": "fix", "kind": "update", "table": "notes", "key": ["nokey"],
         "failure_policy": "halt", "max_items": 10}
NOKEY_ROWS = [{"nokey": "nokey", "value": "changed"}]


def notes(world: EffectWorld) -> list[tuple[Any, ...]]:
    """``notes`` as the target holds it."""
    return [tuple(r) for r in world.sql("SELECT id, value FROM notes ORDER BY id")]


@pytest.mark.parametrize(("declared", "rows", "missing"), [
    (NOKEY, NOKEY_ROWS, ["nokey"]),  # SQLite would read "nokey" as the string 'nokey'
    ({**NOKEY, "key": ["id"]}, [{"id": 1, "colour": "red"}], ["colour"]),
    ({**NOKEY, "kind": "delete"}, [{"nokey": "nokey"}], ["nokey"]),
    ({**NOKEY, "kind": "create", "key": []}, [{"id": 2, "colour": "red"}], ["colour"]),
])
def test_a_declared_column_the_table_lacks_is_read_failed_at_preview(
        world: EffectWorld, declared: dict[str, Any], rows: list[dict[str, Any]],
        missing: list[str]) -> None:
    """Every column a member names — its key, its input's columns — is checked against the
    table's own before any statement: one it lacks is preview_failed (rule read_failed, the
    columns named), on SQLite as on PostgreSQL, never a row the key does not identify."""
    world.sql(NOTES_DDL)
    world.sql("INSERT INTO notes (id, value) VALUES (1, 'original')")

    with pytest.raises(PreviewFailed) as refused:
        world.preview([declared], {"fix": rows})

    assert refused.value.detail["rule"] == "read_failed"
    assert refused.value.detail["columns"] == missing
    assert refused.value.detail["effect_id"] == "fix"
    if world.dsn.startswith("postgresql"):
        assert refused.value.sqlstate == "42703"  # undefined_column
    assert notes(world) == [(1, "original")]


def test_a_stored_preview_naming_a_column_the_table_lacks_is_stale_at_apply(
        world: EffectWorld) -> None:
    """A preview stored before the column check (an older Pilot read ``"nokey"`` as a
    string literal and saw the table's one row): apply admission checks the columns too —
    stale_preview, rule read_failed — and no row is changed or stamped."""
    world.sql(NOTES_DDL)
    world.sql("INSERT INTO notes (id, value) VALUES (1, 'original')")
    request = world.request([NOKEY], {"fix": NOKEY_ROWS})
    what_sqlite_read = {"state": "present", "value": {"id": 1, "value": "original"}}
    built = build_preview(request.bound(), {"fix": {read_key({"nokey": "nokey"}):
                                                    what_sqlite_read}},
                          pilot_id=world.pilot.pilot_id, target="shop",
                          logical_request_scope=request.logical_request_scope,
                          run_identity_cid=request.run_identity_cid)
    world.pilot.ledger.store_effect_preview(built.effect_preview_cid, "shop", built.to_json(),
                                            world.pilot.clock())

    outcome = world.run(world.issue(built.effect_preview_cid), "n-1")

    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == StalePreview.code
    assert "nokey" in outcome.error["message"]
    assert notes(world) == [(1, "original")]
    assert world.row_stamps() == []
    assert "row_dispatching" not in [e["event"] for e in world.events]


def test_apply_creates_updates_upserts_and_deletes_with_a_stamp_per_row(
        world: EffectWorld) -> None:
    """Every kind applies in its own commit unit with its row stamp; the upsert's action is
    the database's answer; receipts account for every row; the set is applied."""
    preview = world.preview(ALL_KINDS, ALL_INPUTS)
    token = world.issue(preview.effect_preview_cid)
    outcome = world.run(token, "n-1")
    assert outcome.status == "applied" and outcome.rows_affected == 5
    assert outcome.result is not None
    assert outcome.result["effect_set"]["status"] == "applied"
    assert world.items() == {1: ("anchor", 50), 2: ("buoy II", 8), 10: ("dinghy", 1),
                             11: ("oar", 2)}
    stamps = world.row_stamps()
    assert sorted(s[0] for s in stamps) == ["applied"] * 5
    assert sorted(str(s[2]) for s in stamps) == ["None", "None", "None", "created", "updated"]
    receipts = world.receipts(token, "n-1")
    assert receipts["set_receipt"]["status"] == "applied"
    assert receipts["set_receipt"]["authorization"]["kind"] == "allow"
    assert [m["state"] for m in receipts["set_receipt"]["members"]] == ["applied"] * 4
    actions = {row["outcome"].get("action") for row in receipts["rows"]
               if row["member_index"] == 2}
    assert actions == {"created", "updated"}
    kinds = [e["event"] for e in world.events]
    assert kinds.count("row_dispatching") == 5 and kinds.count("row_applied") == 5
    assert kinds.index("effect_admitted") < kinds.index("row_dispatching")
    assert kinds.index("receipts_sealed") > max(i for i, k in enumerate(kinds)
                                                 if k == "row_applied")
    assert world.pilot.logbook is not None
    entries = world.pilot.logbook.entries()
    assert {"effects.previewed", "effects.member_receipt", "effects.set_receipt",
            "execution.applied"} <= {e["kind"] for e in entries}


def test_a_replay_of_the_nonce_returns_the_recorded_set_receipt(world: EffectWorld) -> None:
    """The same nonce again sends nothing and answers the recorded outcome and set receipt."""
    preview = world.preview([member("fix", "update")], {"fix": [{"id": 1, "qty": 6}]})
    token = world.issue(preview.effect_preview_cid)
    first = world.run(token, "n-1")
    world.sql("UPDATE items SET qty = 99 WHERE id = 1")  # anything resent would undo this
    again = world.run(token, "n-1")
    assert again.replayed and again.status == "applied"
    assert again.result == first.result
    assert world.items()[1] == ("anchor", 99)
    assert len(world.row_stamps()) == 1


def test_a_row_changed_after_preview_is_stale_and_nothing_is_applied(world: EffectWorld) -> None:
    """Apply admission finds one guard changed: stale_preview, every row unattempted,
    nothing dispatched, nothing applied."""
    preview = world.preview([member("fix", "update")],
                            {"fix": [{"id": 1, "qty": 6}, {"id": 2, "qty": 8}]})
    world.sql("UPDATE items SET name = 'renamed' WHERE id = 2")
    token = world.issue(preview.effect_preview_cid)
    outcome = world.run(token, "n-1")
    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == StalePreview.code
    assert world.items() == {1: ("anchor", 5), 2: ("renamed", 7), 3: ("chart", 9)}
    assert world.row_stamps() == []
    assert "row_dispatching" not in [e["event"] for e in world.events]


@pytest.mark.parametrize(("policy", "expected", "qty"), [
    ("halt", ["applied", "failed", "unattempted"], {1: 11, 2: 7, 3: 9}),
    ("continue", ["applied", "failed", "applied"], {1: 11, 2: 7, 3: 33}),
])
def test_halt_and_continue_around_a_failing_row(world: EffectWorld, policy: str,
                                                expected: list[str],
                                                qty: dict[int, int]) -> None:
    """A CHECK constraint fails row 2: halt leaves row 3 unattempted, continue applies it;
    the failed row is rolled back alone and the set is a partial failure."""
    preview = world.preview([member("fix", "update", policy=policy)],
                            {"fix": [{"id": 1, "qty": 11}, {"id": 2, "qty": -1},
                                     {"id": 3, "qty": 33}]})
    token = world.issue(preview.effect_preview_cid)
    outcome = world.run(token, "n-1")
    assert outcome.status == "applied"  # some rows committed: the attempt applied
    assert outcome.result is not None
    assert outcome.result["effect_set"]["status"] == "partial_failure"
    receipts = world.receipts(token, "n-1")
    assert states(receipts, "fix") == expected
    assert receipts["set_receipt"]["members"][0]["state"] == "failed"
    assert {k: v[1] for k, v in world.items().items()} == qty
    dispatched = [e["index"] for e in world.events if e["event"] == "row_dispatching"]
    assert dispatched == ([0, 1] if policy == "halt" else [0, 1, 2])
    failed = [r for r in receipts["rows"] if r["state"] == "failed"]
    assert failed[0]["outcome"]["error"]["code"] == "statement_error"


def test_every_row_failing_is_aborted_not_applied(world: EffectWorld) -> None:
    """A set whose only row fails applied nothing: aborted_not_applied with its error."""
    preview = world.preview([member("fix", "update")], {"fix": [{"id": 1, "qty": -5}]})
    outcome = world.run(world.issue(preview.effect_preview_cid), "n-1")
    assert outcome.status == Status.ABORTED_NOT_APPLIED.value
    assert outcome.error is not None and outcome.error["code"] == "statement_error"
    assert outcome.result is not None and outcome.result["effect_set"]["status"] == "failed"


def test_a_marque_for_a_preview_this_pilot_never_made_is_refused_unclaimed(
        world: EffectWorld) -> None:
    """An unknown effect_preview_cid is refused before the claim: nothing claimed or spent."""
    token = world.issue("sha256:" + "ab" * 32)
    with pytest.raises(EffectPreviewInvalid):
        world.run(token, "n-1")
    stats = world.pilot.ledger.stats(world.pilot.clock())
    assert (stats["claims"], stats["attempts"]) == (0, 0)


def test_more_rows_than_max_rows_dispatches_nothing(world: EffectWorld) -> None:
    """A set larger than the marque's max_rows is aborted before any row is sent."""
    preview = world.preview([member("fix", "update")],
                            {"fix": [{"id": 1, "qty": 1}, {"id": 2, "qty": 2}]})
    outcome = world.run(world.issue(preview.effect_preview_cid, max_rows=1), "n-1")
    assert outcome.status == "aborted_not_applied"
    assert outcome.error is not None and outcome.error["code"] == "max_rows_exceeded"
    assert world.row_stamps() == []


def test_a_pilot_killed_between_rows_never_resends_and_reconciles_from_the_stamp(
        world: EffectWorld, tmp_path: Path) -> None:
    """SIGKILL right after row 2 committed (before the dispatch ledger knew): on restart,
    row 1 is not resent, row 2 is reconciled applied from its row stamp by a chained
    reconciliation receipt, row 3 stays unattempted, and the receipts are complete."""
    token, done = apply_killed_after_row_2(world, tmp_path)
    assert done.returncode == -9, done.stderr
    assert {k: v[1] for k, v in world.items().items()} == {1: 11, 2: 22, 3: 9}
    world.pilot = __import__("marque.pilot", fromlist=["open_pilot"]).open_pilot(world.home)
    outcome = world.pilot.outcome(
        __import__("marque.token", fromlist=["x"]).unverified_claims(token)["jti"], "n-1")
    assert outcome.status == "applied"
    receipts = world.receipts(token, "n-1")
    assert states(receipts, "fix") == ["applied", "unknown", "unattempted"]
    chain = receipts["reconciliation_receipts"]
    assert len(chain) == 1 and chain[0]["terminal"] is True
    assert chain[0]["outcome"]["state"] == "applied"
    assert chain[0]["effect_set_receipt_cid"] == receipts["set_receipt"]["receipt_cid"]
    assert [r["state"] for r in receipts["rows"]] == ["applied", "applied", "prepared"]
    assert len(world.row_stamps()) == 2  # nothing was sent again
    assert {k: v[1] for k, v in world.items().items()} == {1: 11, 2: 22, 3: 9}
    again = world.run(token, "n-1")
    assert again.replayed and again.status == "applied"
    assert len(world.row_stamps()) == 2
