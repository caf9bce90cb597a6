"""A Pilot's home through the real CLI: move, copy, bad configuration, lost pilot.json.

Issue 8's findings 1, 2, 3, 5 and 6 as an operator meets them: real ``marque``
processes, real SQLite files, a shell's ``mv`` and ``cp -r`` (done here with
:mod:`shutil`). Each test checks exit statuses, JSON fields, the ledger's rows
and the bank's balances.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from e2e_support import EXIT, Result, World

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
UNAVAILABLE = 7


def error_of(res: Result) -> dict[str, Any]:
    body = res.json
    assert isinstance(body.get("error"), dict), body
    return body["error"]


def claims_in(home: Path) -> int:
    conn = sqlite3.connect(home / "ledger.sqlite3")
    try:
        [(count,)] = conn.execute("SELECT COUNT(*) FROM claims").fetchall()
    finally:
        conn.close()
    return int(count)


def test_a_moved_home_runs_again_after_pilot_move(world: World) -> None:
    """`mv` → exec is home_mismatch (exit 2, nothing claimed); `pilot move` → exec applies."""
    marque = world.issue([DEBIT])
    old = world.home.resolve()
    moved = world.root / "moved"
    world.home.rename(moved)
    world.home = moved

    refused = world.exec(marque, "n-1")
    assert refused.returncode == EXIT["usage"], refused
    assert error_of(refused)["code"] == "home_mismatch"
    assert f"marque pilot move --home {moved}" in error_of(refused)["message"]
    assert claims_in(moved) == 0

    res = world.run("pilot", "move", "--home", moved, "--json")
    assert res.returncode == 0, res
    assert res.json["moved_from"] == str(old)
    assert res.json["incarnation"] == world.incarnation

    applied = world.exec(marque, "n-1")
    assert applied.returncode == EXIT["applied"], applied
    assert world.balances() == {1: 90, 2: 100}


def test_a_copied_home_never_runs_on_a_clone_or_the_original_ledger(world: World) -> None:
    """`cp -r`: the copy is home_mismatch; without its ledger, ledger_missing; never shared."""
    marque = world.issue([DEBIT])
    copy = world.root / "copy"
    shutil.copytree(world.home, copy)

    exec_copy = ("exec", "--home", copy, "--marque", marque, "--key", world.holder_key,
                 "--nonce", "n-1", "--json")
    res = world.run(*exec_copy)
    assert res.returncode == EXIT["usage"], res
    assert error_of(res)["code"] == "home_mismatch"
    assert "is a copy of the Pilot home at" in error_of(res)["message"]
    refused_move = world.run("pilot", "move", "--home", copy, "--json")
    assert refused_move.returncode == EXIT["usage"], refused_move
    assert error_of(refused_move)["code"] == "home_mismatch"

    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy / 'ledger.sqlite3'}{suffix}").unlink(missing_ok=True)
    res = world.run(*exec_copy)
    assert res.returncode == EXIT["usage"], res
    assert error_of(res)["code"] == "ledger_missing"

    assert claims_in(world.home) == 0
    assert world.balances() == {1: 100, 2: 100}
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]


def test_a_bad_setting_is_refused_before_anything_is_claimed(world: World) -> None:
    """lock_timeout_ms "fast" → exec exit 2 config_invalid naming the key; no claim, no budget."""
    config_path = world.home / "pilot.json"
    config = json.loads(config_path.read_text())
    config["settings"]["lock_timeout_ms"] = "fast"
    config_path.write_text(json.dumps(config))
    marque = world.issue([DEBIT])

    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["usage"], res
    error = error_of(res)
    assert error["code"] == "config_invalid"
    assert "settings.lock_timeout_ms must be an integer number of milliseconds ≥ 1" in (
        error["message"])
    assert world.ledger_count("claims") == 0
    assert world.ledger_count("budgets") == 0

    human = world.run("exec", "--home", world.home, "--marque", marque,
                      "--key", world.holder_key, "--nonce", "n-1")
    assert human.returncode == EXIT["usage"]
    assert "config_invalid" in human.stderr and "Traceback" not in human.stderr


def test_target_add_resolves_relative_paths_and_checks_the_target(world: World) -> None:
    """`target add`: relative path stored absolute (said so); unreachable refused; --no-check."""
    res = world.run("pilot", "target", "add", "--home", world.home, "bank2", "sqlite:///bank.db",
                    "--json")  # the World runs the CLI with its root as working directory
    assert res.returncode == 0, res
    assert res.json == {"target": "bank2", "dsn": f"sqlite:///{world.bank.resolve()}",
                        "checked": True, "resolved_from": "sqlite:///bank.db"}
    human = world.run("pilot", "target", "add", "--home", world.home, "bank3",
                      "sqlite:///bank.db")
    assert human.returncode == 0, human
    assert "resolved against the current directory" in human.stdout

    for dsn in ("sqlite:///ghost.db", "postgresql://nohost.invalid/db"):
        refused = world.run("pilot", "target", "add", "--home", world.home, "ghost", dsn,
                            "--json")
        assert refused.returncode == EXIT["aborted_not_applied"], refused
        assert error_of(refused)["code"] == "target_unavailable"
        assert "--no-check" in error_of(refused)["message"]
    listed = world.run("pilot", "target", "list", "--home", world.home, "--json")
    assert "ghost" not in listed.json["targets"]

    down = world.run("pilot", "target", "add", "--home", world.home, "ghost",
                     "postgresql://nohost.invalid/db", "--no-check", "--json")
    assert down.returncode == 0, down
    assert down.json["checked"] is False


def test_init_failures_are_typed_and_leave_nothing_behind(tmp_path: Path, run: Any) -> None:
    """init to an unreachable PostgreSQL (exit 7), a file as --home, a missing ledger dir (2)."""
    home = tmp_path / "home"
    res = run("pilot", "init", "--home", home, "--pilot-id", "p1",
              "--ledger", "postgresql://marque:s3cret@127.0.0.1:1/ledger", "--json")
    assert res.returncode == UNAVAILABLE, res
    assert error_of(res)["code"] == "ledger_unavailable"
    assert "s3cret" not in res.stdout + res.stderr
    assert not home.exists()

    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    res = run("pilot", "init", "--home", a_file, "--pilot-id", "p1", "--json")
    assert res.returncode == EXIT["usage"], res
    assert error_of(res)["code"] == "input_invalid"
    assert a_file.read_text() == "keep"

    res = run("pilot", "init", "--home", home, "--pilot-id", "p1",
              "--ledger", f"sqlite:///{tmp_path / 'nodir' / 'ledger.sqlite3'}", "--json")
    assert res.returncode == EXIT["usage"], res
    assert error_of(res)["code"] == "input_invalid"
    assert not home.exists()
    assert "Traceback" not in res.stderr


def test_a_lost_pilot_json_says_so_and_init_re_adopts_the_ledger(world: World) -> None:
    """No pilot.json: exec says what happened; init re-adopts the ledger with its incarnation."""
    marque = world.issue([DEBIT])
    assert world.exec(marque, "n-1").returncode == EXIT["applied"]
    (world.home / "pilot.json").unlink()

    res = world.exec(marque, "n-1")
    assert res.returncode == EXIT["usage"], res
    assert error_of(res)["code"] == "config_invalid"
    assert "but no pilot.json" in error_of(res)["message"]

    init = world.run("pilot", "init", "--home", world.home, "--pilot-id", world.pilot_id,
                     "--json")
    assert init.returncode == 0, init
    assert init.json == {"pilot_id": world.pilot_id, "incarnation": world.incarnation,
                         "adopted": True}
    assert world.run("pilot", "trust", "--home", world.home, world.issuer_pub).returncode == 0
    assert world.run("pilot", "target", "add", "--home", world.home, "bank",
                     f"sqlite:///{world.bank.resolve()}").returncode == 0

    again = world.exec(marque, "n-1")
    assert again.returncode == EXIT["applied"], again
    assert again.json["replayed"] is True
    assert world.balances() == {1: 90, 2: 100}


def test_pilot_show_target_list_remove_and_untrust(world: World) -> None:
    """`pilot show`, `target list|remove`, `pilot untrust`: JSON shapes, not_found, refusals."""
    show = world.run("pilot", "show", "--home", world.home, "--json")
    assert show.returncode == 0, show
    issuer_kid = json.loads(world.issuer_pub.read_text())["kid"]
    body = show.json
    assert (body["pilot_id"], body["incarnation"]) == (world.pilot_id, world.incarnation)
    assert body["home"] == str(world.home.resolve())
    assert body["targets"] == {"bank": f"sqlite:///{world.bank.resolve()}"}
    assert body["issuers"] == [issuer_kid]
    assert body["settings"]["lock_timeout_ms"] == 5000
    human = world.run("pilot", "show", "--home", world.home)
    assert world.incarnation in human.stdout and issuer_kid in human.stdout

    listed = world.run("pilot", "target", "list", "--home", world.home, "--json")
    assert listed.json == {"targets": body["targets"]}
    missing = world.run("pilot", "target", "remove", "--home", world.home, "nope", "--json")
    assert missing.returncode == EXIT["usage"]
    assert error_of(missing)["code"] == "not_found"
    unknown = world.run("pilot", "untrust", "--home", world.home, "no-such-kid", "--json")
    assert unknown.returncode == EXIT["usage"]
    assert error_of(unknown)["code"] == "not_found"
    # A key id that begins with "-" (base64url allows it) goes after "--".
    dashed = world.run("pilot", "untrust", "--home", world.home, "--json", "--", "-Qdu3Rg")
    assert dashed.returncode == EXIT["usage"]
    assert error_of(dashed)["code"] == "not_found"

    untrust = world.run("pilot", "untrust", "--home", world.home, "--json", "--", issuer_kid)
    assert untrust.returncode == 0, untrust
    assert untrust.json == {"kid": issuer_kid, "trusted": []}
    refused = world.exec(world.issue([DEBIT]), "n-1")
    assert refused.returncode == EXIT["refused"], refused
    assert error_of(refused)["code"] == "marque_invalid"

    removed = world.run("pilot", "target", "remove", "--home", world.home, "bank", "--json")
    assert removed.returncode == 0, removed
    assert removed.json == {"target": "bank", "dsn": f"sqlite:///{world.bank.resolve()}"}
    assert world.balances() == {1: 100, 2: 100}
