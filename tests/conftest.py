"""Fixtures every tier shares: a real PostgreSQL server started by the test run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pgcluster import PgCluster, create_database, drop_database


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """An admin DSN: MARQUE_TEST_PG_DSN if set, else a throwaway cluster of our own."""
    given = os.environ.get("MARQUE_TEST_PG_DSN")
    if given:
        yield given
        return
    cluster = PgCluster().init().start()
    try:
        yield cluster.dsn()
    finally:
        cluster.destroy()


@pytest.fixture
def pg_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    name, dsn = create_database(pg_admin_dsn)
    try:
        yield dsn
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A private cluster a test may crash and restart."""
    cluster = PgCluster().init().start()
    try:
        yield cluster
    finally:
        cluster.destroy()
