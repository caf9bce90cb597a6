"""Connection pools for PostgreSQL, shared by the ledger, the Harbourmaster store and the targets.

A pooled connection can die while it sits idle (the server restarted, a
proxy dropped it). Checking every connection on checkout costs a round trip
per transaction. Callers that can safely resend their first message on a
fresh connection (the target's stamp insert) check only connections idle for
a while; callers that cannot (the ledger) check every checkout.

A pool connects in the background and keeps retrying quietly, so a caller
waiting on it for a server that refuses connections would wait out the whole
checkout timeout and then learn only "no connection". :func:`checkout` waits
briefly, then asks the server directly, so a refused connection, an unknown
host or a wrong password is reported at once, with libpq's own reason.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

#: A connection idle longer than this is pinged before it is handed out.
IDLE_CHECK_SECONDS = 0.5
#: How long a caller waits for a connection before giving up (seconds).
CHECKOUT_TIMEOUT_SECONDS = 10.0
#: How long a caller waits on the pool before asking the server directly why
#: no connection came (a healthy server answers a connect in milliseconds).
FIRST_WAIT_SECONDS = 0.25
#: libpq's connect timeout (seconds; libpq's minimum is 2).
CONNECT_TIMEOUT_SECONDS = 5
#: How long the pool keeps retrying, in the background, to replace a connection it
#: lost. psycopg_pool counts such a replacement in the pool's size while it backs
#: off (1 s, 2 s, 4 s, … up to five minutes by default), so after a server restart a
#: pool could look full of connections that were still waiting out their backoff,
#: and a caller waited the whole checkout timeout though the server was back.
#: Giving up soon frees the slot: the next caller that waits grows the pool at once
#: (and checkout() asks the server itself, so a server still down is said at once).
RECONNECT_GIVE_UP_SECONDS = 1.5

Conn = psycopg.Connection[TupleRow]

_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")
#: libpq's idle state as a plain int (``conn.info`` builds an object and an enum per read).
_IDLE = int(psycopg.pq.TransactionStatus.IDLE)


def _discard(conn: Conn, cursor: psycopg.Cursor[Any] | None = None) -> None:
    """Give ``conn``'s session back as it began (``DISCARD ALL``, sent through ``cursor``
    — one of ``conn``'s, which the caller is done with — if given), or close it.

    Approved SQL can leave state behind in its session that outlives its transaction —
    ``set_config(…, false)`` (a role, a search path, read-only as the default), a session
    advisory lock, a temporary table, a ``LISTEN`` — even in a transaction rolled back, for
    the lock. On a pooled connection that state would bind the next marque's change, or
    hold a lock other programs wait for while the connection idles. A connection that
    cannot be reset (broken, or still in a transaction) is closed: the pool drops it.
    """
    if conn.closed or conn.broken:
        return
    try:
        if conn.pgconn.transaction_status != _IDLE:
            raise psycopg.InterfaceError("returned inside a transaction")
        (cursor if cursor is not None else conn).execute("DISCARD ALL")
    except psycopg.Error:
        conn.close()


def session_options(dsn: str, settings: dict[str, str]) -> str:
    """The libpq ``options`` that start a session with ``settings`` on top of the DSN's own
    options: what ``RESET`` (and ``DISCARD ALL``) come back to."""
    given = conninfo_to_dict(dsn).get("options") or ""
    ours = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return f"{given} {ours}".strip()


def make_pool(
    dsn: str,
    *,
    name: str,
    max_size: int,
    min_size: int = 0,
    autocommit: bool = False,
    configure: Callable[[Conn], None] | None = None,
    check_always: bool = False,
    session: dict[str, str] | None = None,
    discard_on_return: bool = False,
) -> Pool:
    """An open pool whose connections are checked before use (idle ones, or all).

    ``session`` settings start every connection's session (as libpq options, so a
    session reset keeps them); ``discard_on_return`` resets each session as its
    connection comes back (:func:`_discard`).
    """
    # The pool logs each failed background connect as a warning; with no logging
    # configured Python would print those on stderr, where the CLI's JSON events go.
    # The failure reaches the caller as a typed error instead (see checkout()).
    pool_logger = logging.getLogger("psycopg.pool")
    if not pool_logger.handlers:
        pool_logger.addHandler(logging.NullHandler())
    kwargs: dict[str, Any] = {"autocommit": autocommit, "connect_timeout": CONNECT_TIMEOUT_SECONDS}
    if session:
        kwargs["options"] = session_options(dsn, session)
    pool = Pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        configure=configure,
        timeout=CHECKOUT_TIMEOUT_SECONDS,
        reconnect_timeout=RECONNECT_GIVE_UP_SECONDS,
        open=True,
        name=name,
    )
    pool.check_always = check_always
    pool.discard_on_return = discard_on_return
    return pool


class Pool(ConnectionPool[Conn]):
    """A pool that pings only connections idle longer than :data:`IDLE_CHECK_SECONDS`.

    The time a connection came back is noted in ``putconn`` itself: psycopg_pool's
    ``reset`` hook would do it too, but a pool with a ``reset`` hands every returned
    connection to a worker thread, and the next caller then often finds none ready
    (measured: a thread hand-off and a second connection per transaction).
    """

    check_always = False
    #: Connections that ran SQL Marque did not write are reset before they go back.
    discard_on_return = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._returned: dict[int, float] = {}
        super().__init__(*args, check=self._check_idle, **kwargs)

    def putconn(self, conn: Conn, reset_with: psycopg.Cursor[Any] | None = None) -> None:
        """Take ``conn`` back, reset first if this pool resets sessions (``reset_with``: a
        cursor of ``conn``'s, done with, to send the reset through instead of a new one)."""
        if self.discard_on_return:
            _discard(conn, reset_with)
        self._returned[id(conn)] = time.monotonic()
        super().putconn(conn)

    def _check_idle(self, conn: Conn) -> None:
        last = self._returned.pop(id(conn), None)
        if self.check_always or last is None or time.monotonic() - last > IDLE_CHECK_SECONDS:
            ConnectionPool.check_connection(conn)


def checkout(pool: ConnectionPool[Conn], dsn: str) -> Conn:
    """A connection from ``pool``; raises ``psycopg.OperationalError`` if none can be had.

    When the pool has nothing to hand out quickly, the server is asked directly
    (one short-lived connection): if it refuses, that error is raised at once,
    instead of a bare timeout after :data:`CHECKOUT_TIMEOUT_SECONDS`. A pool that
    is merely busy is waited on for the rest of the timeout.
    """
    deadline = time.monotonic() + CHECKOUT_TIMEOUT_SECONDS
    try:
        return pool.getconn(timeout=FIRST_WAIT_SECONDS)
    except PoolTimeout:
        pass
    stats = pool.get_stats()
    if stats.get("pool_size", 0) < stats.get("pool_max", 1):
        # Not a pool busy at its maximum but one still waiting for a connection to
        # open, which takes milliseconds from a healthy server: ask it ourselves.
        probe(dsn)  # raises the server's (or the network's) own reason
    return pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))


@contextlib.contextmanager
def connection(pool: ConnectionPool[Conn], dsn: str) -> Iterator[Conn]:
    """:func:`checkout` as a context manager that gives the connection back."""
    conn = checkout(pool, dsn)
    try:
        with conn:  # commits (or rolls back on an error) what the caller did, as the pool's own
            yield conn
    finally:
        pool.putconn(conn)


def probe(dsn: str) -> None:
    """Connect once and hang up; raises ``psycopg.OperationalError`` if the server cannot
    be reached or refuses us."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS):
        pass


def reason(exc: BaseException) -> str:
    """What went wrong, in one line of the server's or libpq's own words."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(exc) or "no reason given"
    text = _ERRNO.sub("", " ".join(text.split()))
    if text.startswith("connection failed: "):
        text = text[len("connection failed: "):]
    return text[:300]
