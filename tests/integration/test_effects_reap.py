"""Reaping an Effect Set execution (issue 14): its ledger rows go, its row stamps stay.

Real SQLite ledger and target. Reaping deletes an expired, settled, reported
marque's Run, dispatch rows and receipts, and the preview only it named; the
target keeps the row stamps, as it keeps nonce stamps, and the start-up
continuity check still knows them from the reaped nonce's record — a reap is
not a ledger regression.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.effects_world import build_effect_world, member

from marque.errors import NonceReaped
from marque.pilot import open_pilot
from marque.token import unverified_claims


def test_a_reaped_effect_set_leaves_its_row_stamps_known_and_its_ledger_rows_gone(
        tmp_path: Path) -> None:
    """After the reap: no Run, dispatch row, receipt or preview of the marque in the ledger;
    the row stamps still in the target; a restart reads them as live and does not rotate."""
    world = build_effect_world(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}")
    try:
        preview = world.preview([member("bump", "update")],
                                {"bump": [{"id": 1, "qty": 6}, {"id": 2, "qty": 8}]})
        token = world.issue(preview.effect_preview_cid, ttl=600)
        marque_id = str((unverified_claims(token) or {})["jti"])
        assert world.run(token, "n-1").status == "applied"
        ledger = world.pilot.ledger
        assert ledger.effect_run_state(marque_id, "n-1") is not None
        incarnation = world.pilot.incarnation

        # Past the marque's expiry and the skew allowance, by the Pilot's clock only.
        world.pilot.clock = lambda: time.time() + 600 + world.pilot.options.skew_seconds + 60
        counts = world.pilot.reap()

        assert counts["marques"] == 1
        assert (counts["effect_runs"], counts["effect_run_states"], counts["effect_dispatch"],
                counts["effect_previews"]) == (1, 1, 2, 1)
        assert counts["effect_receipts"] == 2  # the member receipt and the set receipt
        assert ledger.effect_run(marque_id, "n-1") is None
        assert ledger.effect_run_state(marque_id, "n-1") is None
        assert ledger.effect_rows(marque_id, "n-1") == []
        assert ledger.effect_receipts(marque_id, "n-1") == []
        assert ledger.effect_preview(preview.effect_preview_cid) is None
        with pytest.raises(NonceReaped):
            world.pilot.outcome(marque_id, "n-1")
        # The target keeps what Marque did, row by row.
        assert world.row_stamps() == [("applied", 1, None), ("applied", 1, None)]

        # By the real clock the marque is still live: start-up reads its row stamps, and the
        # reaped nonce's record vouches for them.
        world.pilot.close()
        world.pilot = open_pilot(world.home)
        assert world.pilot.incarnation == incarnation
        target = world.pilot.targets["shop"]
        assert len(target.live_stamps(incarnation, time.time()).row_stamps) == 2
        assert world.pilot.logbook is not None
        assert world.pilot.logbook.entries("finding.ledger_regressed") == []
    finally:
        world.close()
