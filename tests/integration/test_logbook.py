"""The logbook on real SQLite files: its chain says no, and where; its schema is versioned;
reports it could not take are delivered later, once.

Tampering is done the way an intruder or a careless operator would: with plain
:mod:`sqlite3` on the file, behind the logbook's back. Unavailability is a
real write lock held by another connection.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from marque.errors import HarbourUnavailable
from marque.harbour.logbook import GENESIS, MIGRATIONS, Logbook, entry_hash

from .conftest import Env

DEBIT_1 = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
ENTRIES = 6

# The logbook table exactly as Marque created it before the logbook had versions.
UNVERSIONED_DDL = """CREATE TABLE IF NOT EXISTS logbook (
    seq INTEGER PRIMARY KEY,
    entry_key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    at REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL)"""


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "logbook.sqlite3")


@pytest.fixture
def logbook(path: str) -> Iterator[Logbook]:
    """A logbook holding entries 1..ENTRIES."""
    book = Logbook(path)
    for n in range(1, ENTRIES + 1):
        assert book.append(f"test.entry{n % 2}", f"key/{n}", {"n": n, "text": f"entry {n}"})
    try:
        yield book
    finally:
        book.close()


def tamper(path: str, *statements: str) -> None:
    """Run statements on the logbook file from another connection, as an intruder would."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def stored_version(path: str) -> str | None:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT value FROM logbook_meta WHERE key = 'schema_version'").fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


# -- verification says no, and where -------------------------------------------------------


def test_an_untouched_chain_verifies(logbook: Logbook) -> None:
    """A chain nobody touched verifies, and names no broken entry."""
    assert logbook.verify() is True
    assert logbook.first_broken() is None
    assert logbook.check() is None
    assert [e["seq"] for e in logbook.entries()] == list(range(1, ENTRIES + 1))


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE logbook SET body = '{\"n\":3,\"text\":\"entry 33\"}' WHERE seq = 3",
        "UPDATE logbook SET body = '{\"n\": 3, \"text\": \"entry 3\"}' WHERE seq = 3",
        "UPDATE logbook SET body = 'not json' WHERE seq = 3",
        "UPDATE logbook SET kind = 'test.other' WHERE seq = 3",
        "UPDATE logbook SET entry_key = 'key/33' WHERE seq = 3",
        "UPDATE logbook SET at = at + 1 WHERE seq = 3",
        "UPDATE logbook SET at = 'yesterday' WHERE seq = 3",
        "UPDATE logbook SET hash = '" + "f" * 64 + "' WHERE seq = 3",
    ],
    ids=["body", "body-whitespace", "body-garbage", "kind", "key", "at", "at-text", "hash"],
)
def test_an_edited_entry_is_named(logbook: Logbook, path: str, edit: str) -> None:
    """Any column of entry 3 edited in place: verify says no and names entry 3."""
    tamper(path, edit)
    assert logbook.verify() is False
    assert logbook.first_broken() == 3
    found = logbook.check()
    assert found is not None and found.seq == 3


def test_an_edited_and_rehashed_entry_is_caught_at_the_next(logbook: Logbook, path: str) -> None:
    """Entry 3 edited with its hash recomputed: the chain breaks at entry 4, which named it."""
    [third] = [e for e in logbook.entries() if e["seq"] == 3]
    body = {**third["body"], "text": "rewritten"}
    forged = entry_hash(third["prev_hash"], third["kind"], third["key"], body, third["at"])
    tamper(path, f"UPDATE logbook SET body = '{{\"n\":3,\"text\":\"rewritten\"}}', "
                 f"hash = '{forged}' WHERE seq = 3")
    assert logbook.first_broken() == 4
    assert logbook.verify() is False


@pytest.mark.parametrize("seq", [1, 3, ENTRIES - 1])
def test_a_removed_entry_is_named_by_its_seq(logbook: Logbook, path: str, seq: int) -> None:
    """An entry deleted from the chain (first, middle, next to last) is named by its seq."""
    tamper(path, f"DELETE FROM logbook WHERE seq = {seq}")
    assert logbook.verify() is False
    assert logbook.first_broken() == seq


def test_a_removal_hidden_by_renumbering_is_named(logbook: Logbook, path: str) -> None:
    """Entry 3 deleted and the later ones renumbered to close the gap: seq 3 is named."""
    tamper(path, "DELETE FROM logbook WHERE seq = 3",
           "UPDATE logbook SET seq = -(seq - 1) WHERE seq > 3",
           "UPDATE logbook SET seq = -seq WHERE seq < 0")
    assert [e["seq"] for e in logbook.entries()] == list(range(1, ENTRIES))
    assert logbook.first_broken() == 3


def test_reordered_entries_are_named_by_the_first_moved(logbook: Logbook, path: str) -> None:
    """Entries 2 and 5 swapped: the first seq holding the wrong entry (2) is named."""
    tamper(path, "UPDATE logbook SET seq = -2 WHERE seq = 2",
           "UPDATE logbook SET seq = 2 WHERE seq = 5",
           "UPDATE logbook SET seq = 5 WHERE seq = -2")
    assert logbook.verify() is False
    assert logbook.first_broken() == 2


def test_an_entry_moved_to_the_end_is_named(logbook: Logbook, path: str) -> None:
    """Entry 2 moved behind the last one: seq 2 is named as missing."""
    tamper(path, f"UPDATE logbook SET seq = {ENTRIES + 1} WHERE seq = 2")
    assert logbook.first_broken() == 2


def test_a_cut_tail_still_verifies_without_a_saved_head(logbook: Logbook, path: str) -> None:
    """Removing the newest entries leaves a shorter, intact chain (the documented limit)."""
    tamper(path, f"DELETE FROM logbook WHERE seq > {ENTRIES - 2}")
    assert logbook.first_broken() is None


def test_appends_after_a_break_do_not_hide_it(logbook: Logbook, path: str) -> None:
    """New entries appended after an edit chain onto the edited head; the edit stays named."""
    tamper(path, "UPDATE logbook SET kind = 'test.other' WHERE seq = 2")
    assert logbook.append("test.later", "key/later", {"n": 99})
    assert logbook.first_broken() == 2


# -- versioned schema ---------------------------------------------------------------------


def test_a_new_logbook_records_the_newest_schema_version(path: str) -> None:
    """A new logbook file carries a version row naming the newest schema."""
    book = Logbook(path)
    try:
        assert book.schema_version == len(MIGRATIONS)
    finally:
        book.close()
    assert stored_version(path) == str(len(MIGRATIONS))


def test_a_logbook_from_before_versions_is_upgraded_and_keeps_its_chain(path: str) -> None:
    """A logbook made before versions were recorded opens as version 1, upgraded in place."""
    conn = sqlite3.connect(path, isolation_level=None)
    prev = GENESIS
    try:
        conn.execute(UNVERSIONED_DDL)
        for n in range(1, 4):
            body = {"n": n}
            at = 1_900_000_000.0 + n
            digest = entry_hash(prev, "test.old", f"old/{n}", body, at)
            conn.execute(
                "INSERT INTO logbook (entry_key, kind, body, at, prev_hash, hash) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (f"old/{n}", "test.old", f'{{"n":{n}}}', at, prev, digest))
            prev = digest
    finally:
        conn.close()

    book = Logbook(path)
    try:
        assert book.schema_version == len(MIGRATIONS)
        assert [e["key"] for e in book.entries()] == ["old/1", "old/2", "old/3"]
        assert book.verify() is True
        assert book.append("test.new", "new/4", {"n": 4})
        [newest] = [e for e in book.entries() if e["seq"] == 4]
        assert newest["prev_hash"] == prev
        assert book.first_broken() is None
    finally:
        book.close()
    assert stored_version(path) == str(len(MIGRATIONS))


def test_a_logbook_from_a_newer_marque_is_refused(path: str) -> None:
    """A logbook whose schema is newer than this code is refused (exit 7), left untouched."""
    Logbook(path).close()
    newer = str(len(MIGRATIONS) + 1)
    tamper(path, f"UPDATE logbook_meta SET value = '{newer}' WHERE key = 'schema_version'")
    with pytest.raises(HarbourUnavailable) as refused:
        Logbook(path)
    assert refused.value.exit_status == 7
    assert refused.value.detail["schema_version"] == len(MIGRATIONS) + 1
    assert "newer" in refused.value.message
    assert stored_version(path) == newer


def test_a_file_that_is_not_a_logbook_is_a_typed_error(path: str) -> None:
    """A garbage logbook file is harbour_unavailable naming SQLITE_NOTADB, not a traceback."""
    Path(path).write_bytes(b"this is not a database at all, just text " * 100)
    with pytest.raises(HarbourUnavailable) as refused:
        Logbook(path)
    assert refused.value.code == "harbour_unavailable"
    assert refused.value.detail["sqlite_errorname"] == "SQLITE_NOTADB"
    assert "Error" not in refused.value.message  # no Python class names for an operator


def test_an_up_to_date_logbook_opens_while_another_writer_holds_it(
    logbook: Logbook, path: str
) -> None:
    """Opening an up-to-date logbook takes no write lock: it opens under a held writer."""
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        second = Logbook(path, busy_timeout_ms=100)
        try:
            assert len(second.entries()) == ENTRIES
            with pytest.raises(HarbourUnavailable) as busy:
                second.append("test.blocked", "key/blocked", {})
            assert busy.value.detail["sqlite_errorname"] == "SQLITE_BUSY"
        finally:
            second.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# -- the outbox, when the logbook cannot be written ------------------------------------------


def test_outbox_is_retried_while_the_logbook_is_locked_and_reported_once(env: Env) -> None:
    """A report the locked logbook refused stays in the outbox; once free, it lands once."""
    pilot = env.pilot
    logbook_path = str(env.home / "logbook.sqlite3")
    assert pilot.logbook is not None
    pilot.logbook.close()
    pilot.logbook = Logbook(logbook_path, busy_timeout_ms=200)
    token = env.issue([DEBIT_1])

    holder = sqlite3.connect(logbook_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding on
        outcome = env.run(token, "n-1")
        assert outcome.status == "applied"  # the execution does not wait for the logbook
        assert "reported" not in [e["event"] for e in env.events]
        assert pilot.ledger.stats(time.time())["unreported_outcomes"] == 1
        assert pilot.report() is False  # retried: still refused
        [pending] = pilot.ledger.outbox_pending()
        assert (pending.nonce, pending.status, pending.tries) == ("n-1", "applied", 2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert pilot.logbook.entries("execution.") == []
    assert pilot.report() is True
    assert pilot.ledger.stats(time.time())["unreported_outcomes"] == 0
    assert pilot.report() is True  # nothing left: a second round adds nothing
    [entry] = pilot.logbook.entries("execution.")
    assert entry["kind"] == "execution.applied"
    assert (entry["body"]["nonce"], entry["body"]["attempt"]) == ("n-1", 1)
    assert pilot.logbook.verify() is True
    assert env.balances()[1] == 90
