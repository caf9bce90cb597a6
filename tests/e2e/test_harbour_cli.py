"""`marque harbour …` and `marque logbook …` offline over a home, as real processes.

A Harbourmaster's home is made with `harbour init`; principals and routing are
changed through the CLI; the logbook is verified, then tampered with through
plain sqlite3, and `logbook verify` must name the first bad entry.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from e2e_support import run_cli

OVERLAP = """
[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = ["read"]
outcome = "allow"

[[entry]]
principal = ["alice"]
target = "*"
resource = "*"
operation = ["read", "write"]
outcome = "deny"
"""

ALLOW_ALL = """
[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = "*"
outcome = "allow"
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = run_cli("harbour", "init", "--home", tmp_path / "h", "--json")
    assert made.returncode == 0, made
    return tmp_path / "h"


def store_rows(home: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with sqlite3.connect(home / "harbour.sqlite3") as conn:
        return conn.execute(sql, params).fetchall()


def test_init_prints_the_admin_token_once_and_keeps_only_its_hash(tmp_path: Path) -> None:
    made = run_cli("harbour", "init", "--home", tmp_path / "h", "--json")
    assert made.returncode == 0, made
    body = made.json
    assert body["admin_token"].startswith("mqh_") and body["issuer_kid"]
    assert body["routing"]["bootstrap"] is True
    assert body["admin_token"].encode() not in (tmp_path / "h" / "harbour.sqlite3").read_bytes()
    assert (tmp_path / "h" / "issuer.jwk").stat().st_mode & 0o077 == 0  # owner only
    kinds = [k for (k,) in store_rows(tmp_path / "h", "SELECT kind FROM logbook ORDER BY seq")]
    assert "config.adopted" in kinds and "principal.added" in kinds

    again = run_cli("harbour", "init", "--home", tmp_path / "h", "--json")
    assert again.returncode == 2 and again.json["error"]["code"] == "input_invalid"


def test_init_with_an_invalid_routing_config_leaves_nothing(tmp_path: Path) -> None:
    config = tmp_path / "overlap.toml"
    config.write_text(OVERLAP)
    made = run_cli("harbour", "init", "--home", tmp_path / "h", "--routing", config, "--json")
    assert made.returncode == 3, made
    assert made.json["error"]["code"] == "account_config_invalid"
    assert not (tmp_path / "h" / "harbour.json").exists()
    assert not (tmp_path / "h" / "harbour.sqlite3").exists()


def test_principals_are_added_listed_and_revoked(home: Path, tmp_path: Path) -> None:
    key = tmp_path / "alice.jwk"
    assert run_cli("keys", "new", "--out", key).returncode == 0
    public = tmp_path / "alice.pub.jwk"
    public.write_text(run_cli("keys", "public", key).stdout)
    added = run_cli("harbour", "principal", "add", "--home", home, "alice", "--role",
                    "requester", "--role", "approver", "--key", public, "--json")
    assert added.returncode == 0, added
    assert sorted(added.json["roles"]) == ["approver", "requester"]
    assert added.json["token"].encode() not in (home / "harbour.sqlite3").read_bytes()

    private = run_cli("harbour", "principal", "add", "--home", home, "mallory", "--role",
                      "requester", "--key", key, "--json")
    assert private.returncode == 2 and private.json["error"]["code"] == "input_invalid"
    twice = run_cli("harbour", "principal", "add", "--home", home, "alice", "--role",
                    "auditor", "--json")
    assert twice.returncode == 2 and twice.json["error"]["code"] == "conflict"

    revoked = run_cli("harbour", "principal", "revoke", "--home", home, "alice", "--json")
    assert revoked.returncode == 0 and revoked.json["revoked_at"] is not None
    listed = run_cli("harbour", "principal", "list", "--home", home, "--json").json
    names = {p["name"]: p for p in listed["principals"]}
    assert set(names) == {"admin", "alice"}
    assert names["alice"]["revoked_at"] is not None and names["admin"]["revoked_at"] is None
    unknown = run_cli("harbour", "principal", "revoke", "--home", home, "nobody", "--json")
    assert unknown.returncode == 2 and unknown.json["error"]["code"] == "not_found"


def test_routing_check_and_set(home: Path, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(ALLOW_ALL)
    bad.write_text(OVERLAP)
    checked = run_cli("harbour", "routing", "check", good, "--json")
    assert checked.returncode == 0 and checked.json["entries"] == 1
    refused = run_cli("harbour", "routing", "check", bad, "--json")
    assert refused.returncode == 3
    assert refused.json["error"]["code"] == "account_config_invalid"
    garbage = tmp_path / "garbage.toml"
    garbage.write_text("[[entry]\nprincipal = ")
    assert run_cli("harbour", "routing", "check", garbage, "--json").returncode == 3

    before = len(store_rows(home, "SELECT seq FROM logbook"))
    adopted = run_cli("harbour", "routing", "set", "--home", home, good, "--json")
    assert adopted.returncode == 0, adopted
    assert adopted.json["config_cid"] == checked.json["config_cid"] and adopted.json["changed"]
    same = run_cli("harbour", "routing", "set", "--home", home, good, "--json")
    assert same.json["changed"] is False
    assert run_cli("harbour", "routing", "set", "--home", home, bad, "--json").returncode == 3
    kinds = [k for (k,) in store_rows(home, "SELECT kind FROM logbook WHERE seq > ?",
                                      (before,))]
    assert kinds == ["config.adopted"]


def test_logbook_verify_names_the_first_edited_entry(home: Path) -> None:
    for name in ("a", "b", "c"):
        run_cli("harbour", "principal", "add", "--home", home, name, "--role", "auditor")
    intact = run_cli("logbook", "verify", "--home", home, "--json")
    assert intact.returncode == 0 and intact.json["intact"] is True
    entries = intact.json["entries"]
    assert entries >= 5

    with sqlite3.connect(home / "harbour.sqlite3") as conn:
        conn.execute("UPDATE logbook SET body = replace(body, '\"a\"', '\"z\"') WHERE seq = ?",
                     (entries - 2,))
    broken = run_cli("logbook", "verify", "--home", home, "--json")
    assert broken.returncode == 8, broken
    body = broken.json
    assert body["intact"] is False and body["error"]["code"] == "logbook_broken"
    assert body["break"]["seq"] == entries - 2


def test_a_saved_signed_head_catches_a_truncated_tail(home: Path, tmp_path: Path) -> None:
    run_cli("harbour", "principal", "add", "--home", home, "a", "--role", "auditor")
    head = tmp_path / "head.json"
    saved = run_cli("logbook", "head", "--home", home, "--out", head, "--json")
    assert saved.returncode == 0 and saved.json["signed"]
    last = saved.json["seq"]
    assert run_cli("logbook", "verify", "--home", home, "--head", head).returncode == 0

    with sqlite3.connect(home / "harbour.sqlite3") as conn:
        conn.execute("DELETE FROM logbook WHERE seq = ?", (last,))
    # The store's own head row already names the cut; a saved head names it too.
    bare = run_cli("logbook", "verify", "--home", home, "--json")
    assert bare.returncode == 8 and bare.json["break"]["seq"] == last
    cut = run_cli("logbook", "verify", "--home", home, "--head", head, "--json")
    assert cut.returncode == 8 and cut.json["break"]["seq"] == last

    # Cutting the head row back too defeats the store's own check; the saved head does not.
    with sqlite3.connect(home / "harbour.sqlite3") as conn:
        [(prev,)] = conn.execute("SELECT hash FROM logbook WHERE seq = ?", (last - 1,))
        conn.execute("UPDATE logbook_head SET seq = ?, hash = ?", (last - 1, prev))
    assert run_cli("logbook", "verify", "--home", home).returncode == 0
    cut = run_cli("logbook", "verify", "--home", home, "--head", head, "--json")
    assert cut.returncode == 8 and cut.json["break"]["seq"] == last

    forged = json.loads(head.read_text())
    forged["signed"] = forged["signed"][:-4] + ("AAAA" if forged["signed"][-4:] != "AAAA"
                                                 else "BBBB")
    head.write_text(json.dumps(forged))
    refused = run_cli("logbook", "verify", "--home", home, "--head", head, "--json")
    assert refused.returncode == 2 and refused.json["error"]["code"] == "input_invalid"


def test_logbook_verify_over_a_pilot_home(tmp_path: Path) -> None:
    assert run_cli("pilot", "init", "--home", tmp_path / "p", "--pilot-id", "p1").returncode == 0
    ok = run_cli("logbook", "verify", "--home", tmp_path / "p", "--json")
    assert ok.returncode == 0 and ok.json["intact"] is True
    nowhere = run_cli("logbook", "verify", "--home", tmp_path / "nothing", "--json")
    assert nowhere.returncode == 2 and nowhere.json["error"]["code"] == "not_found"
