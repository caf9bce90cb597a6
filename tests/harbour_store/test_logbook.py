"""The store's logbook: one hash chain, paged reads, a head that tracks it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from marque.harbour.store.base import HarbourStore
from marque.logbook.chain import GENESIS, entry_hash, verify_entries

from .conftest import T0, StorePool, all_entries, assert_chain_verifies, make_draft, raw_tx


def test_an_empty_logbook_has_the_genesis_head(store: HarbourStore) -> None:
    """Before any entry the head is seq 0 with the genesis hash."""
    assert store.logbook_head() == {"seq": 0, "hash": GENESIS, "at": None}
    assert store.logbook_entries() == []


def test_append_chains_entries_and_moves_the_head(store: HarbourStore) -> None:
    """Each entry's prev_hash is the one before; hashes recompute with entry_hash."""
    first = store.append("finding.test", "root", "s1", {"n": 1, "text": "é ✓"}, now=T0)
    second = store.append("finding.test", "root", "s2", {"n": 2.5, "list": [1, None]},
                          now=T0 + 0.25)
    assert (first.seq, first.prev_hash) == (1, GENESIS)
    assert (second.seq, second.prev_hash) == (2, first.hash)
    assert entry_hash(second.to_dict()) == second.hash
    assert store.logbook_head() == {"seq": 2, "hash": second.hash, "at": T0 + 0.25}
    assert all_entries(store) == [first, second]


def test_entries_page_and_filter_by_kind(store: HarbourStore) -> None:
    """after/limit page through entries; kind_prefix filters exactly (case and '_')."""
    for n in range(5):
        store.append("finding.x" if n % 2 else "request.preparing", "a", f"s{n}", {"n": n},
                     now=T0 + n)
    store.append("FINDING.upper", "a", "s", {}, now=T0 + 9)
    assert [e.seq for e in store.logbook_entries(after=1, limit=2)] == [2, 3]
    assert [e.seq for e in store.logbook_entries(kind_prefix="finding.")] == [2, 4]
    assert [e.seq for e in store.logbook_entries(kind_prefix="request_")] == []
    assert len(store.logbook_entries(limit=100)) == 6


def test_entries_of_one_subject_in_order(store: HarbourStore) -> None:
    """logbook_of returns exactly one subject's entries, oldest first, at most limit."""
    for n in range(6):
        store.append("request.x", "a", "rq_a" if n % 2 else "rq_b", {"n": n}, now=T0 + n)
    store.append("request.x", "a", "rq_a_", {}, now=T0 + 9)  # a longer id is another subject
    assert [e.body["n"] for e in store.logbook_of("rq_a")] == [1, 3, 5]
    assert [e.seq for e in store.logbook_of("rq_b", limit=2)] == [1, 3]
    assert store.logbook_of("rq_none") == []
    # Paged by seq: what follows the last entry of a page.
    assert [e.body["n"] for e in store.logbook_of("rq_a", limit=1, after=2)] == [3]
    assert [e.body["n"] for e in store.logbook_of("rq_a", after=6)] == []


def test_threads_appending_at_once_leave_one_chain(store: HarbourStore) -> None:
    """Eight threads, ten appends each, interleaved with request creation: one chain."""
    gate = threading.Barrier(8)

    def work(n: int) -> None:
        gate.wait(timeout=30)
        for i in range(10):
            store.append("finding.test", f"t{n}", f"{n}-{i}", {"i": i}, now=T0 + i)
        store.create_request(make_draft(f"req-{n}"), now=T0)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    assert len(assert_chain_verifies(store)) == 88


def test_the_chain_survives_reopening(stores: StorePool) -> None:
    """A reopened store extends the same chain."""
    location = stores.location()
    first = stores.create(location)
    first.append("finding.test", "a", "s", {}, now=T0)
    first.close()
    again = stores.open(location)
    again.append("finding.test", "a", "s", {}, now=T0 + 1)
    assert len(assert_chain_verifies(again)) == 2


def test_an_entry_edited_in_the_store_is_named_by_verification(store: HarbourStore) -> None:
    """Rewriting one stored body breaks the chain at exactly that entry's seq."""
    for n in range(4):
        store.append("finding.test", "a", f"s{n}", {"n": n}, now=T0 + n)
    with raw_tx(store) as tx:
        tx.execute("UPDATE logbook SET body = ? WHERE seq = 3", ('{"n":30}',))
    found = verify_entries(e.to_dict() for e in all_entries(store))
    assert found is not None and found.seq == 3
