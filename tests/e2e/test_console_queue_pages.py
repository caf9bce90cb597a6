"""The console's queue through a real ``harbour serve``: one page of requests at a time.

More requests than a page holds: the queue shows the newest page and a link to the older
ones; following the links shows every request exactly once, and the counts per state are
of all of them, not of the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from support.harbour import READ, TIMEOUT, Harbour, HarbourServer, PilotBank, request_body

from marque.harbour.console.views import QUEUE_PAGE


def test_the_queue_pages_through_every_request_and_counts_them_all(tmp_path: Path) -> None:
    harbour = Harbour(tmp_path / "harbour")
    pilot = PilotBank(tmp_path / "p1", harbour)
    harbour.add("alice", "requester", key=pilot.holder_pub)
    harbour.add("audra", "auditor")
    harbour.add("p1", "pilot")
    pilot.start()
    server = HarbourServer(harbour.home)
    try:
        assert server.call("POST", "/v1/pilots", harbour.tokens["p1"],
                           json=pilot.registration()).status_code == 200
        made = set()
        for n in range(QUEUE_PAGE + 3):
            answer = server.call("POST", "/v1/requests", harbour.tokens["alice"],
                                 json=request_body(READ, request_id=f"q-{n}"))
            assert answer.status_code == 201, answer.text
            made.add(answer.json()["id"])

        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as console:
            form = console.get("/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf, form.text
            assert console.post("/login", data={"token": harbour.tokens["audra"],
                                                "csrf": csrf.group(1)}).status_code == 303
            seen: list[str] = []
            page = console.get("/")
            pages = 0
            while True:
                assert page.status_code == 200, page.text
                pages += 1
                # Every state's count is of all the requests, on every page.
                assert re.search(r'data-state-count="prepared">\s*' + str(len(made)) + r"\s*<",
                                 page.text), page.text
                table = page.text.split('data-testid="all"', 1)[1].split("</table>", 1)[0]
                seen += re.findall(r'href="/requests/(rq_[0-9a-f]+)"', table)
                older = re.search(r'href="(/\?cursor=[^"]+)" data-testid="queue-older"',
                                  page.text)
                if older is None:
                    break
                page = console.get(older.group(1).replace("&amp;", "&"))
            assert pages == 2
            assert len(seen) == len(set(seen)) == len(made) and set(seen) == made
            bad = console.get("/?cursor=not-a-cursor")
            assert bad.status_code == 400, bad.text
    finally:
        assert server.stop() == 0
        pilot.stop()
