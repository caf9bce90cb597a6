"""Fixtures every tier shares, and the markers that sort the suite by what it needs.

Every test is marked with its tier, the folder it lives in (``unit``, ``store``,
``harbour_store``, ``integration``, ``pg``, ``e2e``, ``browser``, ``soak``), and
with what it needs beyond ``pip install`` (README, "Running tier by tier"):

* ``pg`` — PostgreSQL server binaries: the ``pg`` folder, any test using one of
  :data:`PG_FIXTURES`, and any case of an engine fixture parametrised onto
  ``"postgres"`` (a test parametrised directly on the word, a dialect, needs no server);
* ``browser`` — Chromium: the ``browser`` folder, and any test using the
  ``browser`` fixture;
* ``oidc`` — node and the ``oidc-provider`` package: any test in a module that
  imports the provider's support (:data:`OIDC_SUPPORT`);
* ``faketime`` — libfaketime, marked in the few modules that preload it.

So ``pytest -m "not pg and not browser and not oidc"`` runs on a machine with
none of PostgreSQL, Chromium or node (``make test-fast``).
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
#: Fixtures that launch Chromium.
BROWSER_FIXTURES = frozenset({"browser"})
#: The modules that start the OpenID provider (node): a test module using them needs it.
OIDC_SUPPORT = frozenset({"e2e.oidc_support", "oidc_support", "browser.oidc_world"})


def direct_parameters(item: pytest.Item) -> set[str]:
    """The names ``item`` is parametrised on directly (``@pytest.mark.parametrize``, not
    ``indirect``): plain values such as a dialect's name, not an engine a fixture opens."""
    names: set[str] = set()
    for mark in item.iter_markers("parametrize"):
        if mark.kwargs.get("indirect"):
            continue
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        if isinstance(argnames, str):
            argnames = argnames.split(",")
        names.update(name.strip() for name in argnames)
    return names


def needs_postgres(item: pytest.Item) -> bool:
    """Whether ``item`` reaches a PostgreSQL server: by a fixture of :data:`PG_FIXTURES`, or
    by a fixture parametrised onto the ``"postgres"`` engine (which opens one lazily)."""
    if PG_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    direct = direct_parameters(item)
    return any(value == "postgres" and name not in direct
               for name, value in callspec.params.items())


def needs_oidc_provider(item: pytest.Item) -> bool:
    """Whether ``item``'s module imports the support that starts the OpenID provider."""
    module = getattr(item, "module", None)
    return module is not None and any(
        getattr(value, "__module__", None) in OIDC_SUPPORT for value in vars(module).values())


def needs(item: pytest.Item) -> set[str]:
    """The markers for what ``item`` needs beyond its tier's folder."""
    found = set()
    if needs_postgres(item):
        found.add("pg")
    if BROWSER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        found.add("browser")
    if needs_oidc_provider(item):
        found.add("oidc")
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its folder) and with what it needs (:func:`needs`)."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        marks = needs(item) | ({tier} if tier is not None else set())
        for mark in sorted(marks - {m.name for m in item.iter_markers()}):
            item.add_marker(mark)


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
