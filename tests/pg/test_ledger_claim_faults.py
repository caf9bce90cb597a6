"""The PostgreSQL ledger's one-statement claim when its connection is lost while the server
still runs it.

The claim commits by itself, so a claim whose connection dies may commit a moment later,
in a server session whose client is gone. A real TCP proxy (``tests/support/pgproxy.py``) cuts the
connection while the claim waits on a budget row another session holds locked; the lock is
released afterwards, so that session's commit, if it still can, lands late. The caller must
hear its own claim's true fate: fresh (landed, or ended and claimed again), or
``ledger_unavailable`` that says the nonce may be claimed — never ``pop_replayed`` for its
own proof, never a second claim.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import pytest
from support.pgproxy import PgProxy, PgProxyFactory
from support.wait import wait_until

from marque.errors import LedgerUnavailable
from marque.ledger import postgres
from marque.ledger.base import Claim, ClaimTicket
from marque.ledger.postgres import PostgresLedger
from marque.outcome import Status

MQ = "mq_lost_claim"


def _ticket(nonce: str, jti: str | None) -> ClaimTicket:
    now = time.time()
    return ClaimTicket(
        marque_id=MQ, nonce=nonce, target="bank", executions=5, max_rows=10,
        attempts_per_nonce=3, expires_at=now + 600, owner_process="proc_a",
        lease_seconds=60, now=now, pop_jti=jti, pop_forget_after=now + 300,
    )


class _Claimer:
    """``ledger.claim(ticket)`` in a thread; its answer or its error."""

    def __init__(self, ledger: PostgresLedger, ticket: ClaimTicket) -> None:
        self.claim: Claim | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ledger, ticket), daemon=True)
        self._thread.start()

    def _run(self, ledger: PostgresLedger, ticket: ClaimTicket) -> None:
        try:
            self.claim = ledger.claim(ticket)
        except BaseException as exc:  # noqa: BLE001 - handed to the test as it is
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(15)
        assert self.done(), "the claim never returned"


@contextlib.contextmanager
def _budget_held(dsn: str) -> Iterator[Callable[[], None]]:
    """The marque's budget row locked by another session (straight to the server, not
    through the proxy): a claim of the marque waits on it inside its statement. Yields the
    release."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM marque_ledger.budgets WHERE marque_id = %s FOR UPDATE",
                       (MQ,))
        yield holder.rollback
        holder.rollback()


def _lock_waiters(dsn: str) -> int:
    """Server sessions of the ledger's database waiting on a lock."""
    with psycopg.connect(dsn, autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'").fetchone()
    return int(row[0]) if row else 0


def _held_claim_cut(ledger: PostgresLedger, proxy: PgProxy, dsn: str, nonce: str, *,
                    release_after: float, proof: bool = True) -> _Claimer:
    """Claim ``nonce`` while its budget row is held, cut the claim's connection while its
    statement waits on the server, then release the row: the statement commits late unless
    its session was ended first. The lock is released once the claim has answered, once a
    second claim of the same nonce waits behind the first one's rows, or after
    ``release_after`` seconds, whichever comes first."""
    with _budget_held(dsn) as release:
        claimer = _Claimer(ledger, _ticket(nonce, f"j-{nonce}" if proof else None))
        assert wait_until(lambda: _lock_waiters(dsn) == 1, timeout=10, step=0.02), \
            "the claim never waited on the row"
        proxy.cut()
        wait_until(lambda: claimer.done() or _lock_waiters(dsn) >= 2, timeout=release_after,
                   step=0.02)
        release()
    claimer.join()
    return claimer


def _only_claim_of(ledger: PostgresLedger, nonce: str, claimer: _Claimer, *,
                   proof: bool = True) -> None:
    """The caller heard its claim as fresh, and the ledger holds exactly that claim: one
    attempt, this process's, and the budget spent once for it."""
    assert claimer.error is None, repr(claimer.error)
    assert claimer.claim is not None and claimer.claim.fresh
    assert claimer.claim.record.attempt == 1
    [attempt] = ledger.attempts(MQ, nonce)
    assert (attempt.status, attempt.owner_process) == (Status.IN_PROGRESS, "proc_a")
    assert attempt.started_at == claimer.claim.record.started_at
    assert ledger.budget(MQ)["executions_left"] == 3  # 5, less "warm", less this one
    if proof:
        assert ledger.remember_pop_jti(f"j-{nonce}", time.time() + 60) is False


@contextlib.contextmanager
def _proxied_ledger(pg_proxy: PgProxyFactory,
                    dsn: str) -> Iterator[tuple[PostgresLedger, PgProxy]]:
    """A ledger whose connections go through a proxy, its budget row for :data:`MQ` made
    by a first claim."""
    proxy, proxied = pg_proxy(dsn)
    ledger = PostgresLedger.create(proxied, "pilot-lost-claim")
    try:
        assert ledger.claim(_ticket("warm", "j-warm")).fresh
        yield ledger, proxy
    finally:
        ledger.close()


@pytest.mark.parametrize("proof", [True, False], ids=["with_proof", "without_proof"])
def test_a_claim_cut_while_the_server_runs_it_is_answered_fresh_once(
        pg_dsn: str, proof: bool, pg_proxy: PgProxyFactory) -> None:
    """Connection cut while the claim's statement waits on a row lock: the claim's server
    session is ended before the ledger is asked whether it landed, so the caller's claim is
    fresh and the only one — not pop_replayed by its own late commit, nor answered as a
    nonce claimed before."""
    with _proxied_ledger(pg_proxy, pg_dsn) as (ledger, proxy):
        claimer = _held_claim_cut(ledger, proxy, pg_dsn, "n1", release_after=1,
                                  proof=proof)
        _only_claim_of(ledger, "n1", claimer, proof=proof)


@pytest.fixture
def unprivileged_dsn(pg_admin_dsn: str, pg_dsn: str) -> Iterator[str]:
    """The ledger database as a role that may neither see nor end its own sessions: it logs
    in as one role and works as another (``options=-c role=…``) that is not a member of the
    first, so ``pg_stat_activity`` hides its sessions' details and ``pg_terminate_backend``
    refuses them."""
    suffix = uuid.uuid4().hex[:8]
    login, worker = f"lc_login_{suffix}", f"lc_work_{suffix}"
    database = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {worker} NOLOGIN")
        admin.execute(f"CREATE ROLE {login} LOGIN IN ROLE {worker}")
        admin.execute(f'GRANT CREATE ON DATABASE "{database}" TO {worker}')
    base, _, query = pg_dsn.partition("?")
    dsn = (base.replace("//postgres@", f"//{login}@", 1) + "?" + query + "&"
           + urlencode({"options": f"-c role={worker}"}, quote_via=quote))
    try:
        yield dsn
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS {login}")
            admin.execute(f"DROP ROLE IF EXISTS {worker}")


def _as_unprivileged(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT current_user <> session_user, backend_start IS NULL FROM pg_stat_activity "
            "WHERE pid = pg_backend_pid()").fetchone()


def test_a_cut_claim_whose_session_cannot_be_ended_is_waited_for_and_its_late_commit_counts(
        unprivileged_dsn: str, pg_dsn: str, pg_proxy: PgProxyFactory) -> None:
    """A role that cannot end its own lost session waits until that session is gone: the
    claim committed late there, and the caller hears it as its fresh claim."""
    assert _as_unprivileged(unprivileged_dsn) == (True, True)
    with _proxied_ledger(pg_proxy, unprivileged_dsn) as (ledger, proxy):
        claimer = _held_claim_cut(ledger, proxy, pg_dsn, "n1", release_after=1)
        _only_claim_of(ledger, "n1", claimer)


def test_a_cut_claim_whose_session_outlives_the_wait_is_ledger_unavailable_and_retryable(
        unprivileged_dsn: str, pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
        pg_proxy: PgProxyFactory) -> None:
    """The lost session still runs the claim when the wait ends: ledger_unavailable saying the
    nonce may be claimed (no guess); the claim then lands, and a retry with the same nonce
    and a new proof finds that very attempt — nothing claimed twice, budget spent once."""
    monkeypatch.setattr(postgres, "SESSION_END_SECONDS", 1.0)
    with _proxied_ledger(pg_proxy, unprivileged_dsn) as (ledger, proxy):
        claimer = _held_claim_cut(ledger, proxy, pg_dsn, "n1", release_after=8)
        assert isinstance(claimer.error, LedgerUnavailable), repr(claimer.error)
        assert "may" in claimer.error.message and "same nonce" in claimer.error.message
        # The held row was released as the claim answered: the late commit lands.
        assert wait_until(lambda: ledger.outcome(MQ, "n1") is not None, timeout=5, step=0.02)
        again = ledger.claim(_ticket("n1", "j-n1-again"))
        assert not again.fresh
        assert (again.record.attempt, again.record.status) == (1, Status.IN_PROGRESS)
        assert len(ledger.attempts(MQ, "n1")) == 1
        assert ledger.budget(MQ)["executions_left"] == 3
