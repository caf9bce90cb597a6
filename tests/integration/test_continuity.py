"""A ledger restored from an older copy while a target is unreachable (found by soak row 9).

The start-up continuity check (DESIGN §5) reads each target's stamps; a
target it cannot read used to be skipped for good, so a ledger restored
while that target was down kept its incarnation and, once the target was
back, spent again the budget the target's stamps say was already spent: a
marque of two executions applied three times. Now such a target stays
unchecked, and the first execution on it checks it again before claiming.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from marque.errors import WrongIncarnation
from marque.pilot import open_pilot

from .conftest import Env

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def _ledger_files(env: Env) -> list[Path]:
    base = env.home / "ledger.sqlite3"
    return [base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")]


def _snapshot(env: Env, where: Path) -> None:
    where.mkdir()
    for path in _ledger_files(env):
        if path.exists():
            shutil.copy(path, where / path.name)


def _restore(env: Env, where: Path) -> None:
    for path in _ledger_files(env):
        path.unlink(missing_ok=True)
    for saved in where.iterdir():
        shutil.copy(saved, env.home / saved.name)


def test_a_restored_ledger_is_caught_once_an_unreachable_target_is_back(env: Env) -> None:
    """Restored while the bank was away: the Pilot starts; while the bank is away an
    execution on it sends it nothing (aborted_not_applied, target_unavailable, naming why),
    and once it is back the first execution finds the unknown stamp, rotates, and the old
    marque is wrong_incarnation — its change never applies a third time."""
    token = env.issue([DEBIT_1], executions=2)
    assert env.run(token, "n-1").status == "applied"
    old = env.pilot.incarnation
    env.pilot.close()
    _snapshot(env, env.home.parent / "copy")
    env.pilot = open_pilot(env.home)
    assert env.run(token, "n-2").status == "applied"
    env.pilot.close()
    _restore(env, env.home.parent / "copy")

    away = env.bank_path.with_name("bank-away.db")
    env.bank_path.rename(away)
    env.pilot = open_pilot(env.home)  # the bank cannot vouch: unchecked, not trusted
    assert env.pilot.incarnation == old
    assert env.pilot.continuity_unchecked == {"bank"}
    waiting = env.run(token, "n-3")
    assert (waiting.status, waiting.attempt) == ("aborted_not_applied", 1)
    assert waiting.error is not None and waiting.error["code"] == "target_unavailable"
    assert "nothing was sent to the target" in waiting.error["message"]

    away.rename(env.bank_path)
    with pytest.raises(WrongIncarnation):
        env.run(token, "n-3")
    assert env.pilot.incarnation != old
    assert env.pilot.continuity_unchecked == set()
    assert env.balances()[1] == 80  # two debits, as the budget allows
    assert env.pilot.logbook is not None
    [finding] = env.pilot.logbook.entries("finding.ledger_regressed")
    assert finding["body"]["old_incarnation"] == old


def test_an_unreachable_target_that_comes_back_to_an_intact_ledger_just_runs(env: Env) -> None:
    """No restore: a target away at start is checked on its first execution, finds nothing
    unknown, and the marque runs under the same incarnation."""
    token = env.issue([DEBIT_1], executions=2)
    assert env.run(token, "n-1").status == "applied"
    old = env.pilot.incarnation
    env.pilot.close()
    away = env.bank_path.with_name("bank-away.db")
    env.bank_path.rename(away)
    env.pilot = open_pilot(env.home)
    assert env.pilot.continuity_unchecked == {"bank"}
    away.rename(env.bank_path)

    assert env.run(token, "n-2").status == "applied"
    assert env.pilot.incarnation == old
    assert env.pilot.continuity_unchecked == set()
    assert env.balances()[1] == 80


def test_a_pilot_start_opens_each_sqlite_target_once(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up check reads a SQLite target's identity, its stamps and its row stamps
    over one connection: one open of the file, and the target is checked."""
    assert env.run(env.issue([DEBIT_1]), "n-1").status == "applied"  # a stamp to read
    env.pilot.close()
    opened: list[str] = []
    connect = sqlite3.connect

    def counted(database: Any, *args: Any, **kwargs: Any) -> Any:
        if str(env.bank_path) in str(database):
            opened.append(str(database))
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counted)
    env.pilot = open_pilot(env.home)
    monkeypatch.undo()
    assert len(opened) == 1, opened
    assert env.pilot.continuity_unchecked == set()


def test_a_restored_ledger_is_caught_by_an_effect_sets_row_stamps(tmp_path: Path) -> None:
    """An Effect Set leaves row stamps and no nonce-level stamp: a ledger restored from before
    its execution is still caught at start (new incarnation, finding), so the second execution
    the budget allows cannot apply the rows again."""
    from support.effects_world import build_effect_world, member

    world = build_effect_world(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}")
    try:
        preview = world.preview([member("bump", "update")],
                                {"bump": [{"id": 1, "name": "anchor", "qty": 6}]})
        token = world.issue(preview.effect_preview_cid, executions=2)
        old = world.pilot.incarnation
        world.pilot.close()
        copy = tmp_path / "copy"
        copy.mkdir()
        base = world.home / "ledger.sqlite3"
        for path in (base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")):
            if path.exists():
                shutil.copy(path, copy / path.name)
        world.pilot = open_pilot(world.home)
        assert world.run(token, "n-1").status == "applied"
        world.pilot.close()
        for path in (base, base.with_name(base.name + "-wal"), base.with_name(base.name + "-shm")):
            path.unlink(missing_ok=True)
        for saved in copy.iterdir():
            shutil.copy(saved, world.home / saved.name)

        world.pilot = open_pilot(world.home)
        assert world.pilot.incarnation != old
        assert world.pilot.logbook is not None
        [finding] = world.pilot.logbook.entries("finding.ledger_regressed")
        assert finding["body"]["unknown_stamps"][0]["row"] is True
        with pytest.raises(WrongIncarnation):
            world.run(token, "n-2")
        assert world.items()[1] == ("anchor", 6)
    finally:
        world.close()
