"""Both HTTP clients read a problem document back by one rule (``marque.clients.problems``):
the same answer is the same typed error from a Pilot and from a Harbourmaster; only what an
answer that is not a problem means differs, per client."""

from __future__ import annotations

import httpx
import pytest

from marque.clients.harbour import error_from_problem as harbour_error
from marque.clients.pilot import _execution_error as pilot_error
from marque.clients.problems import error_of, problem_error
from marque.errors import HarbourUnavailable, MarqueError, PopKeyMismatch, StatementError

URL = "http://127.0.0.1:9/v1/executions"


def answer(status: int, body: object = None, *, text: str | None = None) -> httpx.Response:
    request = httpx.Request("POST", URL)
    if text is not None:
        return httpx.Response(status, text=text, request=request)
    return httpx.Response(status, json=body, request=request,
                          headers={"content-type": "application/problem+json"})


STATEMENT_ERROR = {"type": "urn:marque:error:statement_error", "title": "statement error",
                   "status": 422, "detail": "no such table", "code": "statement_error",
                   "sqlstate": "42P01", "statement": 0, "target": "bank"}


@pytest.mark.parametrize("read", [problem_error, harbour_error, pilot_error])
def test_every_client_reads_one_problem_as_one_error(read: object) -> None:
    error = read(answer(422, STATEMENT_ERROR))  # type: ignore[operator]
    assert type(error) is StatementError
    assert error.message == "no such table" and error.sqlstate == "42P01"
    assert error.detail == {"statement": 0, "target": "bank"}  # no problem member


def test_a_problem_without_detail_says_its_title_and_a_newer_code_is_kept() -> None:
    titled = problem_error(answer(403, {"code": "pop_key_mismatch", "title": "pop key mismatch",
                                        "status": 403}))
    assert type(titled) is PopKeyMismatch and titled.message == "pop key mismatch"
    newer = problem_error(answer(400, {"code": "from_the_future", "detail": "newer server"}))
    assert type(newer) is MarqueError and newer.detail["code"] == "from_the_future"
    assert newer.message == "newer server"


@pytest.mark.parametrize("response", [
    answer(502, text="<html>Bad Gateway</html>"),
    answer(500, {"detail": "no code"}),
    answer(404, ["not", "an", "object"]),
    answer(500, {"code": 7, "detail": "a code that is not a string"}),
])
def test_an_answer_without_a_code_is_no_problem_and_each_client_says_what_it_means(
        response: httpx.Response) -> None:
    assert problem_error(response) is None
    lost = harbour_error(response)
    assert type(lost) is HarbourUnavailable and lost.detail == {
        "status": response.status_code, "sent": True}
    execution = pilot_error(response)  # claims nothing about whether it ran: exit 1
    assert type(execution) is MarqueError and execution.exit_status == 1
    assert execution.detail == {"status": response.status_code}


def test_a_stream_error_line_is_read_by_the_same_registry() -> None:
    assert type(error_of("statement_error", "boom", "42P01")) is StatementError
    unknown = error_of("from_the_future", "later")
    assert type(unknown) is MarqueError and unknown.detail == {"code": "from_the_future"}
    assert error_of("statement_error", "x", 5).sqlstate is None
