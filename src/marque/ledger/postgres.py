"""The PostgreSQL ledger: the same SQL as SQLite's, for shared deployments.

Tables live in their own schema (``marque_ledger``) so a ledger can share a
database with anything else. Connections come from a pool; each ledger
transaction is one pooled connection, its ``BEGIN`` sent with its first statement; reads go
through a second pool of autocommit connections and see the latest commit. Claims
rely on ``INSERT … ON CONFLICT DO NOTHING`` waiting for a concurrent insert of
the same key, and the budget on a conditional ``UPDATE`` re-checking its
``WHERE`` after a row lock — both READ COMMITTED guarantees.

Every driver error leaves this module as :class:`~marque.errors.LedgerUnavailable`
carrying its SQLSTATE and naming the server (never the password): a server
that refuses connections is reported at once (``pgpool.checkout``), not after
a pool timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from marque.dsn import describe
from marque.errors import BudgetExhausted, LedgerUnavailable, PopReplayed
from marque.ledger.base import Claim, ClaimTicket, Durability
from marque.ledger.sql import SqlLedger
from marque.ledger.statements import ATTEMPT_COLUMNS, STARTED_COLUMNS, row_record
from marque.outcome import Status
from marque.storage.pgpool import CONNECT_TIMEOUT_SECONDS, checkout, connection, make_pool, reason
from marque.storage.tx import Tx

SCHEMA = "marque_ledger"

#: The name PostgreSQL gives ``budgets``' ``CHECK (executions_left >= 0)``.
BUDGET_CHECK = "budgets_executions_left_check"

#: How long a claim whose connection was lost waits for the server session that ran it to
#: end (seconds): only an ended session's claim is final, committed or not. Ending our own
#: session takes milliseconds; a session we may not end ends when its statement does.
SESSION_END_SECONDS = 5.0
#: How often, meanwhile, the server is asked whether that session is still there.
SESSION_POLL_SECONDS = 0.02

#: A fresh claim as one statement that commits by itself (autocommit): one round trip
#: where ``BEGIN``, the claim's steps and ``COMMIT`` take several. Nothing in it needs a
#: second statement to be undone, because every refusal is an error that ends the
#: statement, and with it everything it wrote: a ``jti`` seen before writes nothing; a
#: budget at zero, or a reaped marque (its budget would be born at -1), violates
#: :data:`BUDGET_CHECK`. A nonce claimed before (``prior``, in the statement's snapshot)
#: writes nothing either, and answers its latest attempt and whether the ``jti`` was
#: seen, so a replay of an ``applied`` nonce is answered from this one round trip. A
#: claim row inserted meanwhile by another process (not in the snapshot, but ``ON
#: CONFLICT`` waits for it) leaves only the ``jti`` recorded, as a claim of a known nonce
#: does. Whatever this does not settle (a known nonce not answered here, a connection
#: lost under it whose server session ended without committing it) takes the transaction
#: of :meth:`SqlLedger._claim_steps_txn`.
_CLAIM_ALONE = (
    f"WITH prior AS (SELECT {ATTEMPT_COLUMNS} FROM claims c JOIN attempts a "
    "ON a.marque_id = c.marque_id AND a.nonce = c.nonce AND a.attempt = c.attempt "
    "WHERE c.marque_id = %s AND c.nonce = %s), "
    "jti AS (INSERT INTO pop_jtis (jti, forget_after) SELECT %s, %s "
    "WHERE %s IS NOT NULL AND NOT EXISTS (SELECT 1 FROM prior) "
    "ON CONFLICT (jti) DO NOTHING RETURNING 1), "
    "unseen AS (SELECT %s IS NULL OR EXISTS (SELECT 1 FROM jti) AS ok), "
    "claimed AS (INSERT INTO claims (marque_id, nonce, attempt, claimed_at) "
    "SELECT %s, %s, 1, %s WHERE NOT EXISTS (SELECT 1 FROM prior) AND (SELECT ok FROM unseen) "
    "ON CONFLICT (marque_id, nonce) DO NOTHING RETURNING 1), "
    "spent AS (INSERT INTO budgets (marque_id, target, executions_left, max_rows, "
    "attempts_per_nonce, expires_at) "
    "SELECT %s, %s, CASE WHEN EXISTS (SELECT 1 FROM reaped_marques WHERE marque_id = %s) "
    "THEN -1 ELSE %s END, %s, %s, %s WHERE EXISTS (SELECT 1 FROM claimed) "
    "ON CONFLICT (marque_id) DO UPDATE SET executions_left = budgets.executions_left - 1 "
    "RETURNING 1), "
    f"started AS (INSERT INTO attempts ({STARTED_COLUMNS}) "
    "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM spent) "
    "RETURNING 1) "
    "SELECT (SELECT ok FROM unseen), EXISTS (SELECT 1 FROM started), "
    "EXISTS (SELECT 1 FROM pop_jtis WHERE jti = %s), p.* "
    "FROM (SELECT 1) AS one LEFT JOIN prior p ON true"
)


class _PgTx(Tx):
    """Statements on one connection."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Our own statements never hold a literal '%' or '?' other than placeholders.
        cur = self._conn.execute(sql.replace("?", "%s"), tuple(params) if params else None)
        return cur.fetchall() if cur.description is not None else []


class _PgWriteTx(Tx):
    """A write transaction whose ``BEGIN`` travels with its first statement.

    A pooled connection is pinged only after sitting idle (pgpool), so one may have
    died a moment ago (a server restart). That fails the first message, BEGIN and
    all, before anything of the transaction can have committed: it is sent again,
    once, on a fresh connection.
    """

    def __init__(self, pool: ConnectionPool[psycopg.Connection[TupleRow]], dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn
        self.conn: psycopg.Connection[TupleRow] | None = checkout(pool, dsn)
        #: Whether BEGIN went out: the transaction then needs its COMMIT or ROLLBACK.
        self.begun = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        sql = sql.replace("?", "%s")
        bound = tuple(params) if params else None
        if self.begun:
            cur = self.conn.execute(sql, bound)
            return cur.fetchall() if cur.description is not None else []
        for retry in (True, False):
            # One message, one round trip: BEGIN and the first statement, its parameters
            # bound client-side (our own values), as the target sends its stamp.
            cur = psycopg.ClientCursor(self.conn)
            self.begun = True  # a statement that fails leaves the transaction to roll back
            try:
                cur.execute("BEGIN; " + sql, bound)
            except psycopg.OperationalError as exc:
                # Broken, or ended by the server (admin/crash shutdown, 57P0x): either
                # way its session is gone, and with it anything of this transaction.
                gone = self.conn.broken or (exc.sqlstate or "").startswith("57P")
                if not (retry and gone):
                    raise
                self.begun = False
                self.release()
                # Its idle siblings died with it (a server restart): weed them out first.
                self._pool.check()
                self.conn = checkout(self._pool, self._dsn)
                continue
            cur.nextset()
            return cur.fetchall() if cur.description is not None else []
        raise AssertionError("unreachable")

    def end(self, *, commit: bool) -> None:
        """COMMIT (or ROLLBACK) what was begun."""
        if self.conn is None or not self.begun:
            return
        if commit:
            self.conn.execute("COMMIT")
        elif not self.conn.broken:
            self.conn.execute("ROLLBACK")

    def release(self) -> None:
        """Give the connection back (a broken one is discarded by the pool)."""
        if self.conn is not None:
            self._pool.putconn(self.conn)
            self.conn = None


class _PgReadTx(Tx):
    """Reads, each one autocommit statement on a pooled connection."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[TupleRow]], dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        for retry in (True, False):
            with connection(self._pool, self._dsn) as conn:
                try:
                    return _PgTx(conn).execute(sql, params)
                except psycopg.OperationalError:
                    if not (retry and conn.broken):
                        raise
            # Connections died idle (a server restart): weed out the pool, ask again.
            self._pool.check()
        raise AssertionError("unreachable")


def _configure(conn: psycopg.Connection[TupleRow]) -> None:
    conn.execute(f"SET search_path TO {SCHEMA}")
    conn.commit()


class PostgresLedger(SqlLedger):
    """A ledger in a PostgreSQL database (schema ``marque_ledger``)."""

    def __init__(self, dsn: str, *, pool_size: int = 10) -> None:
        super().__init__()
        self.dsn = dsn
        #: The server session behind each write connection: (pid, backend_start), the
        #: start None when the role may not see it. A claim lost with its connection ends
        #: that very session before it reads whether the claim landed.
        self._sessions: weakref.WeakKeyDictionary[
            psycopg.Connection[TupleRow], tuple[int, datetime | None]
        ] = weakref.WeakKeyDictionary()
        self._sessions_lock = threading.Lock()
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = make_pool(
            dsn, name="marque-ledger", min_size=1, max_size=pool_size,
            configure=self._configure_session, autocommit=True,
        )
        # No wait for the pool here: the first use (``_has_schema``) reports a server
        # that refuses us at once, with its reason (pgpool.checkout).
        # Reads are one autocommit statement each (one round trip, no BEGIN or
        # COMMIT), on connections pinged only after sitting idle: a read that
        # fails can simply be asked again, unlike a write mid-transaction.
        self._read_pool: ConnectionPool[psycopg.Connection[TupleRow]] = make_pool(
            dsn, name="marque-ledger-reads", max_size=pool_size, configure=_configure,
            autocommit=True,
        )

    def _configure_session(self, conn: psycopg.Connection[TupleRow]) -> None:
        """A new write connection: its search path, and which server session it is (once
        per connection, never on a claim's path)."""
        _configure(conn)
        row = conn.execute("SELECT pid, backend_start FROM pg_stat_activity "
                           "WHERE pid = pg_backend_pid()").fetchone()
        session = (int(row[0]), row[1]) if row else (conn.info.backend_pid, None)
        with self._sessions_lock:
            self._sessions[conn] = session

    @classmethod
    def create(cls, dsn: str, pilot_id: str) -> PostgresLedger:
        """Create the ledger schema with a fresh incarnation; refuses an existing ledger."""
        try:
            with psycopg.connect(dsn, autocommit=True,
                                 connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        except psycopg.Error as exc:
            raise unavailable(dsn, exc) from exc
        return cls(dsn)._created(pilot_id)

    @classmethod
    def open(cls, dsn: str) -> PostgresLedger:
        """Open an existing ledger; ``LedgerMissing`` if it holds no incarnation."""
        return cls(dsn)._opened()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        # BEGIN travels with the first statement and the connection is pinged only after
        # sitting idle (pgpool), so a transaction costs its statements and its COMMIT.
        try:
            tx = _PgWriteTx(self._pool, self.dsn)
            try:
                try:
                    yield tx
                except BaseException:
                    tx.end(commit=False)
                    raise
                tx.end(commit=True)
            finally:
                tx.release()
        except psycopg.Error as exc:
            raise unavailable(self.dsn, exc) from exc

    @contextlib.contextmanager
    def reading(self) -> Iterator[Tx]:
        try:
            yield _PgReadTx(self._read_pool, self.dsn)
        except psycopg.Error as exc:
            raise unavailable(self.dsn, exc) from exc

    def _has_schema(self) -> bool:
        try:
            with connection(self._pool, self.dsn) as conn:
                row = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.meta",)).fetchone()
        except psycopg.Error as exc:
            raise unavailable(self.dsn, exc) from exc
        return bool(row and row[0] is not None)

    def durability(self) -> Durability:
        """``fsync`` and ``synchronous_commit`` as a ledger connection sees them (``SHOW``).

        Read on the ledger's own pooled connection, so a per-database or per-role
        setting (``ALTER DATABASE … SET synchronous_commit = off``) counts as much
        as the server's. ``synchronous_commit`` ``local``, ``remote_write`` and
        ``remote_apply`` all flush the commit locally first, like ``on``.
        """
        with self.transaction() as tx:
            fsync = str(tx.execute("SHOW fsync")[0][0])
            commit = str(tx.execute("SHOW synchronous_commit")[0][0])
        problems = []
        if fsync != "on":
            problems.append(f"the server runs with fsync = {fsync}: nothing it commits is "
                            "forced to disk")
        if commit == "off":
            problems.append("synchronous_commit is off for the ledger's connections: a "
                            "commit is acknowledged before it is on disk")
        return Durability("postgresql", {"fsync": fsync, "synchronous_commit": commit},
                          tuple(problems))

    def _size_bytes(self) -> int:
        with self.reading() as tx:
            row = tx.one(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = ? AND c.relkind = 'r'",
                (SCHEMA,),
            )
        return int(row[0]) if row else 0

    def _json_array_length(self, column: str) -> str:
        return f"json_array_length({column}::json)"

    claim_answers_replays = True

    def _claim_alone(self, ticket: ClaimTicket) -> Claim | None:
        jti = ticket.pop_jti
        try:
            row = self._commit_alone(_CLAIM_ALONE, (
                ticket.marque_id, ticket.nonce,
                jti, ticket.pop_forget_after, jti, jti,
                ticket.marque_id, ticket.nonce, ticket.now,
                ticket.marque_id, ticket.target, ticket.marque_id, ticket.executions - 1,
                ticket.max_rows, ticket.attempts_per_nonce, ticket.expires_at,
                *self._started_values(ticket, 1),
                jti,
            ))
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name != BUDGET_CHECK:
                raise unavailable(self.dsn, exc) from exc
            # The statement, and everything it wrote, ended: no nonce is claimed.
            with self.reading() as tx:
                self._refuse_reaped_txn(tx, ticket.marque_id)
            raise BudgetExhausted(
                f"marque {ticket.marque_id} has no executions left in its budget") from None
        if row is None:
            # The connection died under it, and its server session has ended since (else
            # _commit_alone raised): whether it committed is final, and its attempt 1 says.
            if self._claim_landed(ticket):
                return Claim(True, self._attempt_record(ticket, 1))
            return None  # not committed, or a known nonce's jti only: the transaction
        unseen, fresh, seen, *prior = row
        if prior[0] is not None:
            # Claimed before; nothing was written.
            latest = row_record(tuple(prior))
            if not (ticket.replay_behind and jti is not None
                    and latest.status is Status.APPLIED):
                return None  # the transaction records the jti and reads it again
            # Applied is absorbing: this proof can only read it again (Ledger.replay).
            with self._replay_lock:
                if seen or not self._jtis.add(jti, ticket.pop_forget_after):
                    raise PopReplayed("this proof has been used before")
            return Claim(False, latest)
        if not unseen:
            raise PopReplayed("this proof has been used before")
        if fresh:
            return Claim(True, self._attempt_record(ticket, 1))
        # Another process claimed the nonce meanwhile; this jti is recorded already.
        with self.transaction() as tx:
            return self._claim_known_txn(tx, ticket)

    def _claim_landed(self, ticket: ClaimTicket) -> bool:
        """Whether ``ticket``'s fresh claim committed: its one trace that no other claim
        can leave is its very attempt 1 (this incarnation, process and start time)."""
        with self.reading() as tx:
            started = tx.one(
                "SELECT owner_incarnation, owner_process, started_at FROM attempts "
                "WHERE marque_id = ? AND nonce = ? AND attempt = 1",
                (ticket.marque_id, ticket.nonce))
        return started == (self.incarnation, ticket.owner_process, ticket.now)

    def _commit_alone(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """One statement that commits by itself, and its row; None when the connection
        died under it: by then the server session that ran it has ended, so whether it
        committed is final and the ledger tells (the caller reads it, never sends it
        again). A ``CheckViolation`` is raised as it is; ``LedgerUnavailable`` when that
        session's end cannot be established (:meth:`_end_lost_session`)."""
        try:
            conn = checkout(self._pool, self.dsn)
            try:
                cur = psycopg.ClientCursor(conn)
                cur.execute(sql.replace("?", "%s"), tuple(params))
                return cur.fetchone()
            except psycopg.OperationalError as exc:
                if not (conn.broken or (exc.sqlstate or "").startswith("57P")):
                    raise
                # Ended by the server, or the connection lost: before, while or after it
                # ran — and a session whose client is gone may still commit it.
                with self._sessions_lock:
                    session = self._sessions.get(conn) or (conn.info.backend_pid, None)
            finally:
                self._pool.putconn(conn)
        except psycopg.errors.CheckViolation:
            raise
        except psycopg.Error as exc:
            raise unavailable(self.dsn, exc) from exc
        self._end_lost_session(session)
        return None

    def _end_lost_session(self, session: tuple[int, datetime | None]) -> None:
        """Return once the server session of a lost connection is gone, ending it first
        where this role may; ``LedgerUnavailable`` (the claim's fate unknown) if it is not
        gone within :data:`SESSION_END_SECONDS`, or the server cannot be asked.

        The server may still be running (or not yet have read) the statement the
        connection carried, and commit it after the ledger was asked whether it landed.
        Once the session has ended, its transaction has committed or rolled back for good
        (a backend ends its transaction, and releases its locks, before it leaves
        ``pg_stat_activity``). The session is known by its pid and start, so a pid the
        server has since given to another session is neither ended nor waited for. A role
        that may not see its sessions' start (it logs in as one role and works as another)
        ends nothing: it waits until no session has that pid.
        """
        pid, start = session
        try:
            gone = self._session_gone(pid, start)
        except LedgerUnavailable as exc:
            raise self._claim_unknown(
                f"the server could not be asked whether its session ended ({exc.message})"
            ) from exc
        if not gone:
            raise self._claim_unknown(
                f"its server session (pid {pid}) was still there after "
                f"{SESSION_END_SECONDS:g} s and may yet record it")

    def _session_gone(self, pid: int, start: datetime | None) -> bool:
        """End the session ``(pid, start)`` if this role may, then wait for it to be gone
        from ``pg_stat_activity``; False if it is still there at the deadline."""
        may_end = start is not None
        deadline = time.monotonic() + SESSION_END_SECONDS
        with self.reading() as tx:
            while True:
                if may_end:
                    may_end = False  # asked once; then it is waited for
                    try:
                        rows = tx.execute(
                            "SELECT backend_start, CASE WHEN backend_start = ? "
                            "THEN pg_terminate_backend(pid) END "
                            "FROM pg_stat_activity WHERE pid = ?", (start, pid))
                    except psycopg.errors.InsufficientPrivilege:
                        rows = [(start,)]  # not ours to end: wait for it
                else:
                    rows = tx.execute(
                        "SELECT backend_start FROM pg_stat_activity WHERE pid = ?", (pid,))
                seen = rows[0][0] if rows else None
                if not rows or (start is not None and seen is not None and seen != start):
                    return True  # gone (its pid, if there, is another session's)
                if time.monotonic() >= deadline:
                    return False
                time.sleep(SESSION_POLL_SECONDS)

    def _claim_unknown(self, why: str) -> LedgerUnavailable:
        """The claim's connection was lost and its fate could not be established."""
        server = describe(self.dsn)
        return LedgerUnavailable(
            f"the ledger database at {server} lost the connection of a claim, and whether "
            f"the claim was recorded is unknown: {why}. Nothing was sent to a target. Retry "
            "with the same nonce: it answers what the ledger recorded (a claim that landed "
            "stays in_progress until its lease runs out, then reconciliation settles it)",
            detail={"server": server},
        )

    def close(self) -> None:
        self._jtis.close()
        self._read_pool.close()
        self._pool.close()


def unavailable(dsn: str, exc: psycopg.Error) -> LedgerUnavailable:
    """A driver error of the ledger, as the typed error an operator can act on."""
    server = describe(dsn)
    return LedgerUnavailable(
        f"the ledger database at {server} is unavailable: {reason(exc)}. Check that "
        "PostgreSQL is running there and accepts this Pilot's connections, then retry "
        "(an exec may be retried with the same nonce)",
        sqlstate=exc.sqlstate,
        detail={"server": server},
    )
