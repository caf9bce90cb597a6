"""A lease written by a clock an hour ahead, read by one that is not (found by soak row 10).

A Pilot whose clock runs an hour ahead (Debian's libfaketime) claims a nonce
and dies. Where the dead owner cannot be seen (no process lock: an owner on
another host sharing the ledger), only the lease decides — and a lease taken
"an hour from now" used to look live for an hour and five minutes to a
Pilot on the right clock: the nonce answered ``in_progress`` all that time.
A lease that starts later than this clock by more than the skew allowance
now counts as run out, and reconciliation (which only observes) settles it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import MARQUE, cli_env

from marque.change import Budget, Change, Statement
from marque.pilot import open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"

pytestmark = pytest.mark.faketime


@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime missing (scripts/ensure-faketime)")
def test_a_lease_from_a_clock_ahead_does_not_hold_a_nonce_whose_owner_is_unseen(
        tmp_path: Path) -> None:
    """Claimed under +1 h and killed, its process lock gone: a Pilot on the real clock
    settles the attempt at once (lease_expired, not applied) and the retry applies once."""
    bank = tmp_path / "bank.db"
    with sqlite3.connect(bank) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        conn.execute("INSERT INTO accounts VALUES (1, 100)")
    conn.close()
    home = tmp_path / "home"
    issuer, holder = new_key(), new_key()
    incarnation = init_home(home, "p1")["incarnation"]
    trust_issuer(home, public_jwk(issuer))
    add_target(home, "bank", f"sqlite:///{bank}")
    token = issue_marque(issuer, pilot_id="p1", incarnation=incarnation, target="bank",
                         holder_jwk=public_jwk(holder), change=Change((Statement(DEBIT, ()),)),
                         budget=Budget(1, 1, 3), ttl_seconds=2 * 86400, subject="t",
                         now=time.time() - 86400)
    (tmp_path / "marque.jws").write_text(token)
    (tmp_path / "holder.jwk").write_text(json.dumps(holder))

    ahead = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "+3600s",
             "FAKETIME_DONT_FAKE_MONOTONIC": "1", "MARQUE_CRASH_AT": "after_claim"}
    died = subprocess.run([str(MARQUE), "exec", "--home", str(home), "--marque",
                           str(tmp_path / "marque.jws"), "--key", str(tmp_path / "holder.jwk"),
                           "--nonce", "n-1", "--json"], capture_output=True, text=True,
                          timeout=60, env=cli_env(ahead), stdin=subprocess.DEVNULL)
    assert died.returncode == -9, died.stderr
    with sqlite3.connect(home / "ledger.sqlite3") as ledger:
        [(status, started_at)] = ledger.execute("SELECT status, started_at FROM attempts")
    ledger.close()
    assert status == "in_progress" and started_at > time.time() + 3000
    for lock in (home / "processes").glob("*.lock"):
        lock.unlink()  # the owner cannot be seen from here: only its lease speaks

    pilot = open_pilot(home)  # start-up recovery, on the real clock
    try:
        first = pilot.outcome(_mid(token), "n-1")
        assert first.status == "aborted_not_applied", first
        assert (first.error or {}).get("code") == "lease_expired", first.error
        proof = make_proof(holder, token, nonce="n-1", pilot_id="p1")
        again = pilot.execute(token, proof, "n-1")
        assert (again.status, again.attempt) == ("applied", 2)
    finally:
        pilot.close()
    with sqlite3.connect(bank) as conn:
        assert conn.execute("SELECT balance FROM accounts").fetchone() == (90,)
    conn.close()


def _mid(token: str) -> str:
    from marque.token import unverified_claims

    return str((unverified_claims(token) or {})["jti"])
