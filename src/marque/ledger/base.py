"""The execution ledger's interface: the one durable state a Pilot keeps.

The ledger is what makes retries safe (seed 000). Everything the Pilot relies
on is a constraint inside one ledger transaction: the claim is a primary key,
the budget decrement is a conditional UPDATE in the same transaction, and an
attempt settles by a compare-and-set on the outcome lattice's rank. SQLite and
PostgreSQL implementations are siblings behind this interface and run the same
behaviour suite.

:class:`Ledger` is the composition of the roles in :mod:`marque.ledger.roles`
(claims, outcomes, the outbox, the home, target bindings, Effect Sets,
housekeeping); the records they pass are defined there and importable from here.
"""

from __future__ import annotations

from marque.ledger.roles import (
    AttemptRecord,
    BindingsRole,
    Claim,
    ClaimsRole,
    ClaimTicket,
    Durability,
    EffectsRole,
    HomeRole,
    HousekeepingRole,
    Observed,
    OutboxEntry,
    OutboxRole,
    OutcomesRole,
    ReapedRecord,
)

__all__ = [
    "AttemptRecord",
    "BindingsRole",
    "Claim",
    "ClaimTicket",
    "ClaimsRole",
    "Durability",
    "EffectsRole",
    "HomeRole",
    "HousekeepingRole",
    "Ledger",
    "Observed",
    "OutboxEntry",
    "OutboxRole",
    "OutcomesRole",
    "ReapedRecord",
]


class Ledger(ClaimsRole, OutcomesRole, OutboxRole, HomeRole, BindingsRole, EffectsRole,
             HousekeepingRole):
    """A Pilot's execution ledger: every role at once. All methods are safe to call from
    threads."""
