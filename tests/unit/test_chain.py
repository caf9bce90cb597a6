"""The logbook's hash chain over plain dicts: every tampering is named by the right ``seq``.

These are the rows a store reads (``ORDER BY seq``), tampered with the way an
intruder with write access to the table would: an edited column, a deleted
row, two rows' ``seq`` exchanged, a forged first entry, a tail cut off or
rewritten with every hash recomputed (only a saved head catches the last two).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marque.errors import InvalidInput
from marque.logbook.chain import (
    ENTRY_FIELDS,
    GENESIS,
    BreakKind,
    ChainBreak,
    check_head,
    entry_hash,
    verify_against_head,
    verify_entries,
)

ENTRIES = 8

# -- a pinned vector ---------------------------------------------------------------------

VECTOR_ENTRY = {"seq": 1, "at": 1900000000.5, "kind": "request.created", "actor": "alice",
                "subject": "rq_1", "body": {"note": "naïve ✓", "n": 1}, "prev_hash": GENESIS}
# prev_hash as hex text, then the JCS of the seven fields (keys sorted, UTF-8 literal).
VECTOR_PREIMAGE = GENESIS.encode() + (
    b'{"actor":"alice","at":1900000000.5,"body":{"n":1,"note":"na\xc3\xafve \xe2\x9c\x93"},'
    b'"kind":"request.created","prev_hash":"' + GENESIS.encode() + b'","seq":1,'
    b'"subject":"rq_1"}'
)
VECTOR_HASH = "3da37be82c6e3b7744fbc73d5516ac5396167e59a18dae881bab70f236c17f38"


def test_entry_hash_vector() -> None:
    """An entry's hash is sha256(prev_hash hex ‖ JCS of its seven fields), pinned."""
    assert hashlib.sha256(VECTOR_PREIMAGE).hexdigest() == VECTOR_HASH
    assert entry_hash(VECTOR_ENTRY) == VECTOR_HASH
    assert entry_hash({**VECTOR_ENTRY, "hash": "f" * 64}) == VECTOR_HASH  # hash is not covered


@pytest.mark.parametrize("field", ENTRY_FIELDS)
def test_entry_hash_covers_every_field(field: str) -> None:
    """Changing any one of the seven fields moves the hash."""
    changed = {**VECTOR_ENTRY, field: {"seq": 2, "at": 1900000000.25, "kind": "request.other",
                                       "actor": "bob", "subject": None,
                                       "body": {"n": 2, "note": "naïve ✓"},
                                       "prev_hash": "1" * 64}[field]}
    assert entry_hash(changed) != VECTOR_HASH


# -- building and tampering ------------------------------------------------------------------


def build(count: int = ENTRIES) -> list[dict[str, Any]]:
    """A valid chain of ``count`` entries, as a store would read it."""
    entries: list[dict[str, Any]] = []
    prev = GENESIS
    for seq in range(1, count + 1):
        entry: dict[str, Any] = {
            "seq": seq, "at": 1_900_000_000 + seq, "kind": f"request.step{seq % 3}",
            "actor": "alice" if seq % 2 else "bob", "subject": f"rq_{seq % 4}" if seq % 5 else None,
            "body": {"n": seq, "text": f"entry {seq}"}, "prev_hash": prev}
        entry["hash"] = entry_hash(entry)
        prev = entry["hash"]
        entries.append(entry)
    return entries


def rehash_from(entries: list[dict[str, Any]], index: int) -> None:
    """Recompute every hash from ``entries[index]`` on, as a forger covering an edit would."""
    for i in range(index, len(entries)):
        entries[i]["prev_hash"] = GENESIS if i == 0 else entries[i - 1]["hash"]
        entries[i]["hash"] = entry_hash(entries[i])


def by_seq(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: e["seq"])


def test_an_untouched_chain_verifies() -> None:
    """An intact chain, an empty one and a one-entry one all verify."""
    assert verify_entries(build()) is None
    assert verify_entries([]) is None
    assert verify_entries(build(1)) is None
    assert verify_entries(iter(build())) is None  # a cursor, consumed once


@pytest.mark.parametrize("seq", [1, 4, ENTRIES])
def test_an_edited_body_is_named(seq: int) -> None:
    """A body edited in place is named by its own seq, as an edit."""
    entries = build()
    entries[seq - 1]["body"]["text"] = "rewritten"
    found = verify_entries(entries)
    assert isinstance(found, ChainBreak)
    assert (found.seq, found.kind) == (seq, BreakKind.EDITED)
    assert f"entry {seq} was edited" in found.reason


@pytest.mark.parametrize(("field", "value"), [
    ("at", 1_900_000_999), ("kind", "request.other"), ("actor", "mallory"),
    ("subject", "rq_other"), ("subject", None), ("hash", "f" * 64),
])
def test_any_edited_field_is_named(field: str, value: Any) -> None:
    """Every covered field, and the hash itself, edited at entry 3: entry 3 is named."""
    entries = build()
    if entries[2][field] == value:
        value = "rq_changed"
    entries[2][field] = value
    found = verify_entries(entries)
    assert found is not None and (found.seq, found.kind) == (3, BreakKind.EDITED)


def test_an_edited_and_rehashed_entry_is_named_at_the_next() -> None:
    """Entry 3 edited and its own hash recomputed: entry 4 no longer follows it."""
    entries = build()
    entries[2]["body"]["text"] = "rewritten"
    entries[2]["hash"] = entry_hash(entries[2])
    found = verify_entries(entries)
    assert found is not None and (found.seq, found.kind) == (4, BreakKind.UNLINKED)


@pytest.mark.parametrize("seq", [1, 3, ENTRIES - 1])
def test_a_deleted_entry_is_named_by_its_seq(seq: int) -> None:
    """A deleted entry leaves a gap: the missing seq is named."""
    entries = build()
    del entries[seq - 1]
    found = verify_entries(entries)
    assert found is not None and (found.seq, found.kind) == (seq, BreakKind.MISSING)


def test_a_deletion_hidden_by_renumbering_is_named() -> None:
    """Entry 3 deleted and the rest renumbered down: seq 3 now holds entry 4, and is named."""
    entries = build()
    del entries[2]
    for entry in entries[2:]:
        entry["seq"] -= 1
    found = verify_entries(entries)
    assert found is not None and found.seq == 3


def test_a_deletion_renumbered_and_rehashed_is_caught_only_by_a_head() -> None:
    """A forger who renumbers and re-hashes everything after a deletion leaves a chain that
    holds by itself; the saved head names where it no longer reaches."""
    original = build()
    head = {"seq": ENTRIES, "hash": original[-1]["hash"], "at": original[-1]["at"]}
    entries = copy.deepcopy(original)
    del entries[2]
    for entry in entries[2:]:
        entry["seq"] -= 1
    rehash_from(entries, 2)
    assert verify_entries(entries) is None
    found = verify_against_head(entries, head)
    assert found is not None and (found.seq, found.kind) == (ENTRIES, BreakKind.TRUNCATED)


def test_swapped_entries_are_named_by_the_first() -> None:
    """Entries 2 and 5 exchange their seq (a store reads them back in seq order): 2 is named."""
    entries = build()
    entries[1]["seq"], entries[4]["seq"] = 5, 2
    found = verify_entries(by_seq(entries))
    assert found is not None and found.seq == 2


def test_entries_given_out_of_order_are_named() -> None:
    """Entries handed over in the wrong order: the first position holding the wrong one."""
    entries = build()
    entries[2], entries[5] = entries[5], entries[2]
    found = verify_entries(entries)
    assert found is not None and found.seq == 3


def test_a_duplicated_entry_is_named() -> None:
    """The same entry twice: the seq after it is named, as out of order."""
    entries = build()
    entries.insert(3, copy.deepcopy(entries[2]))
    found = verify_entries(entries)
    assert found is not None and (found.seq, found.kind) == (4, BreakKind.OUT_OF_ORDER)


def test_a_forged_genesis_is_named() -> None:
    """A first entry that does not chain onto the genesis hash (even re-hashed) is entry 1."""
    entries = build()
    entries[0]["prev_hash"] = "1" * 64
    entries[0]["hash"] = entry_hash(entries[0])
    entries[1]["prev_hash"] = entries[0]["hash"]
    rehash_from(entries, 1)
    found = verify_entries(entries)
    assert found is not None and (found.seq, found.kind) == (1, BreakKind.GENESIS)


def test_a_replaced_first_entry_is_caught_at_the_second() -> None:
    """A new entry 1 forged onto genesis hashes right, but entry 2 no longer follows it."""
    entries = build()
    entries[0]["body"] = {"n": 1, "text": "forged"}
    entries[0]["hash"] = entry_hash(entries[0])
    found = verify_entries(entries)
    assert found is not None and found.seq == 2


@pytest.mark.parametrize(("field", "value"), [
    ("seq", "3"), ("seq", True), ("at", None), ("at", True), ("kind", ""), ("kind", 7),
    ("actor", None), ("subject", 5), ("body", [1]), ("body", "text"), ("prev_hash", None),
    ("hash", None), ("body", {"x": float("nan")}),
])
def test_a_malformed_entry_is_named(field: str, value: Any) -> None:
    """A field missing its type at entry 3: entry 3 is named, nothing raises."""
    entries = build()
    entries[2][field] = value
    found = verify_entries(entries)
    assert found is not None and found.seq == 3


@pytest.mark.parametrize("field", [*ENTRY_FIELDS, "hash"])
def test_an_entry_missing_a_field_is_named(field: str) -> None:
    """An entry without one of its fields is named, not a KeyError."""
    entries = build()
    del entries[2][field]
    found = verify_entries(entries)
    assert found is not None and found.seq == 3


def test_a_break_after_appends_is_still_named() -> None:
    """Entries appended onto a tampered chain do not hide the first break."""
    entries = build()
    entries[1]["kind"] = "request.other"
    longer = build(ENTRIES + 3)
    entries += longer[ENTRIES:]
    found = verify_entries(entries)
    assert found is not None and found.seq == 2


def test_verification_continues_from_a_verified_point() -> None:
    """Page by page from a verified {seq, hash} gives the same answers as the whole."""
    entries = build()
    middle = {"seq": 4, "hash": entries[3]["hash"]}
    assert verify_entries(entries[4:], after=middle) is None
    entries[6]["body"]["n"] = 0
    found = verify_entries(entries[4:], after=middle)
    assert found is not None and found.seq == 7
    found = verify_entries(build()[4:], after={"seq": 4, "hash": "e" * 64})
    assert found is not None and (found.seq, found.kind) == (5, BreakKind.UNLINKED)


# -- against a saved head ----------------------------------------------------------------------


def saved_head(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"seq": entries[-1]["seq"], "hash": entries[-1]["hash"], "at": entries[-1]["at"]}


def test_a_chain_that_reaches_its_head_verifies() -> None:
    """The chain as it was when the head was saved, or grown since, verifies against it."""
    entries = build()
    head = saved_head(entries)
    assert verify_against_head(entries, head) is None
    assert verify_against_head(build(ENTRIES + 4), head) is None
    assert verify_against_head([], {"seq": 0, "hash": GENESIS, "at": 0}) is None


@pytest.mark.parametrize("kept", [0, 1, ENTRIES - 3, ENTRIES - 1])
def test_a_truncated_tail_is_named_by_its_first_missing_seq(kept: int) -> None:
    """A tail cut off verifies alone; against the head its first missing seq is named."""
    entries = build()
    head = saved_head(entries)
    cut = entries[:kept]
    assert verify_entries(cut) is None
    found = verify_against_head(cut, head)
    assert found is not None and (found.seq, found.kind) == (kept + 1, BreakKind.TRUNCATED)


@pytest.mark.parametrize("first_rewritten", [1, 4, ENTRIES])
def test_a_rewritten_tail_is_named_at_the_head(first_rewritten: int) -> None:
    """A tail rewritten with every hash recomputed verifies alone; the head names its seq."""
    entries = build()
    head = saved_head(entries)
    entries[first_rewritten - 1]["body"]["text"] = "rewritten"
    rehash_from(entries, first_rewritten - 1)
    assert verify_entries(entries) is None
    found = verify_against_head(entries, head)
    assert found is not None and (found.seq, found.kind) == (ENTRIES, BreakKind.REWRITTEN)


def test_a_rewritten_and_extended_tail_is_named_at_the_head() -> None:
    """Rewritten, then grown past the head: still named at the head's seq."""
    entries = build(ENTRIES + 3)
    head = saved_head(entries[:ENTRIES])
    entries[2]["actor"] = "mallory"
    rehash_from(entries, 2)
    found = verify_against_head(entries, head)
    assert found is not None and (found.seq, found.kind) == (ENTRIES, BreakKind.REWRITTEN)


def test_an_earlier_break_wins_over_the_head() -> None:
    """An edit before the head's seq is named where it is, not at the head."""
    entries = build()
    head = saved_head(entries)
    entries[1]["body"]["n"] = 0
    found = verify_against_head(entries[:5], head)
    assert found is not None and (found.seq, found.kind) == (2, BreakKind.EDITED)


@pytest.mark.parametrize("head", [
    None, [], {"seq": -1, "hash": GENESIS}, {"seq": "3", "hash": GENESIS},
    {"seq": 3, "hash": "XYZ"}, {"seq": 3, "hash": "A" * 64}, {"seq": 0, "hash": "1" * 64},
    {"seq": 3, "hash": GENESIS, "at": True},
])
def test_a_malformed_head_is_refused(head: Any) -> None:
    """A head that is not {seq, hash, at} is input_invalid, not a verdict on the chain."""
    with pytest.raises(InvalidInput):
        verify_against_head(build(), head)
    with pytest.raises(InvalidInput):
        check_head(head)


def test_a_break_reads_as_json() -> None:
    """A break serialises as {seq, kind, reason}."""
    entries = build()
    del entries[4]
    found = verify_entries(entries)
    assert found is not None
    assert found.to_dict() == {"seq": 5, "kind": "missing", "reason": found.reason}
    assert "5" in found.reason


# -- any single edit, anywhere ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 12), data=st.data())
def test_any_single_edit_is_named_where_it_is(count: int, data: st.DataObject) -> None:
    """Whatever entry gets whatever new body, that entry's seq is the one named."""
    entries = build(count)
    seq = data.draw(st.integers(1, count))
    body = data.draw(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                     max_size=3))
    if body == entries[seq - 1]["body"]:
        body = {"changed": True}
    entries[seq - 1]["body"] = body
    found = verify_entries(entries)
    assert found is not None and found.seq == seq
