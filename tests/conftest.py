"""Fixtures every tier shares: a real PostgreSQL server started by the test run.

Every test is also marked with its tier, the folder it lives in (``unit``,
``store``, ``harbour_store``, ``integration``, ``pg``, ``e2e``, ``browser``,
``soak``), and with ``pg`` wherever it needs a PostgreSQL server: the ``pg``
folder, any test using ``pg_admin_dsn``, ``pg_dsn`` or ``pg_cluster``, and any
case parametrised onto the ``"postgres"`` engine. So ``pytest -m "not pg and
not browser"`` runs on a machine with neither PostgreSQL nor Chromium.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pgcluster import PgCluster, create_database, drop_database
from support.pgproxy import PgProxy, PgProxyFactory

TESTS = Path(__file__).resolve().parent
#: The folders of tests/ that are tiers; each is also a marker (registered in pyproject).
TIERS = ("unit", "store", "harbour_store", "integration", "pg", "e2e", "browser", "soak")
#: Fixtures that start or use a PostgreSQL server.
PG_FIXTURES = frozenset({"pg_admin_dsn", "pg_dsn", "pg_cluster", "pg_proxy"})


def needs_postgres(item: pytest.Item) -> bool:
    """Whether ``item`` reaches a PostgreSQL server (by fixture, or by its parameters)."""
    if PG_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgres" in callspec.params.values()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its folder), and with ``pg`` if it needs PostgreSQL."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is not None:
            item.add_marker(tier)
        if tier != "pg" and needs_postgres(item):
            item.add_marker("pg")


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


@pytest.fixture
def pg_proxy() -> Iterator[PgProxyFactory]:
    """``pg_proxy(dsn)``: a COMMIT-losing TCP proxy in front of ``dsn``'s server, and the
    DSN that goes through it. Every proxy a test made is closed after it (after the
    fixtures that use them, which the test's teardown closes first)."""
    made: list[PgProxy] = []

    def make(dsn: str) -> tuple[PgProxy, str]:
        proxy, proxied = PgProxy.for_dsn(dsn)
        made.append(proxy)
        return proxy, proxied

    try:
        yield make
    finally:
        for proxy in made:
            proxy.close()
