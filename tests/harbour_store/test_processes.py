"""Several processes on one store: one blocking row per scope, one logbook chain.

Each worker is a separate process (``spawn``) that opens its own store handle,
as separate ``harbour serve`` processes sharing one store would; they share
only the database.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from marque.harbour.lifecycle import IntentConflict
from marque.harbour.store.base import HarbourStore

from .conftest import T0, HarbourEngine, all_entries, assert_chain_verifies, make_draft

PROCESSES = 4


def _open(engine: str, location: str) -> HarbourStore:
    if engine == "postgres":
        from marque.harbour.store.postgres import PostgresHarbourStore

        return PostgresHarbourStore.open(location)
    from marque.harbour.store.sqlite import SqliteHarbourStore

    return SqliteHarbourStore.open(location)


def create_worker(engine: str, location: str, n: int, start: Any, results: Any) -> None:
    """Open the store, wait for the others, create the shared scope once (intent by ``n``)."""
    try:
        store = _open(engine, location)
        try:
            start.wait(timeout=60)
            draft = make_draft(sql=f"SELECT {n % 2}")
            try:
                request, created = store.create_request(draft, now=T0)
                outcome: Any = (request.id, created, draft.intent_fingerprint)
            except IntentConflict:
                outcome = "conflict"
        finally:
            store.close()
    except Exception as exc:  # surfaced to the test as a failure
        outcome = ("crashed", repr(exc))
    results.put((os.getpid(), outcome))


def append_worker(engine: str, location: str, n: int, count: int, start: Any,
                  results: Any) -> None:
    """Open the store, wait for the others, append ``count`` entries."""
    try:
        store = _open(engine, location)
        try:
            start.wait(timeout=60)
            seqs = [store.append("finding.test", f"proc-{n}", f"s{n}-{i}", {"n": n, "i": i},
                                 now=T0 + i).seq for i in range(count)]
        finally:
            store.close()
        outcome: Any = seqs
    except Exception as exc:  # surfaced to the test as a failure
        outcome = ("crashed", repr(exc))
    results.put((os.getpid(), outcome))


def _run(target: Any, args_for: Any, processes: int) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(n), start, results))
             for n in range(processes)]
    for proc in procs:
        proc.start()
    try:
        collected = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0] * processes
    assert len({pid for pid, _ in collected}) == processes
    outcomes = [outcome for _, outcome in collected]
    assert not [o for o in outcomes if isinstance(o, tuple) and o[0] == "crashed"], outcomes
    return outcomes


def test_processes_creating_one_scope_leave_one_blocking_row(
        harbour_engine: HarbourEngine, stores: Any) -> None:
    """4 processes create the same scope at once: one row; same intent shares it."""
    location = stores.location()
    stores.create(location)
    outcomes = _run(create_worker, lambda n: (harbour_engine.name, location, n), PROCESSES)
    store = stores.open(location)
    [winner] = store.find_history(make_draft().logical_request_scope)
    assert sum(1 for o in outcomes if o != "conflict" and o[1]) == 1
    for outcome in outcomes:
        if outcome != "conflict":
            assert outcome[0] == winner.id and outcome[2] == winner.intent_fingerprint
    assert sum(1 for o in outcomes if o == "conflict") == sum(
        1 for n in range(PROCESSES) if make_draft(sql=f"SELECT {n % 2}").intent_fingerprint
        != winner.intent_fingerprint)
    assert_chain_verifies(store)


def test_processes_appending_at_once_leave_one_chain(
        harbour_engine: HarbourEngine, stores: Any) -> None:
    """Two processes append 25 entries each at once: 50 entries, one valid chain."""
    location = stores.location()
    stores.create(location)
    outcomes = _run(append_worker, lambda n: (harbour_engine.name, location, n, 25), 2)
    store = stores.open(location)
    entries = assert_chain_verifies(store)
    assert len(entries) == 50
    assert sorted(seq for seqs in outcomes for seq in seqs) == list(range(1, 51))
    assert {e.actor for e in entries} == {"proc-0", "proc-1"}
    assert len(all_entries(store)) == 50
