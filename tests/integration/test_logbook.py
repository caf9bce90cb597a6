"""The Pilot's embedded logbook on real SQLite files: its chain says no, and where; it is the
Harbourmaster's chain format; its schema is versioned and files of schema 1 still verify;
reports it could not take are delivered later, once.

Tampering is done the way an intruder or a careless operator would: with plain
:mod:`sqlite3` on the file, behind the logbook's back. Unavailability is a
real write lock held by another connection.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marque.cid import canonicalize
from marque.errors import HarbourUnavailable, InvalidInput
from marque.logbook import chain
from marque.logbook.chain import BreakKind, verify_against_head, verify_entries
from marque.logbook.embedded import GENESIS, KEY_MEMBER, MIGRATIONS, Logbook
from marque.logbook.heads import sign_head, verify_head
from marque.token import TrustedKeys, new_key

from .conftest import PILOT_ID, Env, marque_id_of

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


def stored_rows(path: str) -> list[dict[str, Any]]:
    """The rows as the file holds them, read with plain sqlite3: chain entries as stored."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT seq, at, kind, actor, subject, body, prev_hash, hash "
                            "FROM logbook ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [{"seq": r[0], "at": r[1], "kind": r[2], "actor": r[3], "subject": r[4],
             "body": json.loads(r[5]), "prev_hash": r[6], "hash": r[7]} for r in rows]


def raw_table(path: str) -> list[tuple[Any, ...]]:
    """Every schema-1 column of every row, exactly as stored."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT seq, entry_key, kind, body, at, prev_hash, hash "
                            "FROM logbook ORDER BY seq").fetchall()
    finally:
        conn.close()


def forge(path: str, seq: int, **changes: Any) -> None:
    """Rewrite entry ``seq`` with ``changes`` and a correct hash, as a forger who knows the
    chain format would (the entry's own hash recomputed; later entries left alone)."""
    [entry] = [e for e in stored_rows(path) if e["seq"] == seq]
    entry.update(changes)
    entry["hash"] = chain.entry_hash(entry)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE logbook SET at = ?, kind = ?, actor = ?, subject = ?, body = ?, "
                     "prev_hash = ?, hash = ? WHERE seq = ?",
                     (entry["at"], entry["kind"], entry["actor"], entry["subject"],
                      canonicalize(entry["body"]).decode(), entry["prev_hash"], entry["hash"],
                      seq))
    finally:
        conn.close()


def forge_tail(path: str, first: int, **changes: Any) -> None:
    """Rewrite entry ``first`` with ``changes`` and re-chain every entry after it."""
    forge(path, first, **changes)
    prev = [e for e in stored_rows(path) if e["seq"] == first][0]["hash"]
    for entry in stored_rows(path):
        if entry["seq"] > first:
            forge(path, entry["seq"], prev_hash=prev)
            prev = [e for e in stored_rows(path) if e["seq"] == entry["seq"]][0]["hash"]


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
    [third] = [e for e in stored_rows(path) if e["seq"] == 3]
    forge(path, 3, body={**third["body"], "text": "rewritten"})
    assert logbook.first_broken() == 4
    assert logbook.verify() is False
    found = logbook.check()
    assert found is not None and found.kind is BreakKind.UNLINKED


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


def test_a_key_edited_to_swallow_a_later_report_is_caught(logbook: Logbook, path: str) -> None:
    """The dedup key is hashed: an entry's key edited to one still to come suppresses that
    append (the UNIQUE key says it is there), but the edit itself is named."""
    tamper(path, "UPDATE logbook SET entry_key = 'outcome/future' WHERE seq = 3")
    assert logbook.append("execution.applied", "outcome/future", {"n": 99}) is False
    assert logbook.first_broken() == 3


def test_the_key_inside_the_body_is_covered(logbook: Logbook, path: str) -> None:
    """The key's hashed copy in the body, rewritten to match an edited key column and
    re-hashed, is caught at the next entry, as any re-hashed edit is."""
    [third] = [e for e in stored_rows(path) if e["seq"] == 3]
    tamper(path, "UPDATE logbook SET entry_key = 'outcome/future' WHERE seq = 3")
    forge(path, 3, body={**third["body"], KEY_MEMBER: "outcome/future"})
    assert logbook.first_broken() == 4


# -- one chain format: the Harbourmaster's -------------------------------------------------


def test_the_file_holds_the_shared_chain_format(logbook: Logbook, path: str) -> None:
    """Rows read with plain sqlite3 are chain entries: chain.verify_entries accepts them."""
    rows = stored_rows(path)
    assert [e["seq"] for e in rows] == list(range(1, ENTRIES + 1))
    assert rows[0]["prev_hash"] == GENESIS
    for row in rows:
        assert row["hash"] == chain.entry_hash(row)
        assert row["body"][KEY_MEMBER] == f"key/{row['seq']}"
    assert verify_entries(rows) is None


@pytest.mark.parametrize(
    ("edit", "seq"),
    [
        ("UPDATE logbook SET body = '{\"logbook_key\":\"key/3\",\"n\":3}' WHERE seq = 3", 3),
        ("DELETE FROM logbook WHERE seq = 4", 4),
        ("UPDATE logbook SET seq = -2 WHERE seq = 2; UPDATE logbook SET seq = 2 WHERE seq = 5; "
         "UPDATE logbook SET seq = 5 WHERE seq = -2", 2),
    ],
    ids=["edited-body", "deleted", "swapped"],
)
def test_the_file_and_the_shared_verifier_agree(
    logbook: Logbook, path: str, edit: str, seq: int
) -> None:
    """An edited body, a deleted entry, a swapped pair: the embedded check and
    chain.verify_entries over the raw rows name the same seq."""
    tamper(path, *edit.split("; "))
    found = logbook.check()
    shared = verify_entries(stored_rows(path))
    assert found is not None and shared is not None
    assert found.seq == shared.seq == seq


def test_entries_name_their_actor_and_subject(path: str) -> None:
    """actor is the Pilot named in the body (else the logbook's actor); subject the marque."""
    book = Logbook(path, actor="pilot-7")
    try:
        book.append("execution.applied", "k/1", {"marque_id": "mq_1", "pilot": {"id": "p-9"}})
        book.append("preview.run", "k/2", {"jti": "j", "pilot": {"id": "p-9"}})
        book.append("finding.other", "k/3", {"note": "no pilot, no marque"})
        assert [(e["actor"], e["subject"]) for e in book.entries()] == [
            ("p-9", "mq_1"), ("p-9", None), ("pilot-7", None)]
        assert book.entries()[0]["body"] == {"marque_id": "mq_1", "pilot": {"id": "p-9"}}
        assert book.verify() is True
    finally:
        book.close()
    with pytest.raises(InvalidInput):
        Logbook(path, actor="")


def test_a_body_using_the_reserved_key_member_is_refused(logbook: Logbook) -> None:
    """A body may not carry logbook_key itself: refused, and nothing of the batch appended."""
    with pytest.raises(InvalidInput):
        logbook.append_all([("test.ok", "key/ok", {"n": 1}),
                            ("test.bad", "key/bad", {KEY_MEMBER: "key/other"})])
    assert len(logbook.entries()) == ENTRIES
    assert logbook.verify() is True


def test_appends_are_idempotent_on_their_key(logbook: Logbook) -> None:
    """The same key twice (in one batch or two) lands once; the chain stays whole."""
    assert logbook.append("test.again", "key/3", {"n": 3}) is False
    assert logbook.append_all([("test.x", "key/x", {}), ("test.x", "key/x", {}),
                               ("test.y", "key/y", {})]) == 2
    assert [e["key"] for e in logbook.entries()][-2:] == ["key/x", "key/y"]
    assert logbook.check() is None


def test_entries_filter_by_an_exact_kind_prefix(logbook: Logbook) -> None:
    """A kind prefix matches literally: case counts, and '_' or '%' are not wildcards."""
    assert [e["seq"] for e in logbook.entries("test.entry1")] == [1, 3, 5]
    assert logbook.entries("TEST.") == []
    assert logbook.entries("test_") == []
    assert logbook.entries("%") == []
    assert len(logbook.entries("")) == ENTRIES


# -- against a saved head -------------------------------------------------------------------


def test_the_head_is_the_last_entry(logbook: Logbook, path: str) -> None:
    """head() is {seq, hash, at} of the last entry; an empty logbook's is seq 0 on genesis."""
    last = stored_rows(path)[-1]
    assert logbook.head() == {"seq": ENTRIES, "hash": last["hash"], "at": last["at"]}
    empty = Logbook(str(Path(path).with_name("empty.sqlite3")))
    try:
        assert empty.head() == {"seq": 0, "hash": GENESIS, "at": None}
        assert empty.check(head={"seq": 0, "hash": GENESIS}) is None
    finally:
        empty.close()


@pytest.mark.parametrize("kept", [0, 2, ENTRIES - 1])
def test_a_truncated_tail_is_named_with_a_saved_head(
    logbook: Logbook, path: str, kept: int
) -> None:
    """Entries cut from the end: alone the chain holds; the saved head names the first missing."""
    head = logbook.head()
    tamper(path, f"DELETE FROM logbook WHERE seq > {kept}")
    assert logbook.check() is None
    found = logbook.check(head=head)
    assert found is not None and (found.seq, found.kind) == (kept + 1, BreakKind.TRUNCATED)
    assert verify_against_head(stored_rows(path), head) == found


def test_a_rewritten_tail_is_named_with_a_saved_head(logbook: Logbook, path: str) -> None:
    """Entries 4.. rewritten with every hash recomputed: alone the chain holds; the saved head
    names its own seq, where the chain no longer has its hash."""
    head = logbook.head()
    forge_tail(path, 4, body={"n": 4, "text": "rewritten", KEY_MEMBER: "key/4"})
    assert logbook.check() is None
    found = logbook.check(head=head)
    assert found is not None and (found.seq, found.kind) == (ENTRIES, BreakKind.REWRITTEN)
    assert verify_against_head(stored_rows(path), head) == found


def test_a_chain_grown_past_its_saved_head_verifies(logbook: Logbook) -> None:
    """Appends after the head was saved are no break."""
    head = logbook.head()
    assert logbook.append("test.later", "key/later", {"n": 99})
    assert logbook.check(head=head) is None


def test_a_signed_head_catches_a_truncation(logbook: Logbook, path: str) -> None:
    """The head signed by the issuer, saved, verified back and checked against: the cut
    tail is named; a head forged to match the cut chain is refused before it is used."""
    issuer = new_key()
    trusted = TrustedKeys([issuer])
    saved = sign_head(logbook.head(), issuer)
    tamper(path, "DELETE FROM logbook WHERE seq > 3")
    found = logbook.check(head=verify_head(saved, trusted))
    assert found is not None and (found.seq, found.kind) == (4, BreakKind.TRUNCATED)
    forged = sign_head(logbook.head(), new_key())
    with pytest.raises(InvalidInput):
        verify_head(forged, trusted)


# -- versioned schema ---------------------------------------------------------------------


def test_a_new_logbook_records_the_newest_schema_version(path: str) -> None:
    """A new logbook file carries a version row naming the newest schema."""
    book = Logbook(path)
    try:
        assert book.schema_version == len(MIGRATIONS)
    finally:
        book.close()
    assert stored_version(path) == str(len(MIGRATIONS))


def legacy_hash(prev: str, kind: str, key: str, body: dict[str, Any], at: float) -> str:
    """Schema 1's entry hash, written out here: sha256 of the JCS of {prev, kind, key, body, at}."""
    preimage = canonicalize({"prev": prev, "kind": kind, "key": key, "body": body, "at": at})
    return hashlib.sha256(preimage).hexdigest()


def write_schema_1(path: str, count: int, *, recorded: bool) -> str:
    """A logbook file as schema 1 wrote it, ``count`` entries; returns the last hash.

    ``recorded``: with a ``logbook_meta`` row saying version 1 (as a versioned
    schema-1 Marque left it), or without one (before versions were recorded).
    """
    conn = sqlite3.connect(path, isolation_level=None)
    prev = GENESIS
    try:
        conn.execute(UNVERSIONED_DDL)
        if recorded:
            conn.execute("CREATE TABLE logbook_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("INSERT INTO logbook_meta VALUES ('schema_version', '1')")
        for n in range(1, count + 1):
            body = {"n": n, "marque_id": f"mq_{n}"}
            at = 1_900_000_000.0 + n + 0.125
            digest = legacy_hash(prev, "test.old", f"old/{n}", body, at)
            conn.execute(
                "INSERT INTO logbook (entry_key, kind, body, at, prev_hash, hash) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (f"old/{n}", "test.old", canonicalize(body).decode(), at, prev, digest))
            prev = digest
    finally:
        conn.close()
    return prev


@pytest.mark.parametrize("recorded", [False, True], ids=["unversioned", "version-1"])
def test_a_schema_1_logbook_is_upgraded_and_keeps_its_chain(path: str, recorded: bool) -> None:
    """A schema-1 file opens, migrates without rewriting a row, verifies, and new entries
    chain onto its last hash in the shared format."""
    last = write_schema_1(path, 3, recorded=recorded)
    before = raw_table(path)

    book = Logbook(path)
    try:
        assert book.schema_version == len(MIGRATIONS)
        assert raw_table(path) == before  # no row's hash, body or anything else rewritten
        assert [e["key"] for e in book.entries()] == ["old/1", "old/2", "old/3"]
        assert [(e["actor"], e["subject"]) for e in book.entries()] == [(None, None)] * 3
        assert book.verify() is True
        assert book.append("test.new", "new/4", {"n": 4, "marque_id": "mq_4"})
        assert book.append("test.new", "new/5", {"n": 5})
        [fourth, fifth] = [e for e in book.entries() if e["seq"] > 3]
        assert fourth["prev_hash"] == last
        assert (fourth["actor"], fourth["subject"]) == ("pilot", "mq_4")
        assert fourth["hash"] == chain.entry_hash({**stored_rows(path)[3]})
        assert book.check() is None
        assert book.check(head=book.head()) is None
    finally:
        book.close()
    assert stored_version(path) == str(len(MIGRATIONS))
    assert raw_table(path)[:3] == before
    # A second open is a no-op: nothing migrates twice.
    Logbook(path).close()
    assert raw_table(path)[:3] == before


@pytest.fixture
def mixed(path: str) -> Iterator[Logbook]:
    """A schema-1 file of entries 1-3, migrated, then entries 4-6 in the shared format."""
    write_schema_1(path, 3, recorded=False)
    book = Logbook(path)
    for n in range(4, 7):
        assert book.append("test.new", f"new/{n}", {"n": n})
    try:
        yield book
    finally:
        book.close()


@pytest.mark.parametrize(
    ("edit", "seq"),
    [
        ("UPDATE logbook SET body = '{\"marque_id\":\"mq_2\",\"n\":22}' WHERE seq = 2", 2),
        ("UPDATE logbook SET entry_key = 'old/22' WHERE seq = 2", 2),
        ("DELETE FROM logbook WHERE seq = 3", 3),
        ("UPDATE logbook SET at = at + 1 WHERE seq = 5", 5),
        ("UPDATE logbook SET actor = 'mallory' WHERE seq = 4", 4),
        ("UPDATE logbook SET subject = 'mq_x' WHERE seq = 6", 6),
        ("UPDATE logbook SET chain_format = 1 WHERE seq = 5", 5),  # downgraded to the old hash
        ("UPDATE logbook SET chain_format = 2 WHERE seq = 2", 2),
        ("UPDATE logbook SET chain_format = 3 WHERE seq = 4", 4),
        ("DELETE FROM logbook WHERE seq = 4", 4),  # the seam between the formats
    ],
    ids=["v1-body", "v1-key", "v1-delete", "v2-at", "v2-actor", "v2-subject", "v2-as-v1",
         "v1-as-v2", "unknown-format", "seam-delete"],
)
def test_tampering_on_either_side_of_the_migration_is_named(
    mixed: Logbook, path: str, edit: str, seq: int
) -> None:
    """In a file holding both formats, an edit or removal is named by its seq on either side."""
    assert mixed.check() is None
    tamper(path, edit)
    assert mixed.first_broken() == seq


def test_entries_swapped_across_the_migration_are_named(mixed: Logbook, path: str) -> None:
    """An old entry and a new one exchange places: the first moved seq is named."""
    tamper(path, "UPDATE logbook SET seq = -2 WHERE seq = 2",
           "UPDATE logbook SET seq = 2 WHERE seq = 5",
           "UPDATE logbook SET seq = 5 WHERE seq = -2")
    assert mixed.first_broken() == 2


def test_an_old_entry_after_new_ones_is_a_break(mixed: Logbook, path: str) -> None:
    """A schema-1 entry forged (with a correct legacy hash) after shared-format ones is named:
    the old format is never written again."""
    [sixth] = [e for e in stored_rows(path) if e["seq"] == 6]
    body = {"n": 7}
    digest = legacy_hash(sixth["hash"], "test.old", "old/7", body, 1_900_000_100.0)
    tamper(path, "INSERT INTO logbook (seq, entry_key, kind, body, at, prev_hash, hash) "
                 f"VALUES (7, 'old/7', 'test.old', '{{\"n\":7}}', 1900000100.0, "
                 f"'{sixth['hash']}', '{digest}')")
    found = mixed.check()
    assert found is not None and (found.seq, found.kind) == (7, BreakKind.MALFORMED)


def test_a_truncation_into_the_old_entries_is_named_with_a_head(mixed: Logbook, path: str) -> None:
    """Cut back to entry 2: alone it verifies; with the saved head entry 3 is named."""
    head = mixed.head()
    tamper(path, "DELETE FROM logbook WHERE seq > 2")
    assert mixed.check() is None
    found = mixed.check(head=head)
    assert found is not None and (found.seq, found.kind) == (3, BreakKind.TRUNCATED)


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
    # The Pilot is the actor, the marque the subject: as the Harbourmaster's logbook names them.
    assert (entry["actor"], entry["subject"]) == (PILOT_ID, marque_id_of(token))
    assert pilot.logbook.verify() is True
    assert env.balances()[1] == 90
