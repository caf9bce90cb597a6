"""Infrastructure failures through a real `marque pilot serve`, with a PostgreSQL ledger.

The ledger's connections go through a TCP proxy the test can sever: before
the claim the caller gets ``503 ledger_unavailable`` with nothing claimed; cut
while the target's transaction runs, the stream ends ``applied`` with
``recorded: false`` and the target holds the change once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support.harbour import PilotServe
from support.pgcluster import PgCluster, create_database
from support.pgproxy import PgProxy, PgProxyFactory
from support.wait import wait_until

from marque.token import make_proof

from .pgworld import PILOT_ID, World, build_world, marque_id_of

START = {1: 100, 2: 100, 3: 100}
# Holds the target's transaction open for a second, after the statement started.
SLOW_DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1 AND pg_sleep(1) IS NOT NULL"


@pytest.fixture
def served(tmp_path: Path, pg_dsn: str, pg_cluster: PgCluster,
           pg_proxy: PgProxyFactory) -> Iterator[tuple[World, PgProxy, str]]:
    """A world with its ledger behind a proxy, and a `pilot serve` process for it."""
    _, ledger_dsn = create_database(pg_cluster.dsn())
    proxy, proxied = pg_proxy(ledger_dsn)
    world = build_world(tmp_path, pg_dsn, ledger="postgres", ledger_dsn=proxied)
    service = PilotServe(world.home, cwd=tmp_path)
    try:
        service.start()
        yield world, proxy, service.url
    finally:
        proxy.restore()
        service.stop()
        world.close()


def _recorded(url: str, marque_id: str, nonce: str) -> tuple[str, bool]:
    """The service's answer for a nonce: its status, and whether its ledger holds it."""
    response = httpx.get(f"{url}/v1/executions/{marque_id}/{nonce}", timeout=30)
    assert response.status_code == 200, response.text
    outcome = response.json()
    return outcome["status"], outcome["recorded"]


def _body(world: World, token: str, nonce: str) -> dict[str, str]:
    proof = make_proof(world.holder, token, nonce=nonce, pilot_id=PILOT_ID)
    return {"marque": token, "nonce": nonce, "proof": proof}


def _claims(world: World, ledger_dsn_direct: str) -> int:
    with psycopg.connect(ledger_dsn_direct, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM marque_ledger.claims").fetchone()
    return int(row[0]) if row else 0


def test_ledger_unreachable_before_the_claim_is_503_and_nothing_claimed(
        served: tuple[World, PgProxy, str]) -> None:
    """With the ledger's network cut, POST /v1/executions is 503 ledger_unavailable."""
    world, proxy, url = served
    token = world.issue("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    proxy.sever()
    response = httpx.post(f"{url}/v1/executions", json=_body(world, token, "n-1"), timeout=60)
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "ledger_unavailable"
    assert world.balances() == START

    proxy.restore()  # the same nonce is safe to post again: it runs once
    again = httpx.post(f"{url}/v1/executions", json=_body(world, token, "n-1"), timeout=60)
    outcome: dict[str, Any] = json.loads(again.text.splitlines()[-1])["outcome"]
    assert (outcome["status"], outcome["attempt"]) == ("applied", 1)
    assert world.balances() == {**START, 1: 90}


def test_ledger_cut_during_the_target_transaction_streams_applied_not_recorded(
        served: tuple[World, PgProxy, str]) -> None:
    """The ledger's network is cut while the target works: applied, recorded false."""
    world, proxy, url = served
    token = world.issue(SLOW_DEBIT)
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{url}/v1/executions", json=_body(world, token, "n-1"),
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            event = json.loads(line)
            events.append(event)
            if event["event"] == "statement_started":
                proxy.sever()
    kinds = [e["event"] for e in events]
    # A write is answered from the target's commit, its settle just behind (the default
    # settle_write_behind): the settle, not the answer, meets the cut ledger.
    assert "committed" in kinds and "settle_behind" in kinds, kinds
    outcome = events[-1]["outcome"]
    assert (outcome["status"], outcome["recorded"]) == ("applied", False)
    assert world.balances() == {**START, 1: 90}
    [stamp] = world.stamps(marque_id_of(token))
    assert (stamp["kind"], stamp["attempt"]) == ("applied", 1)
    # The settler keeps it and tries again: once the ledger is back, it holds the outcome.
    proxy.restore()
    marque_id = marque_id_of(token)
    wait_until(lambda: _recorded(url, marque_id, "n-1") == ("applied", True),
               "the held outcome to be recorded")
    replay = httpx.post(f"{url}/v1/executions", json=_body(world, token, "n-1"), timeout=60)
    final = json.loads(replay.text.splitlines()[-1])["outcome"]
    assert (final["status"], final["replayed"], final["recorded"]) == ("applied", True, True)
    assert world.balances() == {**START, 1: 90}
