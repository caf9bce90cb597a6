"""Which database each target name stands for: the ledger's target bindings.

A target's stamps are the evidence reconciliation settles attempts by
(DESIGN §4), and they are evidence only in the database the attempt was sent
to. A name in ``pilot.json`` can be re-pointed (``marque pilot target add``
again, or a hand edit) while an attempt there is unsettled; a tombstone
written in the new database would "prove" that the attempt never applied,
and the nonce could run a second time. So the ledger remembers, per target
name, the *identity* (a random id made with the stamp table, migration 5 of
:mod:`marque.target.stamps`) it first found there, and:

* the first binding of a name wins (``INSERT … ON CONFLICT DO NOTHING``: two
  processes opening one ledger read the same winner);
* a rebinding is a compare-and-set on the identity the operator saw, and it
  *pins* each attempt still unsettled on the name to the identity it was sent
  to, in the same transaction, so that attempt is never tombstoned anywhere
  else (``pinned_attempts``, one row per nonce).

Migration 6 of the ledger. SQL here, like in :mod:`.sql`, uses only what
SQLite and PostgreSQL share.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marque.errors import Conflict, TargetUnsettled
from marque.outcome import SETTLED_RANK

if TYPE_CHECKING:
    from marque.storage.tx import Tx

#: Migration 6 of the ledger (see :data:`marque.ledger.schema.MIGRATIONS`). New tables only.
BINDING_MIGRATION: list[str] = [
    """CREATE TABLE target_bindings (
        target TEXT PRIMARY KEY,
        target_id TEXT NOT NULL,
        location TEXT NOT NULL,
        bound_at DOUBLE PRECISION NOT NULL,
        rebound_from TEXT)""",
    """CREATE TABLE pinned_attempts (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        target TEXT NOT NULL,
        target_id TEXT NOT NULL,
        pinned_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce))""",
]


@dataclass(frozen=True)
class TargetBinding:
    """The identity a target name stands for in this ledger, and where it was found."""

    target: str
    target_id: str
    location: str
    bound_at: float
    #: The identity it stood for before the last rebinding, if it was ever rebound.
    rebound_from: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The binding as JSON-ready fields."""
        return {"target": self.target, "target_id": self.target_id,
                "location": self.location, "bound_at": self.bound_at,
                "rebound_from": self.rebound_from}


@dataclass(frozen=True)
class PinnedAttempt:
    """An attempt left unsettled by a rebinding: its evidence lives in ``target_id``."""

    marque_id: str
    nonce: str
    attempt: int
    target: str
    target_id: str
    pinned_at: float


_BINDING_COLUMNS = "target, target_id, location, bound_at, rebound_from"


class BindingLedger(abc.ABC):
    """Target bindings for :class:`~marque.ledger.sql.SqlLedger` (a mixin)."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction."""

    @abc.abstractmethod
    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A read-only transaction."""

    def target_binding(self, target: str) -> TargetBinding | None:
        """The binding of one target name, or None if it was never bound."""
        with self.reading() as tx:
            row = tx.one(f"SELECT {_BINDING_COLUMNS} FROM target_bindings WHERE target = ?",
                         (target,))
        return TargetBinding(*row) if row else None

    def target_bindings(self) -> list[TargetBinding]:
        """Every target name's binding, by name."""
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_BINDING_COLUMNS} FROM target_bindings ORDER BY target")
        return [TargetBinding(*r) for r in rows]

    def bind_target(self, target: str, target_id: str, location: str, *,
                    now: float) -> TargetBinding:
        """Bind an unbound name to the identity found there; the binding as it stands
        (the first binder's, which may name another identity than ``target_id``)."""
        with self.transaction() as tx:
            tx.execute("INSERT INTO target_bindings (target, target_id, location, bound_at) "
                       "VALUES (?, ?, ?, ?) ON CONFLICT (target) DO NOTHING",
                       (target, target_id, location, now))
            row = tx.one(f"SELECT {_BINDING_COLUMNS} FROM target_bindings WHERE target = ?",
                         (target,))
        assert row is not None
        return TargetBinding(*row)

    def rebind_target(self, target: str, *, seen_id: str, target_id: str, location: str,
                      now: float, pin_unsettled: bool) -> tuple[TargetBinding,
                                                                 list[PinnedAttempt]]:
        """Move ``target``'s binding from ``seen_id`` to ``target_id`` (compare-and-set).

        The name's unsettled attempts (every attempt below the settled rank, of a marque
        for this target, not pinned already) are pinned to ``seen_id`` in the same
        transaction when ``pin_unsettled``; without it, any such attempt refuses the
        rebinding (``target_unsettled``). Returns the new binding and the attempts pinned.
        """
        with self.transaction() as tx:
            unsettled = tx.execute(
                "SELECT a.marque_id, a.nonce, MAX(a.attempt) FROM attempts a "
                "JOIN budgets b ON b.marque_id = a.marque_id "
                "WHERE b.target = ? AND a.status_rank < ? AND NOT EXISTS ("
                " SELECT 1 FROM pinned_attempts p WHERE p.marque_id = a.marque_id "
                " AND p.nonce = a.nonce) "
                "GROUP BY a.marque_id, a.nonce ORDER BY a.marque_id, a.nonce",
                (target, SETTLED_RANK))
            if unsettled and not pin_unsettled:
                raise TargetUnsettled(
                    f"target {target} has {len(unsettled)} unsettled "
                    f"attempt{'s' if len(unsettled) != 1 else ''} whose evidence is in the "
                    f"database of identity {seen_id}: point the name back there and let "
                    "reconciliation settle them, or rebind with --pin-unsettled to leave "
                    "them indeterminate, bound to that database; nothing was changed",
                    detail={"target": target, "target_id": seen_id, "unsettled": [
                        {"marque_id": m, "nonce": n, "attempt": a} for m, n, a in unsettled]})
            moved = tx.execute(
                "UPDATE target_bindings SET target_id = ?, location = ?, bound_at = ?, "
                "rebound_from = target_id WHERE target = ? AND target_id = ? "
                "RETURNING target",
                (target_id, location, now, target, seen_id))
            if not moved:
                raise Conflict(
                    f"target {target}'s binding is no longer {seen_id} (another process "
                    "rebound it or it was never bound): nothing was changed; look again",
                    detail={"target": target, "seen": seen_id})
            pinned = [PinnedAttempt(m, n, int(a), target, seen_id, now) for m, n, a in unsettled]
            for pin in pinned:
                tx.execute(
                    "INSERT INTO pinned_attempts (marque_id, nonce, attempt, target, target_id, "
                    "pinned_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (marque_id, nonce) "
                    "DO NOTHING",
                    (pin.marque_id, pin.nonce, pin.attempt, target, seen_id, now))
            row = tx.one(f"SELECT {_BINDING_COLUMNS} FROM target_bindings WHERE target = ?",
                         (target,))
        assert row is not None
        return TargetBinding(*row), pinned

    def pinned_attempt(self, marque_id: str, nonce: str) -> PinnedAttempt | None:
        """The pin a rebinding left on a nonce, or None: its evidence is in that database."""
        with self.reading() as tx:
            row = tx.one("SELECT marque_id, nonce, attempt, target, target_id, pinned_at "
                         "FROM pinned_attempts WHERE marque_id = ? AND nonce = ?",
                         (marque_id, nonce))
        return PinnedAttempt(*row) if row else None
