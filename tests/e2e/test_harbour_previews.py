"""The Harbourmaster's answer when a Pilot refuses a preview or answers another one, for
statement and Effect Set requests alike (DESIGN §11.2).

Two real Harbourmaster homes (SQLite stores, issuer keys: one on the bootstrap
profile, which delegates writes, one allowing everything), opened in process
with their real :class:`~marque.clients.pilot.PilotClient`, in front of three Pilots
registered by URL:

* ``p1`` — a real ``marque pilot serve`` (one per module) trusting both
  issuers and serving a SQLite ``bank`` and a PostgreSQL ``pgbank`` (a
  database of the test run's real server), so every refusal is one a Pilot
  really makes: a constraint a rolled-back preview trips, a target it does not
  serve, a row an Effect Set updates that does not exist;
* ``liar`` — a real HTTP server on a free loopback port (Starlette on uvicorn,
  in a thread) answering ``POST /v1/previews`` with whatever JSON object the
  test sets: garbage, or a real preview ``p1`` made of something else — what
  no real Pilot can be made to answer;
* ``away`` — a free loopback port nothing listens on.

Nothing is patched: every preview crosses real HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.harbour import (
    TOPUP_ROWS,
    Harbour,
    PilotBank,
    effect_body,
    free_port,
    routing_toml,
)
from support.pgcluster import create_database, drop_database
from support.served import Served

from marque.errors import MarqueError, PilotUnavailable, PreviewFailed, UnknownTarget
from marque.harbour.home import HarbourHome
from marque.harbour.principals import Principal
from marque.harbour.service import Harbourmaster
from marque.pilot.setup import add_target, trust_issuer
from marque.token import new_key, public_jwk

WRITE = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
#: A config that allows every operation at once (an allowed write is issued unpreviewed).
EVERYTHING_ALLOWED = routing_toml(
    {"operation": ["read", "write", "ddl", "other"], "outcome": "allow"})


class Liar:
    """A real HTTP server on a free loopback port answering every ``POST /v1/previews``
    with :attr:`answer` (a JSON object), 200."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] = {}
        self._served = Served(
            Starlette(routes=[Route("/v1/previews", self._preview, methods=["POST"])]))
        self.url = self._served.url

    async def _preview(self, request: Request) -> JSONResponse:
        return JSONResponse(self.answer)

    def stop(self) -> None:
        self._served.stop()


@dataclass
class Routed:
    """One Harbourmaster (opened in process, its real Pilot client) and its requester."""

    hm: Harbourmaster
    alice: Principal

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        request, _ = self.hm.submit(self.alice, body, None)
        return request

    def refused(self, body: dict[str, Any], error: type[MarqueError]) -> MarqueError:
        with pytest.raises(error) as caught:
            self.hm.submit(self.alice, body, None)
        return caught.value

    def stored(self, id_or_request_id: str) -> dict[str, Any]:
        return self.hm.get_request(self.alice, id_or_request_id)


@dataclass
class Stack:
    """What the module's tests share: both Harbourmasters, ``p1``'s home, the liar and the
    URL nothing answers at."""

    delegated: Routed
    allowed: Routed
    bank: PilotBank
    liar: Liar
    away: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_admin_dsn: str) -> Iterator[Stack]:
    """Both Harbourmasters, ``p1`` (real ``pilot serve``), ``liar`` and ``away``."""
    root = tmp_path_factory.mktemp("previews")
    homes = {"delegated": Harbour(root / "delegated"),
             "allowed": Harbour(root / "allowed", routing=EVERYTHING_ALLOWED)}
    bank = PilotBank(root / "pilotbank", homes["delegated"])
    trust_issuer(bank.home, json.loads(homes["allowed"].issuer_key.read_text()))
    pg_name, pg_dsn = create_database(pg_admin_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id integer PRIMARY KEY, "
                     "balance integer NOT NULL CHECK (balance >= 0))")
        conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100)")
    add_target(bank.home, "pgbank", pg_dsn)
    liar = Liar()
    opened: list[Harbourmaster] = []
    try:
        bank.start()
        away = f"http://127.0.0.1:{free_port()}"
        routed: dict[str, Routed] = {}
        for name, home in homes.items():
            hm = Harbourmaster.open(HarbourHome(home.home))
            opened.append(hm)
            alice, _ = hm.store.add_principal("alice", ["requester"],
                                              public_jwk=public_jwk(new_key()), actor="admin")
            registrations = {
                # ghost: registered here, served by no Pilot
                "p1": (bank.url, bank.incarnation, {"bank": "sqlite", "pgbank": "postgres",
                                                    "ghost": "sqlite"}),
                "liar": (liar.url, "inc-liar", {"bank": "sqlite"}),
                "away": (away, "inc-away", {"bank": "sqlite"}),
            }
            for pilot_id, (url, incarnation, targets) in registrations.items():
                principal, _ = hm.store.add_principal(pilot_id, ["pilot"], actor="admin")
                hm.register_pilot(principal, {
                    "pilot_id": pilot_id, "url": url, "incarnation": incarnation,
                    "targets": {t: {"dialect": d} for t, d in targets.items()}})
            routed[name] = Routed(hm, alice)
        yield Stack(routed["delegated"], routed["allowed"], bank, liar, away)
    finally:
        for hm in opened:
            hm.close()
        bank.stop()
        liar.stop()
        drop_database(pg_admin_dsn, pg_name)


@pytest.fixture(params=["delegated", "allowed"])
def either(request: pytest.FixtureRequest, stack: Stack) -> Routed:
    """Writes delegated, or allowed at once: an Effect Set is previewed either way."""
    routed: Routed = getattr(stack, request.param)
    return routed


def _statement(request_id: str, *, pilot_id: str = "p1", target: str = "bank",
               sql: str = WRITE) -> dict[str, Any]:
    return {"request_id": request_id, "pilot_id": pilot_id, "target": target,
            "change": {"statements": [{"sql": sql, "params": []}]},
            "budget": {"executions": 1, "max_rows": 1}, "ttl_seconds": 600}


def _effects(request_id: str, *, pilot_id: str = "p1", target: str = "bank",
             rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An Effect Set topping up accounts 1 and 2 (or ``rows``)."""
    body = effect_body(TOPUP_ROWS[:2] if rows is None else rows, request_id=request_id)
    body.update(pilot_id=pilot_id, target=target)
    return body


def test_an_allowed_statement_request_is_issued_without_a_preview(stack: Stack) -> None:
    """An allowed write is prepared at once: its Pilot (nothing listens there) is never
    asked for a preview."""
    request = stack.allowed.submit(_statement("s-0", pilot_id="away"))
    assert request["state"] == "prepared" and request["preview"] is None


@pytest.mark.parametrize(("target", "sql", "sqlstate", "said", "engine"), [
    ("bank", "UPDATE accounts SET id = 2 WHERE id = 1", None,
     "UNIQUE constraint failed: accounts.id",
     {"sqlite_errorname": "SQLITE_CONSTRAINT_PRIMARYKEY"}),
    ("pgbank", "UPDATE accounts SET id = 2 WHERE id = 1", "23505",
     'duplicate key value violates unique constraint "accounts_pkey"', {}),
    ("pgbank", "UPDATE accounts SET balance = -1 WHERE id = 1", "23514",
     'new row for relation "accounts" violates check constraint "accounts_balance_check"', {}),
], ids=["sqlite-unique", "postgres-unique", "postgres-check"])
def test_a_statement_preview_refused_fails_the_request_keeping_the_sqlstate(
        stack: Stack, target: str, sql: str, sqlstate: str | None, said: str,
        engine: dict[str, Any]) -> None:
    """A preview the Pilot refuses (a constraint its rolled-back run trips) is
    preview_failed with the Pilot's message, SQLSTATE and detail, naming the request."""
    error = stack.delegated.refused(
        _statement(f"s-1-{target}-{sqlstate}", target=target, sql=sql), PreviewFailed)
    stored = stack.delegated.stored(error.detail["id"])
    assert error.message.startswith(f"preview on target {target} (")
    assert error.message.endswith(f"): statement 0 failed: {said}; everything was rolled back")
    # The Pilot's detail crosses the wire as the problem's extension members.
    assert (error.sqlstate, error.detail) == (
        sqlstate, {**engine, "statement": 0, "id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": "preview_failed", "message": error.message}


@pytest.mark.parametrize("answer", ["garbage", "another change's preview"])
def test_a_statement_preview_of_something_else_fails_the_request(
        stack: Stack, answer: str) -> None:
    """An answer that is not this change's preview — garbage, or a real preview of another
    change — is preview_failed, saying why."""
    if answer == "garbage":
        stack.liar.answer = {"preview_cid": "sha256:" + "0" * 64}
        why = "its preview_cid does not match its content"
    else:
        other = stack.delegated.submit(_statement("s-2-other", sql=WRITE.replace("10", "20")))
        assert other["state"] == "awaiting_approval"
        stack.liar.answer, why = other["preview"], "another change_cid"
    error = stack.delegated.refused(_statement(f"s-2-{answer}", pilot_id="liar"),
                                    PreviewFailed)
    stored = stack.delegated.stored(error.detail["id"])
    message = f"the Pilot's preview does not describe this change ({why})"
    assert (error.message, error.sqlstate, error.detail) == (message, None,
                                                             {"id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": "preview_failed", "message": message}


ABSENT = {"rule": "update_target_absent", "effect_id": "topup", "row": '{"id":3}'}


@pytest.mark.parametrize(("target", "rows", "error_type", "message", "pilot_detail"), [
    ("ghost", TOPUP_ROWS[:2], UnknownTarget,
     "preview token names target ghost, which this Pilot does not serve (see `marque pilot "
     "target list`)", {}),
    ("bank", TOPUP_ROWS, PreviewFailed, 'topup: row {"id":3} to update does not exist',
     ABSENT),
    ("pgbank", TOPUP_ROWS, PreviewFailed, 'topup: row {"id":3} to update does not exist',
     ABSENT),
], ids=["unknown_target", "preview_failed-sqlite", "preview_failed-postgres"])
def test_an_effect_set_preview_refused_fails_the_request_with_the_pilots_refusal(
        either: Routed, target: str, rows: list[dict[str, Any]],
        error_type: type[MarqueError], message: str, pilot_detail: dict[str, Any]) -> None:
    """The Pilot's refusal keeps its code, message, SQLSTATE and detail (its `rule`…),
    adding the request's id."""
    error = either.refused(_effects(f"e-1-{target}", target=target, rows=rows), error_type)
    stored = either.stored(error.detail["id"])
    assert (type(error), error.message, error.sqlstate, error.detail) == (
        error_type, message, None, {**pilot_detail, "id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": error_type.code, "message": message}


@pytest.mark.parametrize("answer", ["garbage", "another Pilot's preview"])
def test_an_effect_set_preview_of_something_else_fails_the_request(
        stack: Stack, either: Routed, answer: str) -> None:
    """An answer that is not a valid Effect preview of this set on this Pilot — garbage,
    or a real preview another Pilot (``p1``) made of it — is preview_failed, saying why."""
    if answer == "garbage":
        stack.liar.answer = {"preview_cid": "sha256:" + "0" * 64}
        why = "it is not a valid Effect preview ("
    else:
        real = stack.delegated.submit(_effects("e-2-p1"))  # asked again: the same request
        assert real["state"] == "awaiting_approval"
        stack.liar.answer, why = real["preview"], "another Pilot)"
    error = either.refused(_effects(f"e-2-{answer}", pilot_id="liar"), PreviewFailed)
    stored = either.stored(error.detail["id"])
    assert error.message.startswith(
        "the Pilot's preview does not describe this Effect Set (" + why), error.message
    assert (error.sqlstate, error.detail) == (None, {"id": stored["id"]})
    assert stored["state"] == "failed"
    assert stored["failure"] == {"code": "preview_failed", "message": error.message}


def test_an_unreachable_pilot_leaves_an_effect_set_request_preparing(
        stack: Stack, either: Routed) -> None:
    """pilot_unavailable is raised naming the stored request, which waits ``preparing`` for
    the Harbourmaster's next attempt."""
    error = either.refused(_effects("e-3", pilot_id="away"), PilotUnavailable)
    assert error.message.startswith(f"the Pilot at {stack.away} cannot be reached (")
    stored = either.stored("e-3")
    assert error.detail["id"] == stored["id"] and error.detail["attempt"] == 1
    assert stored["state"] == "preparing"
    assert stored["failure"]["code"] == "pilot_unavailable"


@pytest.mark.parametrize(("pilot_id", "target", "error_type"), [
    ("away", "bank", PilotUnavailable), ("p1", "ghost", UnknownTarget)],
    ids=["pilot_unavailable", "unknown_target"])
def test_a_statement_preview_not_refused_leaves_the_request_preparing(
        stack: Stack, pilot_id: str, target: str, error_type: type[MarqueError]) -> None:
    """Anything but preview_failed (unknown_target too) is raised as it came (an unreachable
    Pilot naming the request the Harbourmaster will try again); the request waits
    ``preparing`` for a retry."""
    request_id = f"s-3-{pilot_id}"
    error = stack.delegated.refused(_statement(request_id, pilot_id=pilot_id, target=target),
                                    error_type)
    stored = stack.delegated.stored(request_id)
    assert type(error) is error_type
    assert error.detail.get("id") == (stored["id"] if error_type is PilotUnavailable else None)
    assert stored["state"] == "preparing"
