"""What reaping keeps, and one rule for "expired" (issue 8, findings 4 and 7), on every engine.

Reaping deletes a marque's entries but keeps a small record per nonce, so a
later question is answered "reaped" rather than "never claimed"; a reaped
marque's budget is never born again; ``stats`` and ``reap`` count expiry with
the same clock-skew allowance; and a ledger written by schema 1 is migrated
when it is opened.
"""

from __future__ import annotations

import threading

import pytest

from marque.errors import MarqueExpired
from marque.ledger import schema as ledger_schema
from marque.ledger.base import Ledger
from marque.ledger.sql import SqlLedger
from marque.outcome import Status

from .conftest import LedgerPool, make_ticket

T0 = 1_900_000_000.0
EXPIRES = T0 + 100


def _settled(ledger: Ledger, marque_id: str, nonce: str, status: Status, *,
             expires_at: float = EXPIRES, rows: int | None = None, executions: int = 3) -> None:
    """Claim ``nonce`` at T0 and settle its attempt to ``status``."""
    claim = ledger.claim(make_ticket(marque_id, nonce, expires_at=expires_at, now=T0,
                                     executions=executions))
    assert claim.fresh
    ledger.observe(marque_id, nonce, claim.record.attempt, status, now=T0, cause="test",
                  rows_affected=rows, events=[{"event": "committed"}])


def _ack_all(ledger: Ledger) -> None:
    while pending := ledger.outbox_pending(limit=1000):
        ledger.outbox_ack_all(pending, T0)


def test_reap_keeps_a_record_of_each_reaped_nonce(ledger: Ledger) -> None:
    """A reaped nonce leaves its final attempt, status, rows, expiry and reap time; others none."""
    _settled(ledger, "mq_old", "a", Status.APPLIED, rows=2)
    _settled(ledger, "mq_old", "b", Status.ABORTED_NOT_APPLIED)
    ledger.claim(make_ticket("mq_old", "b", expires_at=EXPIRES, now=T0))  # attempt 2
    ledger.observe("mq_old", "b", 2, Status.APPLIED, now=T0, cause="test", rows_affected=1)
    _ack_all(ledger)
    now = EXPIRES + 10

    assert ledger.reaped("mq_old", "a") is None  # not reaped yet: it is still an outcome
    assert ledger.reap(now)["marques"] == 1

    a = ledger.reaped("mq_old", "a")
    b = ledger.reaped("mq_old", "b")
    assert a is not None and b is not None
    assert (a.status, a.attempt, a.rows_affected, a.target) == (Status.APPLIED, 1, 2, "bank")
    assert (b.status, b.attempt, b.rows_affected) == (Status.APPLIED, 2, 1)
    assert (a.expires_at, a.reaped_at) == (EXPIRES, now)
    assert ledger.outcome("mq_old", "a") is None  # the entries themselves are gone
    assert ledger.reaped("mq_old", "never") is None  # a nonce never claimed stays unknown
    assert ledger.reaped("mq_unknown", "a") is None
    stats = ledger.stats(now)
    assert (stats["reaped_marques"], stats["reaped_nonces"]) == (1, 2)
    assert stats["schema_version"] == len(ledger_schema.MIGRATIONS)


def test_a_reaped_marque_never_gets_a_new_budget(ledger: Ledger) -> None:
    """A claim under a marque already reaped is refused marque_expired and records nothing."""
    _settled(ledger, "mq_old", "a", Status.APPLIED, rows=1, executions=5)
    _ack_all(ledger)
    assert ledger.reap(EXPIRES + 10)["marques"] == 1

    # Reachable only if the skew allowance was raised, or the clock went back, since.
    for nonce in ("a", "fresh"):
        with pytest.raises(MarqueExpired) as refused:
            ledger.claim(make_ticket("mq_old", nonce, expires_at=EXPIRES, now=EXPIRES - 1,
                                     executions=5))
        assert refused.value.detail == {"expires_at": EXPIRES, "reaped_at": EXPIRES + 10}
        assert ledger.outcome("mq_old", nonce) is None
    assert ledger.budget("mq_old") is None
    assert ledger.stats(EXPIRES)["claims"] == 0
    # Other marques are untouched by the guard.
    assert ledger.claim(make_ticket("mq_other", "a", now=T0)).fresh


@pytest.mark.parametrize("skew", [0.0, 30.0, 120.0])
def test_stats_and_reap_agree_on_what_is_reapable(ledger: Ledger, skew: float) -> None:
    """stats' reapable count is what reap deletes, with the same skew; next_reapable_at follows."""
    for i, expiry in enumerate((T0 + 10, T0 + 50, T0 + 90, T0 + 200)):
        _settled(ledger, f"mq_{i}", "n", Status.APPLIED, expires_at=expiry, rows=1)
    _ack_all(ledger)
    now = T0 + 100
    expected_gone = sum(1 for e in (10, 50, 90, 200) if T0 + e + skew < now)
    first_left = min(T0 + e for e in (10, 50, 90, 200) if T0 + e + skew >= now)

    stats = ledger.stats(now, skew_seconds=skew)
    assert stats["skew_seconds"] == skew
    assert stats["reapable_marques"] == expected_gone
    assert stats["live_marques"] == 4 - expected_gone
    assert stats["next_reapable_at"] == first_left + skew

    assert ledger.reap(now, skew_seconds=skew)["marques"] == expected_gone
    after = ledger.stats(now, skew_seconds=skew)
    assert (after["marques"], after["reapable_marques"]) == (4 - expected_gone, 0)
    assert (ledger.reaped("mq_0", "n") is not None) is (expected_gone > 0)
    assert (ledger.reaped("mq_3", "n") is None) and ledger.outcome("mq_3", "n") is not None


def test_stats_of_a_ledger_with_no_live_marque_has_no_next_reap(ledger: Ledger) -> None:
    """next_reapable_at is None when no marque is inside its window."""
    assert ledger.stats(T0, skew_seconds=60)["next_reapable_at"] is None
    _settled(ledger, "mq_old", "a", Status.APPLIED)
    assert ledger.stats(EXPIRES + 61, skew_seconds=60)["next_reapable_at"] is None


def _schema_1_ledger(pool: LedgerPool) -> str:
    """A ledger as schema 1 left it, holding one settled, reported, expired nonce.

    Schemas 2, 4, 5 and 6 only add tables, schema 3 only renames columns and schema 7
    only changes how SQLite stores four tables (rebuilt whatever their form), so a
    current ledger with those undone and its version row set back to 1 is what
    schema-1 code wrote.
    """
    location = pool.location()
    ledger = pool.create(location)
    _settled(ledger, "mq_old", "a", Status.APPLIED, rows=1)
    _ack_all(ledger)
    assert isinstance(ledger, SqlLedger)
    with ledger.transaction() as tx:
        tx.execute("ALTER TABLE attempts RENAME COLUMN owner_process TO owner_run")
        tx.execute("ALTER TABLE observations RENAME COLUMN cause TO source")
        for statement in (*ledger_schema.MIGRATIONS[1], *ledger_schema.MIGRATIONS[3],
                          *ledger_schema.MIGRATIONS[4], *ledger_schema.MIGRATIONS[5]):
            table = statement.split()[2]
            tx.execute(f"DROP TABLE {table}")
        tx.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    ledger.close()
    return location


def test_a_schema_1_ledger_is_migrated_on_open(pool: LedgerPool) -> None:
    """Opening a schema-1 ledger migrates it: its entries stay, and reaping then keeps records."""
    location = _schema_1_ledger(pool)

    ledger = pool.open(location)

    assert ledger.stats(T0)["schema_version"] == len(ledger_schema.MIGRATIONS) == 7
    record = ledger.outcome("mq_old", "a")
    assert record is not None and record.status is Status.APPLIED
    assert ledger.reap(EXPIRES + 10)["marques"] == 1
    reaped = ledger.reaped("mq_old", "a")
    assert reaped is not None and reaped.status is Status.APPLIED
    # Opening it again finds nothing more to migrate.
    again = pool.open(location)
    assert again.stats(T0)["schema_version"] == len(ledger_schema.MIGRATIONS)


def test_concurrent_opens_migrate_a_schema_1_ledger_once(pool: LedgerPool) -> None:
    """Several processes' handles opening a schema-1 ledger at once all succeed; one migrates."""
    location = _schema_1_ledger(pool)
    opened: list[Ledger] = []
    failed: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        start.wait()
        try:
            opened.append(pool.open_second(location))
        except BaseException as exc:  # noqa: BLE001 - the test reports every failure
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failed == []
    assert len(opened) == 4
    versions = {handle.stats(T0)["schema_version"] for handle in opened}
    assert versions == {len(ledger_schema.MIGRATIONS)}
