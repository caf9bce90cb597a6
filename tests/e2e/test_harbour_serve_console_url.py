"""`marque harbour serve` says where its web console is, once listening.

Without `--json` it is a line of its own on stderr ("Console: URL/"), beside the service's
URL; with `--json` stdout stays one JSON object, which carries it as `console`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from support.harbour import MARQUE, TIMEOUT, Harbour, HarbourServer, cli_env


def test_serve_prints_the_consoles_url(tmp_path: Path) -> None:
    harbour = Harbour(tmp_path / "harbour")
    proc = subprocess.Popen(
        [str(MARQUE), "harbour", "serve", "--home", str(harbour.home), "--listen",
         "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, env=cli_env())
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        console = [line for line in lines if line.startswith("Console: ")]
        assert console, lines
        url = console[0].removeprefix("Console: ").strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        page = httpx.get(url + "login", timeout=TIMEOUT)
        assert page.status_code == 200 and "<form" in page.text
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_json_carries_the_consoles_url(tmp_path: Path) -> None:
    server = HarbourServer(Harbour(tmp_path / "harbour").home)
    try:
        assert set(server.ready) == {"url", "harbour_id", "console"}
        assert server.ready["console"] == server.url + "/"
        assert httpx.get(server.ready["console"] + "login", timeout=TIMEOUT).status_code == 200
    finally:
        assert server.stop() == 0
