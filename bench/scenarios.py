"""The yardstick (raw psycopg) and Marque in process, as harness cells.

Every scenario does the same work on the target: ``UPDATE bench SET v = v + 1
WHERE id = %s`` and COMMIT, one row per client (or one shared row for the
``_hot`` variants). Marque cells go through ``Pilot.execute`` — marque
signature, proof of possession, ledger claim, fenced target transaction,
outcome, report — exactly as a caller would; only that call is timed. The
proofs (and nonces) of a round are made before it, by ``prepare``.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from cluster import HOT_ROW
from harness import Cell, Op

from marque.pilot import Pilot, open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import Budget, Change, Statement, issue_marque, make_proof, new_key, public_jwk

UPDATE = "UPDATE bench SET v = v + 1 WHERE id = %s"
#: Enough executions for any run of the bench.
EXECUTIONS = 10_000_000
#: Marques outlive the longest full run comfortably.
TTL_SECONDS = 6 * 3600


def client_row(client: int) -> int:
    return client + 1


# -- raw psycopg --------------------------------------------------------------------------


class RawPeer:
    """One psycopg connection per client, kept across rounds."""

    def __init__(self, dsn: str, clients: int) -> None:
        self.dsn = dsn
        self.conns = [psycopg.connect(dsn) for _ in range(clients)]

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class RawCell(Cell):
    def __init__(self, peer: RawPeer, clients: int, *, hot: bool = False) -> None:
        super().__init__("raw_hot" if hot else "raw", clients)
        self.peer = peer
        self.hot = hot

    def prepare(self, per_client: int) -> list[Op]:
        return [self._op(c) for c in range(self.clients)]

    def _op(self, client: int) -> Op:
        conn = self.peer.conns[client]
        params = (HOT_ROW if self.hot else client_row(client),)

        def op(_: int) -> None:
            cur = conn.execute(UPDATE, params)
            conn.commit()
            if cur.rowcount != 1:
                raise RuntimeError(f"raw UPDATE touched {cur.rowcount} rows")

        return op


# -- Marque in process --------------------------------------------------------------------


class MarqueBed:
    """A Pilot home (its ledger, the PostgreSQL target, a trusted issuer) and its Pilot."""

    def __init__(
        self,
        root: Path,
        name: str,
        target_dsn: str,
        *,
        ledger_dsn: str | None = None,
    ) -> None:
        self.name = name
        self.home = root / name
        self.issuer = new_key()
        self.holder = new_key()
        init_home(self.home, f"bench-{name}", ledger_dsn)
        trust_issuer(self.home, public_jwk(self.issuer))
        add_target(self.home, "bench", target_dsn)
        # A long-running Pilot: outcome reports travel off the execution path.
        self.pilot: Pilot = open_pilot(self.home, background=True)

    @property
    def ledger_path(self) -> str:
        return self.pilot.ledger.path  # type: ignore[attr-defined]  # SQLite ledgers only

    def issue(self, row: int, marque_id: str | None = None) -> str:
        return issue_marque(
            self.issuer,
            pilot_id=self.pilot.pilot_id,
            incarnation=self.pilot.incarnation,
            target="bench",
            holder_jwk=public_jwk(self.holder),
            change=Change((Statement(UPDATE, (row,)),)),
            budget=Budget(EXECUTIONS, 1),
            ttl_seconds=TTL_SECONDS,
            marque_id=marque_id,
        )

    def proof(self, token: str, nonce: str, jti: str | None = None) -> str:
        return make_proof(self.holder, token, nonce=nonce, pilot_id=self.pilot.pilot_id, jti=jti)

    def execute_once(self, token: str, nonce: str, jti: str | None = None) -> None:
        outcome = self.pilot.execute(token, self.proof(token, nonce, jti), nonce)
        if outcome.status != "applied":
            raise RuntimeError(f"set-up execution ended {outcome.status}: {outcome.error}")

    def close(self) -> None:
        self.pilot.close()


class MarqueCell(Cell):
    """Fresh nonces (or a replayed one) through ``Pilot.execute``.

    Not hot: each client its own marque over its own row. Hot: every client
    shares one marque (one budget row) over one row; for replay, one nonce.
    """

    def __init__(
        self,
        bed: MarqueBed,
        name: str,
        clients: int,
        *,
        hot: bool = False,
        replay: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name, clients)
        self.bed = bed
        self.hot = hot
        self.replay = replay
        self._extra = dict(extra or {})
        if hot:
            token = bed.issue(HOT_ROW)
            self.tokens = [token] * clients
        else:
            self.tokens = [bed.issue(client_row(c)) for c in range(clients)]
        self.replay_nonces: list[str] = []
        if replay:
            # The nonce each client replays is applied once, before any timing.
            if hot:
                nonce = "replayed-" + uuid.uuid4().hex
                bed.execute_once(self.tokens[0], nonce)
                self.replay_nonces = [nonce] * clients
            else:
                for token in self.tokens:
                    nonce = "replayed-" + uuid.uuid4().hex
                    bed.execute_once(token, nonce)
                    self.replay_nonces.append(nonce)

    def extra(self) -> dict[str, Any]:
        return self._extra

    def prepare(self, per_client: int) -> list[Op]:
        # Start from a quiet Pilot: the background reporter must not be draining
        # the previous cell's outcomes into the logbook while this one is timed.
        # Drained first, so the proofs made below are fresh when the round starts.
        self.bed.pilot.report()
        ops = []
        for c in range(self.clients):
            token = self.tokens[c]
            if self.replay:
                nonces = [self.replay_nonces[c]] * per_client
            else:
                nonces = [f"n-{uuid.uuid4().hex}" for _ in range(per_client)]
            proofs = [self.bed.proof(token, n) for n in nonces]
            ops.append(self._op(token, nonces, proofs))
        return ops

    def _op(self, token: str, nonces: list[str], proofs: list[str]) -> Op:
        execute = self.bed.pilot.execute
        replay = self.replay

        def op(i: int) -> None:
            outcome = execute(token, proofs[i], nonces[i])
            if outcome.status != "applied" or outcome.replayed is not replay:
                raise RuntimeError(
                    f"expected applied (replayed={replay}), got {outcome.status} "
                    f"replayed={outcome.replayed}: {outcome.error}"
                )

        return op


def proof_cost_ms(bed: MarqueBed, count: int = 200) -> float:
    """Client-side cost of one proof of possession (Ed25519 signature), in ms."""
    token = bed.issue(1)
    started = time.perf_counter()
    for i in range(count):
        bed.proof(token, f"cost-{i}")
    return (time.perf_counter() - started) * 1000 / count

