"""End-to-end fixtures: a real Pilot world built through the real ``marque`` CLI."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_support import Result, Service, World, run_cli


@pytest.fixture(scope="session")
def world_template(tmp_path_factory: pytest.TempPathFactory) -> World:
    """One world built through the CLI: bank.db, keys, `pilot init`, `trust`, `target add`."""
    return World(tmp_path_factory.mktemp("template")).build()


@pytest.fixture
def world(world_template: World, tmp_path: Path) -> World:
    """A fresh Pilot world: bank.db (1→100, 2→100), keys, pilot p1 trusting the issuer.

    It is a private copy of the CLI-built template (its own ledger, logbook and
    bank), so tests never see each other's state.
    """
    return world_template.copy_to(tmp_path / "world")


@pytest.fixture
def run() -> Callable[..., Result]:
    """``run(*args)`` → (returncode, stdout, stderr) of the real CLI, with a timeout."""
    return run_cli


@pytest.fixture
def service(world: World) -> Iterator[Service]:
    """A `marque pilot serve` process for ``world`` on a free loopback port, stopped after."""
    running = Service(world)
    try:
        yield running
    finally:
        running.stop()
