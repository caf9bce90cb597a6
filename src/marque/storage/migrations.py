"""The one forward-only migration runner every Marque schema moves by.

A :class:`Schema` says where a database keeps its version, how one step is run
and how a newer version than this code knows is refused; step ``i`` takes the
schema from version ``i`` to ``i + 1``, and steps only ever move forward. The
ledger, the Harbourmaster's store, the logbook and the target's stamp table each
describe theirs; :func:`migrate` and :func:`migrate_within` run them the same way:

* the version is read first, outside any write, so an up-to-date database is
  opened without taking a write lock;
* a due migration then takes the writer's lock (:meth:`Schema.lock`, inside the
  write transaction), reads the version again — a second process that migrated
  meanwhile leaves nothing to do — runs the due steps and records the new version,
  all in that one transaction: it happens once, entirely or not at all.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from marque.storage.tx import Tx

C = TypeVar("C")


class Stored(NamedTuple):
    """The version a database holds, and whether it records it (a database made before
    versions were recorded has its version read off its tables: ``recorded`` False)."""

    version: int
    recorded: bool = True


class Schema(abc.ABC, Generic[C]):
    """One kind of database's versions, over its connection or transaction type ``C``."""

    #: The version this code writes and reads.
    latest: int

    @abc.abstractmethod
    def stored(self, conn: C) -> Stored:
        """The version ``conn``'s database holds (0 for none yet)."""

    @abc.abstractmethod
    def step(self, conn: C, index: int) -> None:
        """Run step ``index`` (version ``index`` to ``index + 1``) inside the open transaction."""

    @abc.abstractmethod
    def record(self, conn: C, version: int) -> None:
        """Record ``version`` as the database's, inside the open transaction."""

    def lock(self, conn: C) -> None:
        """Make a second migrating process wait for this one (default: the write
        transaction's own lock already does)."""

    def newer(self, found: int) -> Exception | None:
        """The error refusing a database at version ``found`` > :attr:`latest`; None to
        leave such a database as it is (default)."""
        return None

    def due(self, found: Stored) -> bool:
        """Whether a database holding ``found`` needs a migration."""
        return found.version < self.latest or not found.recorded


class MetaTableSchema(Schema[Tx]):
    """A schema whose version is the ``schema_version`` row of its ``meta`` table (the
    ledger's and the Harbourmaster store's, on either engine)."""

    def stored(self, conn: Tx) -> Stored:
        row = conn.one("SELECT value FROM meta WHERE key = 'schema_version'")
        return Stored(int(row[0]) if row else 0)

    def lock(self, conn: Tx) -> None:
        # Writing the version row first: a second process migrating at the same moment
        # waits for that row lock (PostgreSQL; SQLite's writer lock does the same), then
        # reads the version the first one left, so each step runs exactly once.
        conn.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")

    def record(self, conn: Tx, version: int) -> None:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))


def migrate(schema: Schema[C], reading: Callable[[], contextlib.AbstractContextManager[C]],
            writing: Callable[[], contextlib.AbstractContextManager[C]]) -> int:
    """Bring a database up to :attr:`Schema.latest`, reading through ``reading()`` first and
    migrating in one ``writing()`` transaction if due; returns the version found."""
    with reading() as conn:
        found = schema.stored(conn)
    _refuse_newer(schema, found.version)
    if not schema.due(found):
        return found.version
    with writing() as conn:
        schema.lock(conn)
        return migrate_within(schema, conn)


def migrate_within(schema: Schema[C], conn: C) -> int:
    """:func:`migrate` inside the caller's open write transaction on ``conn`` (which holds
    the writer's lock already); returns the version found."""
    found = schema.stored(conn)  # another process may have moved it meanwhile
    _refuse_newer(schema, found.version)
    if schema.due(found):
        for index in range(found.version, schema.latest):
            schema.step(conn, index)
        schema.record(conn, schema.latest)
    return found.version


def _refuse_newer(schema: Schema[C], found: int) -> None:
    if found > schema.latest:
        refusal = schema.newer(found)
        if refusal is not None:
            raise refusal
