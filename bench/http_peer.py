"""``marque_http``: the same executions through a real ``marque pilot serve`` on loopback.

The bed is a Pilot home like ``MarqueBed``'s (SQLite ledger, the PostgreSQL
target), served by a child process; each client is the client ``marque exec --pilot``
uses (``marque.clients.pilot.PilotClient``: httpx, one keep-alive connection) posting
``{marque, nonce, proof}`` and reading the NDJSON stream to its outcome line.
Only the request is timed; proofs are made before.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness import Cell, Op
from scenarios import EXECUTIONS, TTL_SECONDS, UPDATE, client_row

from marque.clients.pilot import PilotClient
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import Budget, Change, Statement, issue_marque, make_proof, new_key, public_jwk

MARQUE = str(Path(sys.executable).parent / "marque")


class HttpBed:
    """A Pilot home served by ``marque pilot serve`` in a child process."""

    def __init__(self, root: Path, name: str, target_dsn: str, workers: int = 1, *,
                 ledger_dsn: str | None = None) -> None:
        self.home = root / name
        self.issuer = new_key()
        self.holder = new_key()
        init_home(self.home, f"bench-{name}", ledger_dsn)
        trust_issuer(self.home, public_jwk(self.issuer))
        add_target(self.home, "bench", target_dsn)
        self.proc = subprocess.Popen(
            [MARQUE, "pilot", "serve", "--home", str(self.home), "--listen", "127.0.0.1:0",
             "--json", "--workers", str(workers)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline())
        self.url: str = ready["url"]
        self.pilot_id: str = ready["pilot_id"]
        self.incarnation: str = ready["incarnation"]

    def issue(self, row: int) -> str:
        return issue_marque(
            self.issuer, pilot_id=self.pilot_id, incarnation=self.incarnation, target="bench",
            holder_jwk=public_jwk(self.holder), change=Change((Statement(UPDATE, (row,)),)),
            budget=Budget(EXECUTIONS, 1), ttl_seconds=TTL_SECONDS)

    def proof(self, token: str, nonce: str) -> str:
        return make_proof(self.holder, token, nonce=nonce, pilot_id=self.pilot_id)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


class HttpCell(Cell):
    """Fresh nonces through ``POST /v1/executions``, one ``PilotClient`` per client."""

    def __init__(self, bed: HttpBed, clients: int, name: str = "marque_http") -> None:
        super().__init__(name, clients)
        self.bed = bed
        self.tokens = [bed.issue(client_row(c)) for c in range(clients)]
        self.clients_http = [PilotClient(bed.url, timeout=60) for _ in range(clients)]

    def extra(self) -> dict[str, Any]:
        return {}

    def prepare(self, per_client: int) -> list[Op]:
        ops = []
        for c in range(self.clients):
            nonces = [f"n-{uuid.uuid4().hex}" for _ in range(per_client)]
            proofs = [self.bed.proof(self.tokens[c], n) for n in nonces]
            ops.append(self._op(self.clients_http[c], self.tokens[c], nonces, proofs))
        return ops

    @staticmethod
    def _op(client: PilotClient, token: str, nonces: list[str], proofs: list[str]) -> Op:
        def op(i: int) -> None:
            outcome = client.execute(token, nonces[i], lambda: proofs[i])
            if outcome.status != "applied" or outcome.replayed:
                raise RuntimeError(f"expected a fresh applied, got {outcome.to_dict()}")

        return op


class StdlibHttpCell(HttpCell):
    """``marque_http`` through Python's own ``http.client``: what the service itself adds.

    httpx spends about a millisecond of client CPU per request on this machine
    (``bench/http_floor.py``); this cell measures the same service without it.
    """

    def __init__(self, bed: HttpBed, clients: int) -> None:
        super().__init__(bed, clients, "marque_http_stdlib")
        self.address = urlsplit(bed.url)

    def prepare(self, per_client: int) -> list[Op]:
        ops = []
        for c in range(self.clients):
            nonces = [f"n-{uuid.uuid4().hex}" for _ in range(per_client)]
            bodies = [json.dumps({"marque": self.tokens[c], "nonce": n,
                                  "proof": self.bed.proof(self.tokens[c], n)}).encode()
                      for n in nonces]
            # A fresh connection per round: the server closes idle keep-alive
            # connections between rounds, and http.client does not reconnect.
            conn = http.client.HTTPConnection(self.address.hostname or "127.0.0.1",
                                              self.address.port, timeout=60)
            ops.append(self._stdlib_op(conn, bodies))
        return ops

    @staticmethod
    def _stdlib_op(conn: http.client.HTTPConnection, bodies: list[bytes]) -> Op:
        def op(i: int) -> None:
            conn.request("POST", "/v1/executions", body=bodies[i],
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read().decode()
            last = json.loads(text.rstrip("\n").rsplit("\n", 1)[-1])
            outcome = last.get("outcome") or {}
            if response.status != 200 or outcome.get("status") != "applied":
                raise RuntimeError(f"expected applied, got {response.status}: {last}")

        return op
