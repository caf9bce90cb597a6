"""A Pilot's home: moves, copies, strict configuration, failed inits, lost pilot.json.

Issue 8's findings 1, 2, 3, 5 and 6, through the functions the CLI calls
(``marque.pilot.setup``) and :func:`open_pilot`, over real SQLite files (and a
real PostgreSQL server where a target must answer). What is checked is what an
operator sees: the typed error and its message, ``pilot.json``, the ledger's
rows and the bank's balances.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from marque.errors import (
    ConfigInvalid,
    HomeMismatch,
    InvalidInput,
    LedgerExists,
    LedgerMissing,
    LedgerUnavailable,
    MarqueInvalid,
    NotFound,
    TargetUnavailable,
    UnknownTarget,
)
from marque.pilot import Settings, open_pilot
from marque.pilot.setup import (
    add_target,
    init_home,
    list_targets,
    move_home,
    remove_target,
    show_pilot,
    trust_issuer,
    untrust_issuer,
)
from marque.token import public_jwk

from .conftest import PILOT_ID, Env

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
START = {1: 100, 2: 100, 3: 100}
#: What a message for an operator must never show.
LEAKS = ("Traceback", "__init__", "object has no attribute", "KeyError", "Settings(", "{'")


def config_of(home: Path) -> dict[str, Any]:
    return json.loads((home / "pilot.json").read_text())


def write_config(home: Path, config: dict[str, Any]) -> None:
    (home / "pilot.json").write_text(json.dumps(config))


def ledger_rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(home / "ledger.sqlite3")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def unbind_ledger(home: Path) -> None:
    """Make the home look like one made before ledgers were bound to their home."""
    conn = sqlite3.connect(home / "ledger.sqlite3")
    try:
        with conn:
            conn.execute("DELETE FROM meta WHERE key IN ('home_id', 'home_path')")
    finally:
        conn.close()
    config = config_of(home)
    del config["home_id"]
    config["ledger"] = f"sqlite:///{(home / 'ledger.sqlite3').resolve()}"
    write_config(home, config)


def remove_ledger(home: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{home / 'ledger.sqlite3'}{suffix}").unlink(missing_ok=True)


# -- finding 1: a moved home keeps working once acknowledged; a copy never shares silently ----


def test_a_moved_home_is_refused_until_the_move_is_acknowledged(env: Env, tmp_path: Path) -> None:
    """After `mv`, the home is home_mismatch until move_home; then it runs on the same ledger."""
    token = env.issue([DEBIT_1])
    assert env.run(token, "n-1").status == "applied"
    incarnation = env.pilot.incarnation
    env.pilot.close()
    old = env.home.resolve()
    moved = tmp_path / "moved"
    env.home.rename(moved)
    env.home = moved

    with pytest.raises(HomeMismatch) as caught:
        env.pilot = open_pilot(moved)
    assert caught.value.code == "home_mismatch"
    assert str(old) in caught.value.message
    assert f"marque pilot move --home {moved}" in caught.value.message

    result = move_home(moved)
    assert result["moved_from"] == str(old)
    assert (result["home"], result["incarnation"]) == (str(moved.resolve()), incarnation)
    assert move_home(moved)["moved_from"] is None  # acknowledging twice changes nothing

    env.pilot = open_pilot(moved)
    again = env.run(token, "n-1")
    assert (again.status, again.replayed, again.incarnation) == ("applied", True, incarnation)
    assert env.balances() == {**START, 1: 90}


def test_a_copied_home_is_refused_and_cannot_be_moved_while_the_original_holds_it(
    env: Env, tmp_path: Path
) -> None:
    """`cp -r` clones the ledger's incarnation: the copy is home_mismatch, the original runs."""
    token = env.issue([DEBIT_1], executions=2)
    env.pilot.close()
    copy = tmp_path / "copy"
    shutil.copytree(env.home, copy)

    with pytest.raises(HomeMismatch) as caught:
        open_pilot(copy)
    message = caught.value.message
    assert "is a copy of the Pilot home at" in message and str(env.home.resolve()) in message
    with pytest.raises(HomeMismatch) as refused:
        move_home(copy)
    assert "still holds this Pilot" in refused.value.message

    env.pilot = open_pilot(env.home)
    assert env.run(token, "n-1").status == "applied"
    assert env.balances() == {**START, 1: 90}
    assert ledger_rows(copy, "SELECT COUNT(*) FROM claims") == [(0,)]


def test_a_copy_whose_ledger_was_removed_never_reaches_the_originals_ledger(
    env: Env, tmp_path: Path
) -> None:
    """A copy without its ledger is ledger_missing, and init gives it an incarnation of its own."""
    env.pilot.close()
    copy = tmp_path / "copy"
    shutil.copytree(env.home, copy)
    remove_ledger(copy)

    with pytest.raises(LedgerMissing):
        open_pilot(copy)
    assert ledger_rows(env.home, "SELECT COUNT(*) FROM claims") == [(0,)]

    created = init_home(copy, PILOT_ID)
    env.pilot = open_pilot(env.home)
    assert created["incarnation"] != env.pilot.incarnation
    twin = open_pilot(copy)
    try:
        assert twin.incarnation == created["incarnation"]
    finally:
        twin.close()


def test_a_home_pointing_at_another_homes_or_pilots_ledger_is_refused(
    env: Env, tmp_path: Path
) -> None:
    """pilot.json naming another home's ledger (or another Pilot's) is home_mismatch."""
    other = tmp_path / "other"
    init_home(other, PILOT_ID)
    config = config_of(other)
    config["ledger"] = f"sqlite:///{env.home / 'ledger.sqlite3'}"
    write_config(other, config)

    with pytest.raises(HomeMismatch) as caught:
        open_pilot(other)
    assert f"belongs to the Pilot home at {env.home.resolve()}" in caught.value.message

    stranger = tmp_path / "stranger"
    init_home(stranger, "pilot-2")
    config = config_of(stranger)
    config["ledger"] = f"sqlite:///{env.home / 'ledger.sqlite3'}"
    write_config(stranger, config)
    with pytest.raises(HomeMismatch) as caught:
        open_pilot(stranger)
    assert f"belongs to Pilot {PILOT_ID}" in caught.value.message


def test_an_old_home_is_bound_on_first_open_and_an_old_moved_home_can_be_moved(
    env: Env, tmp_path: Path
) -> None:
    """A pre-binding home (absolute ledger path, no home id) loads; moved, it can be moved."""
    env.pilot.close()
    unbind_ledger(env.home)
    env.pilot = open_pilot(env.home)
    env.pilot.close()
    config = config_of(env.home)
    assert config["ledger"] == "sqlite:///ledger.sqlite3"
    assert ledger_rows(env.home, "SELECT value FROM meta WHERE key = 'home_id'") == [
        (config["home_id"],)]

    unbind_ledger(env.home)
    old = env.home.resolve()
    moved = tmp_path / "moved"
    env.home.rename(moved)
    env.home = moved
    with pytest.raises(HomeMismatch) as caught:
        env.pilot = open_pilot(moved)
    assert "marque pilot move" in caught.value.message
    with pytest.raises(HomeMismatch):  # init is no way out of a move: it says to move
        init_home(moved, PILOT_ID)
    assert move_home(moved)["moved_from"] == str(old)
    env.pilot = open_pilot(moved)
    assert env.run(env.issue([DEBIT_1]), "n-1").status == "applied"


# -- finding 2: a bad configuration is found at load, never after a claim ----------------------

BAD_CONFIGS = [
    (("settings", "lock_timeout_ms"), "fast",
     'settings.lock_timeout_ms must be an integer number of milliseconds ≥ 1 and ≤ 2147483647, '
     'got "fast"'),
    (("settings", "lease_grace_seconds"), -5,
     "settings.lease_grace_seconds must be a number of seconds ≥ 0, got -5"),
    (("settings", "statement_timeout_ms"), 1.5, "settings.statement_timeout_ms must be an integer"),
    (("settings", "skew_seconds"), True, "settings.skew_seconds must be a number of seconds"),
    (("settings", "pop_window_seconds"), 0, "settings.pop_window_seconds must be a number of "
     "seconds > 0, got 0"),
    (("settings", "replay_jti_write_behind"), "false",
     'settings.replay_jti_write_behind must be true or false, got "false"'),
    (("settings", "bogus_setting"), 1, "settings.bogus_setting is not a setting (known settings:"),
    (("settings",), [], "settings must be a JSON object"),
    (("bogus",), 1, "bogus is not a pilot.json key"),
    (("targets",), ["bank"], "targets must be a JSON object of name → DSN"),
    (("targets", "bank"), 7, "targets.bank must be a DSN string"),
    (("targets", "bank"), "mysql://db/x", "targets.bank must be sqlite:///path or postgresql://"),
    (("targets", "bad name"), "sqlite:///x.db", 'targets: "bad name" is not a target name'),
    (("pilot_id",), "pilot 1", 'pilot_id must be 1..64 of A-Z a-z 0-9 _ . -, got "pilot 1"'),
    (("issuers",), {"kty": "OKP"}, "issuers must be a JSON array of public JWKs"),
    (("issuers",), [{"kty": "RSA", "n": "x", "e": "AQAB"}], "issuers[0]: "),
    (("ledger",), None, "ledger must be a DSN string"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD_CONFIGS,
                         ids=[".".join(path) + "=" + json.dumps(value) for path, value, _ in
                              BAD_CONFIGS])
def test_a_bad_pilot_json_is_refused_at_load_naming_the_key(
    env: Env, path: tuple[str, ...], value: Any, expected: str
) -> None:
    """Each bad value in pilot.json is config_invalid at load, naming the key and the rule."""
    env.pilot.close()
    config = config_of(env.home)
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    write_config(env.home, config)

    with pytest.raises(ConfigInvalid) as caught:
        env.pilot = open_pilot(env.home)
    assert caught.value.code == "config_invalid"
    assert caught.value.message.startswith(f"{env.home / 'pilot.json'}: ")
    assert expected in caught.value.message
    assert not any(leak in caught.value.message for leak in LEAKS), caught.value.message


def test_a_private_issuer_key_in_pilot_json_is_refused(env: Env) -> None:
    """pilot.json keeps issuers' public keys only; a private JWK there is config_invalid."""
    env.pilot.close()
    config = config_of(env.home)
    config["issuers"] = [env.issuer]
    write_config(env.home, config)
    with pytest.raises(ConfigInvalid) as caught:
        open_pilot(env.home)
    assert 'issuers[0] holds a private key (member "d")' in caught.value.message
    assert env.issuer["d"] not in caught.value.message


def test_every_setting_reaches_the_pilot_options_and_targets(env: Env) -> None:
    """Settings is the one source: each field set in pilot.json reaches pilot.options."""
    chosen: dict[str, Any] = {}
    for field in fields(Settings):
        default = getattr(Settings(), field.name)
        if isinstance(default, bool):
            chosen[field.name] = not default
        elif isinstance(default, int):
            chosen[field.name] = default + 7
        else:
            chosen[field.name] = default + 1.5
    config = config_of(env.home)
    config["settings"] = chosen
    write_config(env.home, config)

    pilot = env.reopen()

    assert {name: getattr(pilot.options, name) for name in chosen} == chosen
    bank: Any = pilot.targets["bank"]
    assert bank.lock_timeout_ms == chosen["lock_timeout_ms"]


def test_a_relative_target_path_in_pilot_json_is_the_homes_not_the_cwd(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite:///../bank.db` in pilot.json means next to the home, from any working directory."""
    config = config_of(env.home)
    config["targets"]["bank"] = "sqlite:///../bank.db"
    write_config(env.home, config)
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)

    env.reopen()

    assert env.run(env.issue([DEBIT_1]), "n-1").status == "applied"
    assert env.balances() == {**START, 1: 90}


def test_target_add_stores_a_relative_path_absolute_from_the_callers_directory(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative SQLite path at `target add` is the caller's cwd's, stored absolute."""
    monkeypatch.chdir(tmp_path)
    result = add_target(env.home, "bank2", "sqlite:///bank.db")
    absolute = f"sqlite:///{tmp_path / 'bank.db'}"
    assert result == {"target": "bank2", "dsn": absolute, "checked": True,
                      "resolved_from": "sqlite:///bank.db"}
    assert config_of(env.home)["targets"]["bank2"] == absolute

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    env.reopen()
    assert env.run(env.issue([DEBIT_1], target="bank2"), "n-1").status == "applied"
    assert env.balances() == {**START, 1: 90}


UNREACHABLE = {
    "missing file": lambda root: f"sqlite:///{root / 'nope.db'}",
    "missing directory": lambda root: f"sqlite:///{root / 'nodir' / 'bank.db'}",
    "not a database": lambda root: f"sqlite:///{root / 'garbage.db'}",
    "unknown host": lambda root: "postgresql://marque:s3cret@nohost.invalid/db",
    "refused": lambda root: "postgresql://marque:s3cret@127.0.0.1:1/db",
}


@pytest.mark.parametrize("case", UNREACHABLE)
def test_target_add_refuses_a_target_that_does_not_answer(
    env: Env, tmp_path: Path, case: str
) -> None:
    """An unreachable target is target_unavailable at `target add`; --no-check still adds it."""
    (tmp_path / "garbage.db").write_bytes(b"this is not a database file at all" * 100)
    dsn = UNREACHABLE[case](tmp_path)
    before = config_of(env.home)

    with pytest.raises(TargetUnavailable) as caught:
        add_target(env.home, "ghost", dsn)
    assert caught.value.code == "target_unavailable"
    assert caught.value.message.startswith("target ghost: ")
    assert "--no-check" in caught.value.message
    assert "s3cret" not in caught.value.message
    assert config_of(env.home) == before

    added = add_target(env.home, "ghost", dsn, check=False)
    assert added["checked"] is False
    assert config_of(env.home)["targets"]["ghost"] == dsn


def test_target_add_accepts_a_postgresql_target_that_answers(env: Env, pg_dsn: str) -> None:
    """A PostgreSQL server that accepts the connection is added, checked, and creates nothing."""
    import psycopg

    result = add_target(env.home, "pg", pg_dsn)
    assert result["checked"] is True
    assert config_of(env.home)["targets"]["pg"] == pg_dsn
    with psycopg.connect(pg_dsn) as conn:
        schema = conn.execute("SELECT to_regclass('marque.stamps')").fetchone()
    assert schema == (None,)  # the probe only connected


# -- finding 3: typed errors, and a failed init leaves nothing behind --------------------------


def test_a_failed_init_removes_only_what_it_created(tmp_path: Path) -> None:
    """An unreachable PostgreSQL ledger: init is ledger_unavailable and leaves no home behind."""
    unreachable = "postgresql://marque:s3cret@127.0.0.1:1/ledger"
    fresh = tmp_path / "new" / "home"
    with pytest.raises(LedgerUnavailable) as caught:
        init_home(fresh, PILOT_ID, unreachable)
    assert "s3cret" not in caught.value.message
    assert not (tmp_path / "new").exists()

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me")
    with pytest.raises(LedgerUnavailable):
        init_home(existing, PILOT_ID, unreachable)
    assert sorted(os.listdir(existing)) == ["notes.txt"]


def test_init_refuses_bad_places_with_typed_errors(tmp_path: Path) -> None:
    """A ledger in a missing directory, a --home that is a file or unwritable: input_invalid."""
    home = tmp_path / "home"
    with pytest.raises(InvalidInput) as caught:
        init_home(home, PILOT_ID, f"sqlite:///{tmp_path / 'nodir' / 'ledger.sqlite3'}")
    assert f"the ledger's directory {tmp_path / 'nodir'} does not exist" in caught.value.message
    assert not home.exists()

    a_file = tmp_path / "a-file"
    a_file.write_text("not a home")
    for where in (a_file, a_file / "home"):
        with pytest.raises(InvalidInput) as caught:
            init_home(where, PILOT_ID)
        assert "is a file (or lies under one), not a directory" in caught.value.message
    assert a_file.read_text() == "not a home"

    with pytest.raises(InvalidInput) as caught:
        init_home("/sys/marque-test-home", PILOT_ID)  # not writable, even for root
    assert caught.value.message.startswith("cannot create or write /sys/marque-test-home: ")
    assert caught.value.detail["errno"] in ("EPERM", "EACCES", "EROFS")

    with pytest.raises(InvalidInput) as caught:
        init_home(home, "pilot 1")
    assert "pilot id must be 1..64 of A-Z a-z 0-9 _ . -" in caught.value.message
    assert not home.exists()


# -- finding 6: pilot.json lost, ledger kept -------------------------------------------------


def test_a_lost_pilot_json_is_named_and_init_re_adopts_the_ledger(env: Env) -> None:
    """No pilot.json but a ledger: the error says so, and init re-adopts the same incarnation."""
    token = env.issue([DEBIT_1], executions=2)
    assert env.run(token, "n-1").status == "applied"
    incarnation = env.pilot.incarnation
    env.pilot.close()
    (env.home / "pilot.json").unlink()

    with pytest.raises(ConfigInvalid) as caught:
        env.pilot = open_pilot(env.home)
    assert "holds a ledger (ledger.sqlite3) but no pilot.json" in caught.value.message
    assert f"marque pilot init --home {env.home} --pilot-id ID" in caught.value.message
    with pytest.raises(LedgerExists) as refused:
        init_home(env.home, "someone-else")
    assert f"--pilot-id {PILOT_ID}" in refused.value.message
    assert not (env.home / "pilot.json").exists()

    adopted = init_home(env.home, PILOT_ID)
    assert adopted == {"pilot_id": PILOT_ID, "incarnation": incarnation, "adopted": True}
    trust_issuer(env.home, public_jwk(env.issuer))
    add_target(env.home, "bank", f"sqlite:///{env.bank_path}")
    env.pilot = open_pilot(env.home)

    again = env.run(token, "n-1")
    assert (again.status, again.replayed) == ("applied", True)
    assert env.pilot.ledger.budget(again.marque_id)["executions_left"] == 1  # type: ignore[index]
    assert env.balances() == {**START, 1: 90}


# -- finding 5: what `pilot show`, `target list|remove` and `pilot untrust` stand on ------------


def test_show_pilot_names_what_the_next_command_needs_with_secrets_redacted(env: Env) -> None:
    """show_pilot: id, incarnation, home, ledger, targets, issuer kids, settings; no password."""
    add_target(env.home, "pg", "postgresql://marque:s3cret@db.example:5433/prod", check=False)

    shown = show_pilot(env.home)

    assert shown == {
        "pilot_id": PILOT_ID,
        "incarnation": env.pilot.incarnation,
        "home": str(env.home.resolve()),
        "ledger": f"sqlite:///{env.home.resolve() / 'ledger.sqlite3'}",
        "targets": {"bank": f"sqlite:///{env.bank_path}",
                    "pg": "postgresql://marque:***@db.example:5433/prod"},
        # Bound at start, to the identity its stamp table holds; `pg` was never reached.
        "target_bindings": {"bank": {"target_id": env.pilot.target_ids["bank"],
                                     "location": str(env.bank_path)}},
        "issuers": [env.issuer["kid"]],
        "settings": Settings().to_dict(),
        "row_keys": {},
    }
    assert list_targets(env.home) == shown["targets"]


def test_a_removed_target_and_an_untrusted_issuer_are_refused_from_then_on(env: Env) -> None:
    """remove_target / untrust_issuer take effect at the next open; unknown ones are not_found."""
    token = env.issue([DEBIT_1])
    assert remove_target(env.home, "bank") == {"target": "bank",
                                               "dsn": f"sqlite:///{env.bank_path}"}
    with pytest.raises(NotFound):
        remove_target(env.home, "bank")
    env.reopen()
    with pytest.raises(UnknownTarget):
        env.run(token, "n-1")

    add_target(env.home, "bank", f"sqlite:///{env.bank_path}")
    kid = env.issuer["kid"]
    assert untrust_issuer(env.home, kid) == {"kid": kid, "trusted": []}
    with pytest.raises(NotFound) as caught:
        untrust_issuer(env.home, kid)
    assert caught.value.code == "not_found"
    env.reopen()
    with pytest.raises(MarqueInvalid):
        env.run(token, "n-2")
    assert env.balances() == START

