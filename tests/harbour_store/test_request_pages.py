"""A page of request objects reads a fixed number of queries, whatever its size."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from marque.cid import cid
from marque.harbour.store.base import HarbourStore, StoredRequest
from marque.harbour.views import request_object, request_objects

from .conftest import T0, make_draft

UNDO_SQL = "UPDATE accounts SET balance = 5 WHERE id = 1 AND balance = 4"


class _Counting:
    """The store's own transaction, counting the statements run in it."""

    def __init__(self, tx: Any, seen: list[str]) -> None:
        self._tx, self._seen = tx, seen

    def execute(self, sql: str, params: Any = ()) -> Any:
        self._seen.append(sql)
        return self._tx.execute(sql, params)

    def one(self, sql: str, params: Any = ()) -> Any:
        rows = self.execute(sql, params)
        return rows[0] if rows else None


@contextlib.contextmanager
def counted(store: HarbourStore) -> Iterator[list[str]]:
    """Count every statement the store's reads run while the block runs."""
    seen: list[str] = []
    real = getattr(store, "reading")  # noqa: B009 - the engine's, not HarbourStore's

    @contextlib.contextmanager
    def reading() -> Iterator[_Counting]:
        with real() as tx:
            yield _Counting(tx, seen)

    setattr(store, "reading", reading)  # noqa: B010 - this store only, for this block
    try:
        yield seen
    finally:
        delattr(store, "reading")


def _kinds(store: HarbourStore, n: int) -> list[StoredRequest]:
    """``n`` requests of every kind a page shows: a sealed Checkpoint with Resolutions, a
    marque with reports, an undo of a verified request, and a plain one."""
    store.register_pilot("pilot-1", "http://127.0.0.1:9", "inc-1", ["bank"], actor="admin",
                         now=T0, dialects={"bank": "sqlite"})
    made: list[StoredRequest] = []
    for i in range(n):
        kind = i % 4
        request, _ = store.create_request(make_draft(f"page-{i}", principal="alice"),
                                          now=T0 + i)
        if kind == 0:
            body = {"version": "marque-checkpoint/0.1", "n": i}
            store.seal_checkpoint(request.id, 1, checkpoint_cid=cid(body), body=body,
                                  expires_at=T0 + 3600, actor="h", now=T0 + i)
            for approver in ("bob", "carol"):
                resolution = {"checkpoint_cid": cid(body), "approver": approver}
                store.add_resolution(cid(body), resolution_cid=cid(resolution),
                                     approver=approver, decision="approve", body=resolution,
                                     now=T0 + i)
        elif kind in (1, 2):
            marque_id = f"mq_page_{i}"
            request = store.transition(request.id, 1, "prepared", actor="h", now=T0 + i,
                                       marque_id=marque_id)
            store.record_report(marque_id, "n1", 1, "applied", {
                "nonce": "n1", "attempt": 1, "status": "applied"}, now=T0 + i)
            if kind == 2:  # verified, then undone by a request of fenced statements
                store.transition(request.id, request.version, "verified", actor="h",
                                 now=T0 + i)
                undo = make_draft(f"undo-{i}", principal="alice", rolls_back=request.id,
                                  sql=UNDO_SQL)
                change = {"statements": [{"sql": UNDO_SQL, "params": [], "expect_rows": 1}]}
                store.create_request(
                    type(undo)(**{**undo.__dict__, "change": change}), now=T0 + i)
        made.append(request)
    return made


def _page_queries(store: HarbourStore, limit: int) -> tuple[int, list[dict[str, Any]]]:
    page = store.list_requests(principal="alice", limit=limit)
    with counted(store) as seen:
        objects = request_objects(store, page)
    return len(seen), objects


def test_a_page_of_requests_is_a_fixed_number_of_queries(store: HarbourStore) -> None:
    """request_objects reads a page of 8 and a page of 60 requests (Checkpoints, Resolutions,
    reports, undos of verified requests among them) in the same few queries, and each
    object is the one read for that request alone."""
    _kinds(store, 48)
    small, _ = _page_queries(store, 8)
    large, objects = _page_queries(store, 60)
    assert len(objects) == 60
    assert small == large == 5  # originals, Checkpoints, Resolutions, reports; Pilots
    for shown in objects:
        assert shown == request_object(store, store.get_request(shown["id"]))
    assert {o["state"] for o in objects} == {"awaiting_approval", "prepared", "verified",
                                             "preparing"}
    assert sum(1 for o in objects if o["rolls_back"]) == 12
    assert all(o["executions"] for o in objects if o["marque_id"])


def test_get_requests_reads_several_requests_by_id(store: HarbourStore) -> None:
    """get_requests answers each stored request of the ids, as get_request does, and
    leaves out an id no request has."""
    made = [store.create_request(make_draft(f"ids-{i}"), now=T0 + i)[0] for i in range(3)]
    found = store.get_requests([r.id for r in made] + ["rq_missing", made[0].id])
    assert found == {r.id: store.get_request(r.id) for r in made}
    assert store.get_requests([]) == {}
    with counted(store) as seen:
        store.get_requests([r.id for r in made])
    assert len(seen) == 1
