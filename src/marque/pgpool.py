"""Connection pools for PostgreSQL, shared by the ledger and the targets.

A pooled connection can die while it sits idle (the server restarted, a
proxy dropped it). Checking every connection on checkout costs a round trip
per transaction. Callers that can safely resend their first message on a
fresh connection (the target's stamp insert) check only connections idle for
a while; callers that cannot (the ledger) check every checkout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

#: A connection idle longer than this is pinged before it is handed out.
IDLE_CHECK_SECONDS = 0.5
#: How long a caller waits for a connection before giving up (seconds).
CHECKOUT_TIMEOUT_SECONDS = 10.0
#: libpq's connect timeout (seconds; libpq's minimum is 2).
CONNECT_TIMEOUT_SECONDS = 5

Conn = psycopg.Connection[TupleRow]


def make_pool(
    dsn: str,
    *,
    name: str,
    max_size: int,
    min_size: int = 0,
    autocommit: bool = False,
    configure: Callable[[Conn], None] | None = None,
    check_always: bool = False,
) -> ConnectionPool[Conn]:
    """An open pool whose connections are checked before use (idle ones, or all)."""
    returned: dict[int, float] = {}

    def note_return(conn: Conn) -> None:
        returned[id(conn)] = time.monotonic()

    def check(conn: Conn) -> None:
        last = returned.pop(id(conn), None)
        if check_always or last is None or time.monotonic() - last > IDLE_CHECK_SECONDS:
            ConnectionPool.check_connection(conn)

    kwargs: dict[str, Any] = {"autocommit": autocommit, "connect_timeout": CONNECT_TIMEOUT_SECONDS}
    return ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        configure=configure,
        reset=note_return,
        check=check,
        timeout=CHECKOUT_TIMEOUT_SECONDS,
        open=True,
        name=name,
    )
