"""The Harbourmaster client turns answers back into typed errors, and lost answers into
``harbour_unavailable`` — the two rules every caller of the API relies on."""

from __future__ import annotations

import httpx
import pytest
from support.harbour import free_port

from marque.clients.harbour import HarbourClient, error_from_problem
from marque.errors import (
    AccountDenied,
    Conflict,
    HarbourUnavailable,
    MarqueError,
    RequestIdInvalid,
    SelfApproval,
)

URL = "http://127.0.0.1:9/v1/requests"


def answer(status: int, body: object = None, *, text: str | None = None) -> httpx.Response:
    request = httpx.Request("POST", URL)
    if text is not None:
        return httpx.Response(status, text=text, request=request)
    return httpx.Response(status, json=body, request=request,
                          headers={"content-type": "application/problem+json"})


def problem(code: str, status: int, detail: str, **extra: object) -> dict[str, object]:
    return {"type": f"urn:marque:error:{code}", "title": code.replace("_", " "),
            "status": status, "detail": detail, "code": code, **extra}


def test_a_problem_becomes_its_typed_error_with_message_and_extra_members() -> None:
    error = error_from_problem(answer(403, problem("self_approval", 403, "you asked for it")))
    assert type(error) is SelfApproval
    assert error.message == "you asked for it" and error.exit_status == 3
    assert error.detail == {}  # the problem's own members are not detail

    denied = error_from_problem(answer(403, problem("account_denied", 403, "denied by entry 2",
                                                    id="rq_1")))
    assert type(denied) is AccountDenied and denied.detail["id"] == "rq_1"

    reused = error_from_problem(answer(422, problem("conflict", 422, "another intent")))
    assert type(reused) is Conflict and reused.message == "another intent"


def test_an_unknown_code_is_still_an_error_that_keeps_its_code() -> None:
    error = error_from_problem(answer(400, problem("from_the_future", 400, "newer server")))
    assert type(error) is MarqueError
    assert error.message == "newer server" and error.detail["code"] == "from_the_future"


@pytest.mark.parametrize("response", [
    answer(502, text="<html>Bad Gateway</html>"),
    answer(500, {"detail": "no code"}),
    answer(404, ["not", "an", "object"]),
])
def test_an_answer_that_is_not_a_problem_is_harbour_unavailable(response: httpx.Response) -> None:
    error = error_from_problem(response)
    assert type(error) is HarbourUnavailable and error.exit_status == 7
    assert error.detail["status"] == response.status_code


def test_an_unreachable_harbourmaster_is_unavailable_and_nothing_was_sent() -> None:
    with HarbourClient(f"http://127.0.0.1:{free_port()}", "token", timeout=2) as client:
        with pytest.raises(HarbourUnavailable) as caught:
            client.list_requests()
    assert caught.value.detail["sent"] is False


def test_a_request_id_is_checked_before_a_post() -> None:
    with HarbourClient("http://127.0.0.1:9", "token") as client:
        with pytest.raises(RequestIdInvalid):
            client.submit({}, "line\nbreak")


@pytest.mark.parametrize(("request_id", "segment"), [
    ("pay-42", "pay-42"), ("a b", "a%20b"), ("a?b#c", "a%3Fb%23c"), ("a/b", "a%2Fb"),
    ("..", "%2E%2E"), (".", "%2E"), ("ü", "%C3%BC"),
])
def test_a_request_id_stays_one_path_segment(request_id: str, segment: str) -> None:
    from marque.clients.harbour import _segment

    assert _segment(request_id) == segment
    url = httpx.Request("GET", f"http://h/v1/requests/{_segment(request_id)}").url
    assert url.raw_path.decode() == f"/v1/requests/{segment}"  # never normalised away
