"""The Harbourmaster's answer when a Pilot refuses a preview or answers another one, for
statement and Effect Set requests alike (DESIGN §11.2).

A real Harbourmaster home (SQLite store, issuer key) whose Pilot is a fake of
:class:`~marque.client.PilotClient` answering ``preview`` as each test says —
the one call these paths make — so every refusal can be produced on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e.harbour_support import TOPUP_ROWS, effect_body, routing_toml

from marque.errors import (
    EffectUnsupported,
    MarqueError,
    PilotUnavailable,
    PreviewFailed,
    UnknownTarget,
)
from marque.harbour.home import HarbourHome
from marque.harbour.principals import Principal
from marque.harbour.service import Harbourmaster
from marque.harbour.setup import init_harbour
from marque.token import new_key, public_jwk

WRITE = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
#: What the fake Pilot does with a preview token: answer it, or raise.
Answer = Callable[[str], Any]


def _unanswered(token: str) -> Any:
    raise AssertionError("the test set no answer for a preview")


class FakePilot:
    """A :class:`~marque.client.PilotClient` whose ``preview`` is ``answer``."""

    def __init__(self) -> None:
        self.answer: Answer = _unanswered

    def preview(self, token: str) -> Any:
        return self.answer(token)

    def close(self) -> None:
        pass


@dataclass
class Harbour:
    """A Harbourmaster, its requester and a registered Pilot ``p1`` serving ``bank``."""

    hm: Harbourmaster
    alice: Principal
    pilot: FakePilot

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        request, _ = self.hm.submit(self.alice, body, None)
        return request

    def refused(self, body: dict[str, Any], error: type[MarqueError]) -> MarqueError:
        with pytest.raises(error) as caught:
            self.hm.submit(self.alice, body, None)
        return caught.value

    def stored(self, id_or_request_id: str) -> dict[str, Any]:
        return self.hm.get_request(self.alice, id_or_request_id)


#: A config that allows every operation at once (an allowed write is issued unpreviewed).
EVERYTHING_ALLOWED = routing_toml(
    {"operation": ["read", "write", "ddl", "other"], "outcome": "allow"})


@pytest.fixture
def make_harbour(tmp_path: Path) -> Iterator[Callable[[str | None], Harbour]]:
    """A Harbourmaster routing by the given config (``None``: the bootstrap profile, which
    delegates writes to one approver)."""
    opened: list[Harbourmaster] = []

    def make(routing: str | None) -> Harbour:
        init_harbour(tmp_path / "harbour", routing_text=routing)
        hm = Harbourmaster.open(HarbourHome(tmp_path / "harbour"))
        opened.append(hm)
        alice, _ = hm.store.add_principal("alice", ["requester"],
                                          public_jwk=public_jwk(new_key()), actor="admin")
        p1, _ = hm.store.add_principal("p1", ["pilot"], actor="admin")
        hm.register_pilot(p1, {"pilot_id": "p1", "url": "http://127.0.0.1:9",
                               "incarnation": "inc-1",
                               "targets": {"bank": {"dialect": "sqlite"}}})
        pilot = FakePilot()
        hm.pilot_client_factory = lambda url: pilot
        return Harbour(hm, alice, pilot)

    try:
        yield make
    finally:
        for hm in opened:
            hm.close()


@pytest.fixture
def delegated(make_harbour: Callable[[str | None], Harbour]) -> Harbour:
    """Writes delegated to one approver: a write is previewed before its Checkpoint."""
    return make_harbour(None)


@pytest.fixture(params=["delegated", "allowed"])
def either(request: pytest.FixtureRequest,
           make_harbour: Callable[[str | None], Harbour]) -> Harbour:
    """Writes delegated, or allowed at once: an Effect Set is previewed either way."""
    return make_harbour(None if request.param == "delegated" else EVERYTHING_ALLOWED)


def _statement(request_id: str) -> dict[str, Any]:
    return {"request_id": request_id, "pilot_id": "p1", "target": "bank",
            "change": {"statements": [{"sql": WRITE, "params": []}]},
            "budget": {"executions": 1, "max_rows": 1}, "ttl_seconds": 600}


def _raise(error: MarqueError) -> Answer:
    def answer(token: str) -> Any:
        raise error
    return answer


def test_an_allowed_statement_request_is_issued_without_a_preview(
        make_harbour: Callable[[str | None], Harbour]) -> None:
    """An allowed write is prepared at once: its Pilot is never asked for a preview."""
    harbour = make_harbour(EVERYTHING_ALLOWED)
    harbour.pilot.answer = _raise(PilotUnavailable("not to be asked"))
    request = harbour.submit(_statement("s-0"))
    assert request["state"] == "prepared" and request["preview"] is None


def test_a_statement_preview_refused_fails_the_request_keeping_the_sqlstate(
        delegated: Harbour) -> None:
    """A refused preview is preview_failed with its SQLSTATE and detail, naming the request."""
    delegated.pilot.answer = _raise(PreviewFailed("constraint", sqlstate="23505",
                                            detail={"statement": 0}))
    error = delegated.refused(_statement("s-1"), PreviewFailed)
    stored = delegated.stored(error.detail["id"])
    assert (error.message, error.sqlstate, error.detail) == (
        "constraint", "23505", {"statement": 0, "id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": "preview_failed", "message": "constraint"}


def test_a_statement_preview_of_something_else_fails_the_request(delegated: Harbour) -> None:
    """An answer that is not this change's preview is preview_failed, saying why."""
    delegated.pilot.answer = lambda token: {"preview_cid": "sha256:" + "0" * 64}
    error = delegated.refused(_statement("s-2"), PreviewFailed)
    stored = delegated.stored(error.detail["id"])
    message = ("the Pilot's preview does not describe this change (its preview_cid does not "
               "match its content)")
    assert (error.message, error.sqlstate, error.detail) == (message, None,
                                                             {"id": stored["id"]})
    assert stored["failure"] == {"code": "preview_failed", "message": message}


def test_an_effect_set_preview_refused_fails_the_request_with_the_pilots_detail(
        either: Harbour) -> None:
    """The Pilot's refusal keeps its code, SQLSTATE and detail, adding the request's id."""
    either.pilot.answer = _raise(EffectUnsupported("no such kind here", sqlstate="0A000",
                                                   detail={"rule": "kind"}))
    error = either.refused(effect_body(TOPUP_ROWS, request_id="e-1"), EffectUnsupported)
    stored = either.stored(error.detail["id"])
    assert (error.message, error.sqlstate, error.detail) == (
        "no such kind here", "0A000", {"rule": "kind", "id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": "effect_unsupported", "message": "no such kind here"}


def test_an_effect_set_preview_of_something_else_fails_the_request(either: Harbour) -> None:
    """An answer that is not a valid Effect preview is preview_failed, saying why."""
    either.pilot.answer = lambda token: {"preview_cid": "sha256:" + "0" * 64}
    error = either.refused(effect_body(TOPUP_ROWS, request_id="e-2"), PreviewFailed)
    stored = either.stored(error.detail["id"])
    assert error.message.startswith("the Pilot's preview does not describe this Effect Set "
                                    "(it is not a valid Effect preview (")
    assert error.detail == {"id": stored["id"]}
    assert stored["failure"] == {"code": "preview_failed", "message": error.message}


def test_an_unreachable_pilot_leaves_an_effect_set_request_preparing(either: Harbour) -> None:
    """pilot_unavailable is raised as it came; the request waits ``preparing`` for a retry."""
    away = PilotUnavailable("away")
    either.pilot.answer = _raise(away)
    assert either.refused(effect_body(TOPUP_ROWS, request_id="e-3"), PilotUnavailable) is away
    assert either.stored("e-3")["state"] == "preparing"


@pytest.mark.parametrize("error", [PilotUnavailable("away"), UnknownTarget("gone")])
def test_a_statement_preview_not_refused_leaves_the_request_preparing(
        delegated: Harbour, error: MarqueError) -> None:
    """Anything but preview_failed (unknown_target too) is raised as it came; the request
    waits ``preparing`` for a retry."""
    delegated.pilot.answer = _raise(error)
    assert delegated.refused(_statement("s-3"), type(error)) is error
    assert delegated.stored("s-3")["state"] == "preparing"
