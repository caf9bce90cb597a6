"""DBOS Transact as the peer: a durable workflow with one step doing the same UPDATE.

The workflow is started with an explicit workflow id (``SetWorkflowID``), so
a second call with the same id is DBOS's replay: it returns the recorded
result without running the step again. The system database is a PostgreSQL
database of its own on the bench's cluster; the step uses a psycopg
connection per client thread, like the raw yardstick. DBOS runs with its
defaults otherwise (pool size, pre-ping).

DBOS is optional (the ``bench`` extra): if it cannot be imported or launched,
its scenarios are reported as skipped with the reason.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from harness import Cell, Op
from scenarios import UPDATE, client_row


class DbosPeer:
    """DBOS launched once in this process (it is a singleton), with one workflow."""

    def __init__(self, system_dsn: str, target_dsn: str) -> None:
        from dbos import DBOS, SetWorkflowID

        self._DBOS = DBOS
        self.SetWorkflowID = SetWorkflowID
        self.version = _version()
        # One connection per target row, kept across rounds: each client of a DBOS cell
        # updates its own row, so no two concurrent steps share a connection.
        self._conns: dict[int, psycopg.Connection[Any]] = {}
        conns_lock = threading.Lock()

        def connection(row: int) -> psycopg.Connection[Any]:
            with conns_lock:
                conn = self._conns.get(row)
                if conn is None:
                    conn = self._conns[row] = psycopg.connect(target_dsn)
            return conn

        @DBOS.step()
        def bench_update(row: int) -> int:
            conn = connection(row)
            cur = conn.execute(UPDATE, (row,))
            conn.commit()
            return cur.rowcount

        @DBOS.workflow()
        def bench_workflow(row: int) -> int:
            return bench_update(row)

        self.workflow: Callable[[int], int] = bench_workflow
        DBOS(config={
            "name": "marque-bench",
            "system_database_url": system_dsn,
            "log_level": "WARNING",
        })
        DBOS.launch()

    def run(self, workflow_id: str, row: int) -> int:
        with self.SetWorkflowID(workflow_id):
            return self.workflow(row)

    def close(self) -> None:
        try:
            self._DBOS.destroy(destroy_registry=True)
        finally:
            for conn in self._conns.values():
                conn.close()


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("dbos")
    except Exception:
        return None


class DbosCell(Cell):
    """A fresh workflow id per operation, or (replay) one completed id per client."""

    def __init__(self, peer: DbosPeer, clients: int, *, replay: bool = False) -> None:
        super().__init__("dbos_replay" if replay else "dbos", clients)
        self.peer = peer
        self.replay = replay
        self.done_ids: list[str] = []
        if replay:
            for c in range(clients):
                wid = f"replayed-{uuid.uuid4().hex}"
                if peer.run(wid, client_row(c)) != 1:
                    raise RuntimeError("set-up workflow did not update one row")
                self.done_ids.append(wid)

    def extra(self) -> dict[str, Any]:
        return {"dbos_version": self.peer.version}

    def prepare(self, per_client: int) -> list[Op]:
        ops = []
        for c in range(self.clients):
            if self.replay:
                ids = [self.done_ids[c]] * per_client
            else:
                ids = [f"wf-{uuid.uuid4().hex}" for _ in range(per_client)]
            ops.append(self._op(ids, client_row(c)))
        return ops

    def _op(self, ids: list[str], row: int) -> Op:
        run = self.peer.run

        def op(i: int) -> None:
            if run(ids[i], row) != 1:
                raise RuntimeError("workflow did not report one updated row")

        return op
