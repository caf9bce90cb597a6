"""A logbook entry whose stored body is no longer JSON (found by the soak's row 12).

A flipped byte in the body column used to make every read of the logbook
raise a raw ``JSONDecodeError``, so ``logbook verify`` crashed instead of
naming the entry. Now the entry is read back as ``{"unreadable_body": text}``
and verification names its ``seq``, on both engines.
"""

from __future__ import annotations

from harbour_store.conftest import all_entries, raw_tx
from marque.harbour.store.base import HarbourStore
from marque.logbook.chain import BreakKind, verify_entries


def test_a_body_that_is_no_longer_json_is_named_by_its_seq(store: HarbourStore) -> None:
    """Verification names the entry whose body text was damaged; the read does not raise."""
    for i in range(5):
        store.append("finding.test", "alice", f"rq_{i}", {"i": i, "note": "x"})
    with raw_tx(store) as tx:
        tx.execute("UPDATE logbook SET body = ? WHERE seq = ?", ('{"i": 3,, "note"', 3))
    entries = all_entries(store)
    assert entries[2].body == {"unreadable_body": '{"i": 3,, "note"'}
    found = verify_entries(e.to_dict() for e in entries)
    assert found is not None and found.seq == 3 and found.kind is BreakKind.EDITED
