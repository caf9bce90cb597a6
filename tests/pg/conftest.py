"""Fixtures for the PostgreSQL tier: a Pilot world over a real PostgreSQL target.

``world`` is parametrised over the ledger (``sqlite``: the home's default
file; ``postgres``: a second fresh database passed to ``init_home``), so a test
using it proves its behaviour for both ledgers. ``sqlite_world`` is the faster
single-ledger variant; ``cluster_world`` puts the target on a private server
the test may crash, stop and restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pgcluster import PgCluster, create_database, drop_database

from .pgworld import World, build_world

LEDGERS = ("sqlite", "postgres")


@pytest.fixture(params=LEDGERS)
def world(request: pytest.FixtureRequest, tmp_path: Path, pg_admin_dsn: str,
          pg_dsn: str) -> Iterator[World]:
    """A Pilot world on a fresh target database, for each ledger engine."""
    ledger: str = request.param
    ledger_db: str | None = None
    ledger_dsn: str | None = None
    if ledger == "postgres":
        ledger_db, ledger_dsn = create_database(pg_admin_dsn)
    made: World | None = None
    try:
        made = build_world(tmp_path, pg_dsn, ledger=ledger, ledger_dsn=ledger_dsn)
        yield made
    finally:
        if made is not None:
            made.close()
        if ledger_db is not None:
            drop_database(pg_admin_dsn, ledger_db)


@pytest.fixture
def sqlite_world(tmp_path: Path, pg_dsn: str) -> Iterator[World]:
    """A Pilot world on a fresh target database, with the default SQLite ledger."""
    made = build_world(tmp_path, pg_dsn)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster_world(tmp_path: Path, pg_cluster: PgCluster) -> Iterator[World]:
    """A Pilot world whose target lives on a private server (SQLite ledger)."""
    _, target_dsn = create_database(pg_cluster.dsn())
    made = build_world(tmp_path, target_dsn)
    try:
        yield made
    finally:
        made.close()
