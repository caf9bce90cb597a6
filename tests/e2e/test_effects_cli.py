"""`marque effects …` as an operator runs it: real processes, real SQLite target, real SIGKILL.

Exit statuses follow the set receipt (0 applied, 4 failed or partial, 5 unknown);
a Pilot killed between rows is settled by `marque effects reconcile` from the row
stamps, never resending a row.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from support.cli import Result, run_cli


def marque(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """``marque ARGS`` in ``cwd``, in support.cli's environment plus ``env``."""
    return run_cli(*args, env=env, timeout=120, cwd=cwd)


def _setup(root: Path, rows: list[dict[str, Any]], policy: str = "halt") -> str:
    db = sqlite3.connect(root / "shop.db")
    db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "qty INTEGER NOT NULL CHECK (qty >= 0))")
    db.executemany("INSERT INTO items VALUES (?, ?, ?)", [(1, "a", 1), (2, "b", 2), (3, "c", 3)])
    db.commit()
    db.close()
    assert marque(root, "keys", "new", "--out", "issuer.jwk").returncode == 0
    (root / "issuer.pub.jwk").write_text(marque(root, "keys", "public", "issuer.jwk").stdout)
    assert marque(root, "keys", "new", "--out", "holder.jwk").returncode == 0
    (root / "holder.pub.jwk").write_text(marque(root, "keys", "public", "holder.jwk").stdout)
    init = json.loads(marque(root, "pilot", "init", "--home", "home", "--pilot-id", "p1",
                             "--json").stdout)
    assert marque(root, "pilot", "trust", "--home", "home", "issuer.pub.jwk").returncode == 0
    assert marque(root, "pilot", "target", "add", "--home", "home", "shop",
                  f"sqlite:///{root / 'shop.db'}").returncode == 0
    (root / "fx.json").write_text(json.dumps({"version": "marque-effect-set/0.1", "members": [
        {"effect_id": "fix", "kind": "update", "table": "items", "key": ["id"],
         "failure_policy": policy, "max_items": 10, "input": "rows.json"}]}))
    (root / "rows.json").write_text(json.dumps(rows))
    made = marque(root, "effects", "preview", "--home", "home", "--declaration", "fx.json",
                  "--target", "shop", "--json")
    assert made.returncode == 0, made.stderr
    cid = json.loads(made.stdout)["effect_preview_cid"]
    issued = marque(root, "issue", "--issuer-key", "issuer.jwk", "--pilot-id", "p1",
                    "--incarnation", init["incarnation"], "--target", "shop", "--holder-key",
                    "holder.pub.jwk", "--effects-preview", cid, "--executions", "1",
                    "--max-rows", "10", "--json")
    assert issued.returncode == 0, issued.stderr
    (root / "fx.marque").write_text(json.loads(issued.stdout)["marque"])
    return str(json.loads(issued.stdout)["marque_id"])


def _qty(root: Path) -> dict[int, int]:
    db = sqlite3.connect(root / "shop.db")
    try:
        return dict(db.execute("SELECT id, qty FROM items ORDER BY id").fetchall())
    finally:
        db.close()


APPLY = ("effects", "apply", "--home", "home", "--marque", "fx.marque", "--key", "holder.jwk",
         "--nonce", "n-1", "--json")


def test_a_partial_failure_exits_4_with_its_set_receipt(tmp_path: Path) -> None:
    """A CHECK violation under continue: exit 4, the set receipt says partial_failure."""
    _setup(tmp_path, [{"id": 1, "qty": 10}, {"id": 2, "qty": -1}, {"id": 3, "qty": 30}],
           policy="continue")
    done = marque(tmp_path, *APPLY)
    assert done.returncode == 4, done.stderr
    printed = json.loads(done.stdout)
    assert printed["set_receipt"]["status"] == "partial_failure"
    assert (printed["run"]["version"], printed["run"]["state"]) == ("actql-run-state/0.1",
                                                                    "failed")
    assert _qty(tmp_path) == {1: 10, 2: 2, 3: 30}
    # The human form says the same, the Run included.
    shown = marque(tmp_path, "effects", "receipt", "--home", "home",
                   printed["outcome"]["marque_id"], "n-1")
    assert shown.returncode == 4, shown.stderr
    assert "partial_failure" in shown.stdout
    assert f"run failed (revision {printed['run']['revision']})" in shown.stdout


def test_a_pilot_killed_between_rows_is_reconciled_by_the_cli(tmp_path: Path) -> None:
    """SIGKILL after row 1 committed; `effects reconcile` settles it applied from its stamp,
    rows 2 and 3 stay unattempted: the Run failed (exit 4), nothing was resent."""
    marque_id = _setup(tmp_path, [{"id": 1, "qty": 10}, {"id": 2, "qty": 20},
                                  {"id": 3, "qty": 30}])
    killed = marque(tmp_path, *APPLY, env={"MARQUE_CRASH_AT": "after_commit@1"})
    assert killed.returncode == -9, killed.stderr
    settled = marque(tmp_path, "effects", "reconcile", "--home", "home", marque_id, "n-1",
                     "--json")
    printed = json.loads(settled.stdout)
    assert printed["outcome"]["status"] == "applied"
    assert [r["outcome"]["state"] for r in printed["reconciliation_receipts"]] == ["applied"]
    assert printed["set_receipt"]["status"] == "unknown_outcome"
    assert settled.returncode == 4  # now: one applied row, two unattempted
    # The Run the dead owner left running was ended by the reconciliation, in the ledger.
    assert printed["run"]["state"] == "failed" and printed["run"]["terminal_error"] is None
    shown = marque(tmp_path, "effects", "receipt", "--home", "home", marque_id, "n-1", "--json")
    assert json.loads(shown.stdout)["run"] == printed["run"]
    assert _qty(tmp_path) == {1: 10, 2: 2, 3: 3}
    again = marque(tmp_path, *APPLY)
    assert json.loads(again.stdout)["outcome"]["replayed"] is True
    assert _qty(tmp_path) == {1: 10, 2: 2, 3: 3}


def test_a_failed_resume_revalidation_exits_3_by_its_own_attempt_not_an_earlier_receipt(
        tmp_path: Path) -> None:
    """Attempt 1 was refused by the target before row 1 was sent (the Run waits at its
    continuation Checkpoint); `shop` is then pointed at a copy of its database and the nonce
    run again: attempt 2 fails resume revalidation and seals no receipt. `effects apply` and
    `effects receipt` exit 3 — that attempt's refusal — not by attempt 1's set receipt, and
    their JSON says which attempt the receipt shown is of."""
    from support.effects_world import build_effect_world, member

    world = build_effect_world(tmp_path, f"sqlite:///{tmp_path / 'shop.db'}")
    preview = world.preview([member("bump", "update")], {"bump": [{"id": 1, "qty": 50}]})
    token = world.issue(preview.effect_preview_cid, attempts=4)
    shop, away = tmp_path / "shop.db", tmp_path / "shop.away"

    def target_gone(event: dict[str, Any]) -> None:
        if event["event"] == "effect_admitted":
            shop.rename(away)

    from marque.token import make_proof

    proof = make_proof(world.holder, token, nonce="n-1", pilot_id=world.pilot.pilot_id)
    first = world.pilot.execute(token, proof, "n-1", on_event=target_gone)
    away.rename(shop)
    world.close()
    assert (first.status, first.error and first.error["code"]) == ("aborted_not_applied",
                                                                   "target_unavailable")
    (tmp_path / "fx.marque").write_text(token)
    (tmp_path / "holder.jwk").write_text(json.dumps(world.holder))
    (tmp_path / "other.db").write_bytes(shop.read_bytes())
    repointed = marque(tmp_path, "pilot", "target", "add", "--home", "home", "shop",
                       f"sqlite:///{tmp_path / 'other.db'}")
    assert repointed.returncode == 0, repointed.stderr

    done = marque(tmp_path, *APPLY)

    assert done.returncode == 3, done.stdout + done.stderr
    printed = json.loads(done.stdout)
    assert printed["outcome"]["attempt"] == 2
    assert printed["outcome"]["error"]["code"] == "resume_revalidation_failed"
    assert printed["outcome"]["result"] is None
    assert printed["set_receipt_attempt"] == 1  # the only receipt sealed: attempt 1's
    assert printed["run"]["terminal_error"]["code"] == "ACTQL_E_RESUME_REVALIDATION_FAILED"
    shown = marque(tmp_path, "effects", "receipt", "--home", "home",
                   printed["outcome"]["marque_id"], "n-1", "--json")
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert json.loads(shown.stdout)["outcome"]["attempt"] == 2
    human = marque(tmp_path, "effects", "receipt", "--home", "home",
                   printed["outcome"]["marque_id"], "n-1")
    assert human.returncode == 3
    assert "of attempt 1 (attempt 2 sealed none)" in human.stdout
    assert "resume_revalidation_failed" in human.stdout
    assert _qty(tmp_path) == {1: 5, 2: 7, 3: 9}


def test_a_key_column_the_table_lacks_is_read_failed_and_changes_nothing(
        tmp_path: Path) -> None:
    """SQLite reads a double-quoted name that is no column as a string literal: with key
    ["nokey"] and a row {"nokey": "nokey", ...}, `WHERE "nokey" = 'nokey'` would match the
    table's one row. `effects preview` checks the declared columns first: exit 4,
    preview_failed with rule read_failed naming the column; nothing is stored or changed."""
    _setup(tmp_path, [{"id": 1, "qty": 10}])
    db = sqlite3.connect(tmp_path / "shop.db")
    with db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO notes VALUES (1, 'original')")
    db.close()
    (tmp_path / "nokey.json").write_text(json.dumps({"version": "marque-effect-set/0.1",
                                                     "members": [
        {"effect_id": "fix", "kind": "update", "table": "notes", "key": ["nokey"],
         "failure_policy": "halt", "max_items": 10, "input": "nokey.rows.json"}]}))
    (tmp_path / "nokey.rows.json").write_text(json.dumps([{"nokey": "nokey",
                                                           "value": "changed"}]))

    done = marque(tmp_path, "effects", "preview", "--home", "home", "--declaration",
                  "nokey.json", "--target", "shop", "--json")

    assert done.returncode == 4, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "preview_failed"
    assert (error["detail"]["rule"], error["detail"]["columns"]) == ("read_failed", ["nokey"])
    db = sqlite3.connect(tmp_path / "shop.db")
    try:
        assert db.execute("SELECT id, value FROM notes").fetchall() == [(1, "original")]
    finally:
        db.close()
