"""``marque harbour serve --console-session``: how long a console login lasts.

A real ``harbour serve`` process; the login goes through the console's own form
(its CSRF cookie and token), and the session's life is read where it counts: the
cookie's ``Max-Age`` and the expiry the store keeps.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest
from support.harbour import MARQUE, TIMEOUT, Harbour, HarbourServer, cli_env


def login(server: HarbourServer, token: str) -> httpx.Response:
    """Log in through ``/login``'s form; the answer to the form's POST."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        form = client.get("/login")
        assert form.status_code == 200
        match = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert match, form.text
        return client.post("/login", data={"token": token, "csrf": match.group(1)})


def stored_life(home: Path) -> list[float]:
    """Each stored session's life (expiry minus creation), in seconds."""
    with sqlite3.connect(home / "harbour.sqlite3") as conn:
        rows = conn.execute("SELECT expires_at - created_at FROM console_sessions").fetchall()
    return [round(life, 3) for (life,) in rows]


@pytest.mark.parametrize(("option", "seconds"),
                         [((), 8 * 3600), (("--console-session", "15m"), 900)])
def test_a_login_lasts_as_long_as_the_service_was_told(
    tmp_path: Path, option: tuple[str, ...], seconds: int
) -> None:
    """The default is 8 h; ``--console-session 15m`` makes the cookie and the store say 900 s."""
    harbour = Harbour(tmp_path / "harbour")
    token = harbour.add("carol", "approver")
    server = HarbourServer(harbour.home, args=option)
    try:
        answer = login(server, token)
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"]
        assert "marque_session=" in cookie and f"Max-Age={seconds}" in cookie, cookie
        assert stored_life(harbour.home) == [seconds]
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("value", ["30s", "8d", "0", "soon"])
def test_a_console_session_out_of_bounds_is_refused_before_listening(
    tmp_path: Path, value: str
) -> None:
    """Under a minute, over a week, or no duration at all: `input_invalid`, exit 2, no
    listening line and no session table touched."""
    harbour = Harbour(tmp_path / "harbour")
    done = subprocess.run(
        [str(MARQUE), "harbour", "serve", "--home", str(harbour.home), "--listen",
         "127.0.0.1:0", "--console-session", value, "--json"],
        capture_output=True, text=True, env=cli_env(), timeout=TIMEOUT)
    assert done.returncode == 2, done.stderr
    assert '"code": "input_invalid"' in done.stdout + done.stderr
    assert '"url"' not in done.stdout
    assert stored_life(harbour.home) == []
