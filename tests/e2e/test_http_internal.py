"""A fault of ours inside either service is logged with its traceback and answered
``internal`` (500) without the exception's text (DESIGN §10; ``marque.httpcommon``).

Both apps are the real ones (:class:`PilotService` over a Pilot opened from a real
home, :class:`HarbourService` over a real Harbourmaster home) on uvicorn in a thread
on a free loopback port, asked over real HTTP. The crash is one core call of the real
instance made to raise what no Marque code raises on purpose (a ``RuntimeError``
whose text holds a secret): the only way to make Marque fail where it has no bug.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harbour import Harbour
from support.served import Served

from marque.harbour.home import HarbourHome
from marque.harbour.http import HarbourService
from marque.harbour.service import Harbourmaster
from marque.pilot import open_pilot
from marque.pilot.http import PilotService
from marque.pilot.setup import init_home

SECRET = "postgresql://app:hunter2@db/bank"


def crash(*args: Any, **kwargs: Any) -> Any:
    """A core call that fails as a bug would, its text holding something secret."""
    raise RuntimeError(f"cannot go on with {SECRET}")


@pytest.fixture
def pilot_url(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A real Pilot's service, and the Pilot (to make one of its calls crash)."""
    init_home(tmp_path / "pilot", "p1")
    pilot = open_pilot(tmp_path / "pilot")
    service = PilotService(pilot)
    served = Served(service.app)
    try:
        yield served.url, pilot
    finally:
        served.stop()
        service.close()
        pilot.close()


@pytest.fixture
def harbour_url(tmp_path: Path) -> Iterator[tuple[str, Harbourmaster, str]]:
    """A real Harbourmaster's service, the Harbourmaster, and its admin's token."""
    home = Harbour(tmp_path / "harbour")
    hm = Harbourmaster.open(HarbourHome(home.home))
    service = HarbourService(hm)
    served = Served(service.app)
    try:
        yield served.url, hm, home.tokens["admin"]
    finally:
        served.stop()
        service.close()
        hm.close()


def assert_internal(response: httpx.Response, caplog: pytest.LogCaptureFixture) -> None:
    """500 ``internal`` without the exception's text; the log holds it, traceback and all."""
    assert response.status_code == 500, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == "internal" and body["type"] == "urn:marque:error:internal"
    assert "hunter2" not in response.text and "RuntimeError" not in response.text
    assert response.headers["x-request-id"]
    logged = [r for r in caplog.records if r.name == "marque.httpcommon"]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    assert SECRET in caplog.text and "Traceback" in caplog.text


def test_a_crash_in_a_pilot_read_is_logged_and_answered_internal(
        pilot_url: tuple[str, Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, pilot = pilot_url
    monkeypatch.setattr(pilot, "outcome", crash)
    with caplog.at_level(logging.ERROR, logger="marque.httpcommon"):
        response = httpx.get(f"{url}/v1/executions/m_1/n_1", timeout=10)
    assert_internal(response, caplog)


def test_a_crash_in_a_pilot_execution_is_logged_and_answered_internal(
        pilot_url: tuple[str, Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, pilot = pilot_url
    monkeypatch.setattr(pilot, "execute", crash)
    with caplog.at_level(logging.ERROR, logger="marque.httpcommon"):
        response = httpx.post(f"{url}/v1/executions", timeout=10,
                              json={"marque": "m", "nonce": "n_1", "proof": None})
    assert_internal(response, caplog)


def test_a_crash_in_the_harbourmaster_is_logged_and_answered_internal(
        harbour_url: tuple[str, Harbourmaster, str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, hm, admin = harbour_url
    monkeypatch.setattr(hm, "authenticate", crash)
    with caplog.at_level(logging.ERROR, logger="marque.httpcommon"):
        response = httpx.get(f"{url}/v1/whoami", timeout=10,
                             headers={"Authorization": f"Bearer {admin}"})
    assert_internal(response, caplog)
