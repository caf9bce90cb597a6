"""``POST /v1/executions`` on its own path past Starlette's stack: what it still answers.

The service's hottest route skips the middleware and router (``PilotService._front``);
these tests hold it to what the routed stack gave every other route: an
``X-Request-Id`` on every answer, RFC 9457 problems for a bad body, the router's
404 and 405 beside it, and a stream of events. A real ``marque pilot serve``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from e2e_support import Service, World

from marque.token import make_proof

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
GENERATED = re.compile(r"req_[0-9a-f]{32}")


def body(world: World, marque: Any, nonce: str) -> dict[str, str]:
    token = marque.read_text().strip()
    key = json.loads(world.holder_key.read_text())
    return {"marque": token, "nonce": nonce,
            "proof": make_proof(key, token, nonce=nonce, pilot_id=world.pilot_id)}


def test_every_answer_of_the_route_carries_a_request_id(world: World, service: Service) -> None:
    """The caller's sane X-Request-Id comes back; none, or one that is not sane, gets a
    fresh one: on a stream, on a one-line answer and on a problem alike."""
    url = f"{service.url}/v1/executions"
    marque = world.issue([DEBIT], executions=3)
    with httpx.Client(timeout=30) as client:
        given = client.post(url, json=body(world, marque, "r1"),
                            headers={"X-Request-Id": "trace-9.a:b_c-d"})
        assert (given.status_code, given.headers["x-request-id"]) == (200, "trace-9.a:b_c-d")
        fresh = client.post(url + "?events=false", json=body(world, marque, "r2"))
        assert fresh.status_code == 200
        assert GENERATED.fullmatch(fresh.headers["x-request-id"])
        insane = client.post(url, json=body(world, marque, "r3"),
                             headers={"X-Request-Id": "two words\tand a tab"})
        assert GENERATED.fullmatch(insane.headers["x-request-id"])
        refused = client.post(url, json={**body(world, marque, "r4"), "proof": None},
                              headers={"X-Request-Id": "trace-refused"})
        assert (refused.status_code, refused.json()["code"]) == (403, "pop_missing")
        assert refused.headers["x-request-id"] == "trace-refused"
        # Two answers, two ids: nothing of one request leaks into the next.
        assert fresh.headers["x-request-id"] != insane.headers["x-request-id"]
    assert world.ledger_count("claims") == 3
    assert world.balances()[1] == 70


def test_a_bad_body_is_a_problem_with_its_detail_and_claims_nothing(
        world: World, service: Service) -> None:
    """Not JSON, not an object, wrong member types: 400 input_invalid problem documents
    with a detail saying what is wrong and an X-Request-Id; nothing claimed."""
    url = f"{service.url}/v1/executions"
    good = body(world, world.issue([DEBIT]), "b1")
    cases: list[tuple[bytes, str]] = [
        (b"not json", "JSON object"),
        (b"\xff\xfe\x00garbage", "JSON object"),
        (b"[1, 2]", "JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON object"),  # deeper than the parser goes
        (json.dumps({**good, "marque": 7}).encode(), "`marque` and `nonce`"),
        (json.dumps({k: v for k, v in good.items() if k != "nonce"}).encode(),
         "`marque` and `nonce`"),
        (json.dumps({**good, "proof": ["x"]}).encode(), "`proof` must be a string"),
    ]
    with httpx.Client(timeout=30) as client:
        for content, said in cases:
            response = client.post(url, content=content,
                                   headers={"Content-Type": "application/json",
                                            "X-Request-Id": "bad-body"})
            assert response.status_code == 400, content[:40]
            assert response.headers["content-type"].startswith("application/problem+json")
            assert response.headers["x-request-id"] == "bad-body"
            problem = response.json()
            assert (problem["code"], problem["status"]) == ("input_invalid", 400)
            assert problem["type"] == "urn:marque:error:input_invalid"
            assert said in problem["detail"], (content[:40], problem)
    assert world.ledger_count("claims") == 0
    assert world.balances()[1] == 100


def test_other_paths_and_methods_get_the_routers_answers(world: World, service: Service) -> None:
    """Beside the route: another method on its path is 405 (with Allow), another path is
    404, a path under it is the follow route; each with an X-Request-Id."""
    with httpx.Client(base_url=service.url, timeout=30) as client:
        for method in ("GET", "PUT", "DELETE"):
            response = client.request(method, "/v1/executions")
            assert response.status_code == 405, method
            assert "POST" in response.headers["allow"]
            assert "x-request-id" in response.headers
            # a problem document, as every other error of the API
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["code"] == "method_not_allowed"
        for path in ("/v1/execution", "/v1/executionsx", "/v2/executions"):
            response = client.post(path, json={})
            assert response.status_code == 404, path
            assert "x-request-id" in response.headers
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["code"] == "not_found"
        missing = client.get("/v1/executions/mq_none/n1")
        assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
        assert "x-request-id" in missing.headers
    assert world.ledger_count("claims") == 0


def test_the_route_streams_events_and_frames_a_one_line_answer_by_its_length(
        world: World, service: Service) -> None:
    """With events, the answer is chunked NDJSON (events, then the outcome); the outcome
    alone (events=false) is one line sent with its Content-Length; both end the stream
    so one keep-alive connection carries the next request."""
    url = f"{service.url}/v1/executions"
    marque = world.issue([DEBIT], executions=2)
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url, json=body(world, marque, "s1")) as streamed:
            assert streamed.status_code == 200
            assert streamed.headers["content-type"].startswith("application/x-ndjson")
            events = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
        kinds = [e["event"] for e in events]
        assert kinds[0] == "claimed" and "committed" in kinds and kinds[-1] == "outcome"
        assert events[-1]["outcome"]["status"] == "applied"
        quiet = client.post(url + "?events=false", json=body(world, marque, "s2"))
        assert quiet.status_code == 200
        assert "transfer-encoding" not in quiet.headers
        assert int(quiet.headers["content-length"]) == len(quiet.content)
        [line] = quiet.content.splitlines()
        assert json.loads(line)["outcome"]["status"] == "applied"
        assert quiet.content.endswith(b"\n")
    assert world.balances()[1] == 80


def _self_signed(where: Any) -> tuple[Any, Any]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = where / "cert.pem", where / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_the_route_streams_over_tls_too(world: World) -> None:
    """--tls-cert/--tls-key: an execution streams its events and outcome over HTTPS
    (every connection's writes go through the service's coalescing transport, TLS too),
    with its X-Request-Id, and a second one rides the same connection."""
    import ssl
    import subprocess

    from e2e_support import MARQUE, cli_env

    cert, key = _self_signed(world.root)
    proc = subprocess.Popen(
        [str(MARQUE), "pilot", "serve", "--home", str(world.home), "--listen", "127.0.0.1:0",
         "--tls-cert", str(cert), "--tls-key", str(key), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True, env=cli_env(), cwd=world.root)
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["url"]
        assert url.startswith("https://127.0.0.1:")
        marque = world.issue([DEBIT], executions=2)
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)),
                          timeout=30) as client:
            with client.stream("POST", f"{url}/v1/executions", json=body(world, marque, "t1"),
                               headers={"X-Request-Id": "over-tls"}) as streamed:
                assert (streamed.status_code, streamed.headers["x-request-id"]) == (
                    200, "over-tls")
                events = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
            assert events[0]["event"] == "claimed"
            assert events[-1]["outcome"]["status"] == "applied"
            quiet = client.post(f"{url}/v1/executions?events=false",
                                json=body(world, marque, "t2"))
            assert json.loads(quiet.content)["outcome"]["status"] == "applied"
        assert world.balances()[1] == 80
    finally:
        proc.terminate()
        proc.wait(timeout=60)
