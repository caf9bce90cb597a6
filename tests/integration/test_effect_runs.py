"""The Run of an Effect Set execution, tracked by the Pilot (issue 14, seed 002).

Real SQLite ledger and target; nothing mocked. The Pilot keeps each
execution's Run in its ledger and moves it through the one transition
function: admitted, ended by every row's latest state, paused between attempts
when the target refused the connection before a row was sent, resumed by a
later attempt of the same nonce — which revalidates what the Run bound first:
a target pointed elsewhere meanwhile ends the Run ``failed`` with
``ACTQL_E_RESUME_REVALIDATION_FAILED`` and nothing is dispatched.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from support.effects_world import (
    EffectWorld,
    apply_killed_after_row_2,
    build_effect_world,
    member,
    seed_target,
)

from marque.outcome import Outcome
from marque.pilot import open_pilot
from marque.pilot.setup import add_target
from marque.token import make_proof

ROWS = {"bump": [{"id": 1, "qty": 50}, {"id": 2, "qty": 70}]}


@pytest.fixture
def world(tmp_path: Path) -> Any:
    built = build_effect_world(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}")
    yield built
    built.close()


def _run(world: EffectWorld, token: str, nonce: str, on_event: Any = None) -> Outcome:
    proof = make_proof(world.holder, token, nonce=nonce, pilot_id=world.pilot.pilot_id)
    return world.pilot.execute(token, proof, nonce, on_event=on_event)


def _run_with_target_gone(world: EffectWorld, token: str, nonce: str) -> Outcome:
    """An attempt whose target file disappears once apply admission has passed: the first
    row is refused before anything is sent, the attempt ends aborted_not_applied."""
    shop = Path(world.dsn.removeprefix("sqlite:///"))
    away = shop.with_name("shop.away")

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "effect_admitted":
            shop.rename(away)

    try:
        return _run(world, token, nonce, on_event)
    finally:
        away.rename(shop)


def test_a_run_is_admitted_and_ends_succeeded_in_the_ledger_and_the_receipt(
        world: EffectWorld) -> None:
    """preparing → running → succeeded, each a stored move; the projection is in the
    receipt (`marque effects receipt --json`) and in the attempt's result."""
    preview = world.preview([member("bump", "update")], ROWS)
    token = world.issue(preview.effect_preview_cid)

    outcome = _run(world, token, "n-1")

    assert outcome.status == "applied"
    run = world.receipts(token, "n-1")["run"]
    assert run == outcome.result["effect_set"]["run_state"]
    assert run["version"] == "actql-run-state/0.1"
    assert run["run_identity_cid"] == preview.run_identity_cid
    assert (run["state"], run["revision"], run["next_action"]) == (
        "succeeded", 3, {"kind": "none"})
    assert (run["terminal_error"], run["result_availability"], run["result_available"]) == (
        None, {}, False)


def test_a_partial_failure_ends_the_run_failed(world: EffectWorld) -> None:
    """A row the database refuses (CHECK qty >= 0) under continue: the Run ends failed."""
    preview = world.preview([member("bump", "update", policy="continue")],
                            {"bump": [{"id": 1, "qty": -1}, {"id": 2, "qty": 70}]})
    token = world.issue(preview.effect_preview_cid)

    assert _run(world, token, "n-1").status == "applied"

    run = world.receipts(token, "n-1")["run"]
    assert (run["state"], run["revision"], run["next_action"]) == ("failed", 3, {"kind": "none"})


def test_a_stale_preview_has_no_run(world: EffectWorld) -> None:
    """Refused at apply admission (stale_preview): no row reserved, so no Run either."""
    preview = world.preview([member("bump", "update")], ROWS)
    token = world.issue(preview.effect_preview_cid)
    world.sql("UPDATE items SET qty = 6 WHERE id = 1")

    outcome = _run(world, token, "n-1")

    assert outcome.error is not None and outcome.error["code"] == "stale_preview"
    assert world.pilot.ledger.effect_run_state(outcome.marque_id, "n-1") is None


def test_a_paused_run_resumes_on_the_next_attempt_and_succeeds(world: EffectWorld) -> None:
    """The target refused the connection before row 1 was sent: the Run waits under its
    continuation Checkpoint; the next attempt of the nonce resumes it (revalidated: the
    same target, the same marque) and applies both rows."""
    preview = world.preview([member("bump", "update")], ROWS)
    token = world.issue(preview.effect_preview_cid)

    first = _run_with_target_gone(world, token, "n-1")

    assert (first.status, first.attempt) == ("aborted_not_applied", 1)
    assert first.error is not None and first.error["code"] == "target_unavailable"
    paused = world.receipts(token, "n-1")["run"]
    assert (paused["state"], paused["revision"]) == ("waiting_checkpoint", 3)
    assert paused["next_action"] == {"kind": "resolve_checkpoint",
                                     "checkpoint_cid": paused["checkpoint_cid"]}
    assert paused["checkpoint_cid"].startswith("sha256:")
    assert world.items()[1] == ("anchor", 5)

    second = _run(world, token, "n-1")

    assert (second.status, second.attempt) == ("applied", 2)
    run = world.receipts(token, "n-1")["run"]
    assert (run["state"], run["revision"], run["terminal_error"]) == ("succeeded", 5, None)
    assert world.items()[1] == ("anchor", 50) and world.items()[2] == ("buoy", 70)


def test_a_run_refused_on_its_last_attempt_ends_failed_instead_of_waiting(
        world: EffectWorld) -> None:
    """The target refused before row 1 on the nonce's only attempt: nothing can continue
    the Run, so it ends `failed` by its rows' states (none attempted), not paused in
    `waiting_checkpoint` with a next action nobody can take."""
    preview = world.preview([member("bump", "update")], ROWS)
    token = world.issue(preview.effect_preview_cid, attempts=1)

    first = _run_with_target_gone(world, token, "n-1")

    assert (first.status, first.attempt) == ("aborted_not_applied", 1)
    run = world.receipts(token, "n-1")["run"]
    assert (run["state"], run["next_action"]) == ("failed", {"kind": "none"})
    assert run["checkpoint_cid"] is None
    assert [r["state"] for r in world.receipts(token, "n-1")["rows"]] == ["prepared"] * 2
    assert world.items()[1] == ("anchor", 5)


def test_a_resume_whose_target_now_points_elsewhere_fails_revalidation_and_sends_nothing(
        world: EffectWorld, tmp_path: Path) -> None:
    """Between the attempts `shop` is pointed at a copy of its database in another file
    (the same target identity, so not refused as ``target_replaced``): the next attempt's
    resume revalidation fails (environment binding), the Run ends failed with
    ACTQL_E_RESUME_REVALIDATION_FAILED, and neither database gets a row — nor does a
    further attempt once `shop` points back."""
    preview = world.preview([member("bump", "update")], ROWS)
    token = world.issue(preview.effect_preview_cid, attempts=4)
    assert _run_with_target_gone(world, token, "n-1").status == "aborted_not_applied"
    other = tmp_path / "other.db"
    shutil.copy(world.dsn.removeprefix("sqlite:///"), other)
    world.pilot.close()
    add_target(world.home, "shop", f"sqlite:///{other}")
    world.pilot = open_pilot(world.home)

    refused = _run(world, token, "n-1")

    assert (refused.status, refused.attempt) == ("aborted_not_applied", 2)
    assert refused.error is not None and refused.error["code"] == "resume_revalidation_failed"
    assert "environment_binding_cid" in refused.error["message"]
    run = world.receipts(token, "n-1")["run"]
    assert run["state"] == "failed"
    assert run["terminal_error"] == {"phase": "admission",
                                     "code": "ACTQL_E_RESUME_REVALIDATION_FAILED"}
    assert run["next_action"] == {"kind": "none"}
    assert [r["state"] for r in world.receipts(token, "n-1")["rows"]] == ["prepared"] * 2
    assert world.row_stamps() == []  # the original database: nothing sent

    world.pilot.close()
    add_target(world.home, "shop", world.dsn)
    world.pilot = open_pilot(world.home)
    again = _run(world, token, "n-1")
    assert again.error is not None and again.error["code"] == "resume_revalidation_failed"
    assert world.receipts(token, "n-1")["run"]["revision"] == run["revision"]
    assert world.items()[1] == ("anchor", 5) and world.row_stamps() == []
    shutil.copy(other, tmp_path / "other-checked.db")
    copy = EffectWorld(world.home, f"sqlite:///{tmp_path / 'other-checked.db'}", world.issuer,
                       world.holder, world.pilot)
    assert copy.items()[1] == ("anchor", 5) and copy.row_stamps() == []


def test_recovery_writes_no_tombstone_where_the_target_now_points_elsewhere(
        world: EffectWorld, tmp_path: Path) -> None:
    """Killed right after row 2 committed; before the restart `shop` is pointed at another
    database. Recovery would prove row 2 'never applied' with a tombstone there: it writes
    none, row 2 stays unknown and the Run needs reconciliation. Pointed back, the next
    recovery settles row 2 applied from its own stamp."""
    token, done = apply_killed_after_row_2(world, tmp_path)
    assert done.returncode == -9, done.stderr
    other = tmp_path / "other.db"
    seed_target(f"sqlite:///{other}")
    add_target(world.home, "shop", f"sqlite:///{other}")

    world.pilot = open_pilot(world.home)  # start-up recovery of the dead owner's attempt

    receipts = world.receipts(token, "n-1")
    marque_id = receipts["marque_id"]
    assert world.pilot.outcome(marque_id, "n-1").status == "indeterminate"
    assert [r["state"] for r in receipts["rows"]] == ["applied", "unknown", "prepared"]
    assert receipts["reconciliation_receipts"] == []
    assert receipts["run"]["state"] == "needs_reconciliation"
    assert receipts["run"]["next_action"] == {"kind": "reconcile", "effects": ["fix"]}
    elsewhere = EffectWorld(world.home, f"sqlite:///{other}", world.issuer, world.holder,
                            world.pilot)
    assert elsewhere.row_stamps() == []  # no tombstone in the other database
    assert len(world.row_stamps()) == 2  # the real one: rows 1 and 2, as they committed

    world.pilot.close()
    add_target(world.home, "shop", world.dsn)
    world.pilot = open_pilot(world.home)

    settled = world.receipts(token, "n-1")
    assert world.pilot.outcome(marque_id, "n-1").status == "applied"
    assert [r["state"] for r in settled["rows"]] == ["applied", "applied", "prepared"]
    assert [r["outcome"]["state"] for r in settled["reconciliation_receipts"]] == ["applied"]
    assert (settled["run"]["state"], settled["run"]["terminal_error"]) == ("failed", None)
    assert {k: v[1] for k, v in world.items().items()} == {1: 11, 2: 22, 3: 9}
    assert elsewhere.row_stamps() == []
