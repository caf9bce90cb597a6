"""The agent role and the parts of `marque mcp` that need no services (docs/agents.md)."""

from __future__ import annotations

import pytest

from marque.agents.answers import error_answer, request_answer
from marque.agents.nonces import execution_nonce
from marque.agents.schemas import TOOLS, check_arguments
from marque.agents.server import loopback_listen
from marque.errors import InvalidInput, NotFound, PilotLost, PilotUnavailable
from marque.harbour.principals import Role, parse_roles


def test_an_agent_is_a_role_of_its_own() -> None:
    assert parse_roles(["agent"]) == frozenset({Role.AGENT})
    for other in ("approver", "requester", "admin", "auditor", "pilot"):
        with pytest.raises(InvalidInput, match="cannot be combined"):
            parse_roles(["agent", other])


def test_the_nonce_is_a_function_of_request_marque_and_attempt() -> None:
    first = execution_nonce("rq_1", "mq_1", 1)
    assert first == execution_nonce("rq_1", "mq_1", 1)
    assert first.startswith("agent-") and len(first) == len("agent-") + 40
    others = {execution_nonce("rq_1", "mq_1", 2), execution_nonce("rq_2", "mq_1", 1),
              execution_nonce("rq_1", "mq_2", 1)}
    assert first not in others and len(others) == 3
    for bad in (0, -1, 1001, True, "1"):
        with pytest.raises(InvalidInput):
            execution_nonce("rq_1", "mq_1", bad)  # type: ignore[arg-type]


def test_arguments_are_checked_against_the_schema() -> None:
    assert {t.name for t in TOOLS} == {"query", "request_change", "get_request",
                                       "wait_for_decision", "execute", "list_requests"}
    assert check_arguments("get_request", {"id": "rq_x"}) == {"id": "rq_x"}
    with pytest.raises(InvalidInput, match="'id' is a required property"):
        check_arguments("get_request", {})
    with pytest.raises(InvalidInput, match="timeout_seconds"):
        check_arguments("wait_for_decision", {"id": "rq_x", "timeout_seconds": 301})
    with pytest.raises(InvalidInput, match="Additional properties"):
        check_arguments("execute", {"id": "rq_x", "nonce": "mine"})
    with pytest.raises(InvalidInput, match="no tool 'approve'"):
        check_arguments("approve", {"id": "rq_x"})


def test_errors_carry_their_code_and_a_next_step() -> None:
    body = error_answer(NotFound("no request", detail={"id": "rq_x"}))["error"]
    assert body["code"] == "not_found" and "list_requests" in body["next_step"]
    lost = error_answer(PilotLost("lost it"))["error"]
    assert lost["code"] == "pilot_lost" and "SAME attempt" in lost["next_step"]
    unsent = error_answer(PilotUnavailable("down", detail={"sent": False}))["error"]
    assert "Nothing was sent" in unsent["next_step"]


def test_a_request_answer_says_what_comes_next() -> None:
    waiting = request_answer({"id": "rq_1", "state": "awaiting_approval"})
    assert "wait_for_decision" in waiting["next_step"]
    assert "execute" in request_answer({"id": "rq_1", "state": "prepared"})["next_step"]
    assert "human" in request_answer({"id": "rq_1", "state": "reconciliation"})["next_step"]


@pytest.mark.parametrize("listen", ["127.0.0.1:8765", "localhost:0", "[::1]:9000"])
def test_http_listens_on_loopback(listen: str) -> None:
    host, port = loopback_listen(listen)
    assert port >= 0 and host in ("127.0.0.1", "localhost", "::1")


@pytest.mark.parametrize("listen", ["0.0.0.0:8765", "10.0.0.1:80", "example.com:80",
                                    "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"])
def test_http_refuses_anything_else(listen: str) -> None:
    with pytest.raises(InvalidInput, match="loopback"):
        loopback_listen(listen)
