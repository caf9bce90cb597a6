"""The HTTP floor: what one request costs with no Pilot behind it.

A trivial Starlette endpoint on uvicorn (the stack ``pilot serve`` uses) in a
child process, called over one keep-alive loopback connection by httpx (the
client ``marque exec --pilot`` and ``bench/http_peer.py`` use) and by Python's
own ``http.client``, side by side: the difference is client CPU, which
``marque_http`` pays on top of the Pilot. Prints medians in ms.

    .venv/bin/python bench/http_floor.py
"""

from __future__ import annotations

import http.client
import socket
import statistics
import subprocess
import sys
import time

import httpx

SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
async def answer(request):
    await request.body()
    return Response(b'{"ok": true}\\n', media_type="application/json")
app = Starlette(routes=[Route("/", answer, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
"""
REQUESTS = 2000
WARMUP = 200


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def main() -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        _wait(port)
        body = b'{"marque": "x", "nonce": "n"}'
        headers = {"content-type": "application/json"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            conn = http.client.HTTPConnection("127.0.0.1", port)

            def via_httpx() -> None:
                client.post("/", content=body, headers=headers).read()

            def via_stdlib() -> None:
                conn.request("POST", "/", body=body, headers=headers)
                conn.getresponse().read()

            times: dict[str, list[float]] = {"httpx": [], "http.client": []}
            for i in range(REQUESTS + WARMUP):  # interleaved: the machine's noise hits both
                for name, call in (("httpx", via_httpx), ("http.client", via_stdlib)):
                    start = time.perf_counter()
                    call()
                    if i >= WARMUP:
                        times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(xs) * 1000 for name, xs in times.items()}
        for name, ms in medians.items():
            print(f"{name:12} p50 {ms:.3f} ms")
        print(f"httpx / http.client: {medians['httpx'] / medians['http.client']:.2f}x")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
