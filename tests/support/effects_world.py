"""A Pilot home over a real SQLite or PostgreSQL ``shop`` target, for Effect Set tests.

Nothing is mocked: the Pilot is :func:`open_pilot` of a real home; the target
table ``items (id PRIMARY KEY, name NOT NULL, qty NOT NULL CHECK (qty >= 0))``
lives in a real SQLite file or a real PostgreSQL database; marques and proofs
are signed with real Ed25519 keys.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marque.change import Budget, EffectSetChange
from marque.effects.declare import capture_input, parse_declaration
from marque.effects.preview import EffectPreview, Strength
from marque.effects.request import EffectPreviewRequest, run_identity_cid
from marque.harbour.identity import authority_scope_cid, logical_request_scope
from marque.outcome import Outcome
from marque.pilot import Pilot, open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk, unverified_claims
from support.world import bank_at

PILOT_ID = "pilot-fx"
TABLE_DDL = ("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
             "qty INTEGER NOT NULL CHECK (qty >= 0))")
SEED_ROWS = [(1, "anchor", 5), (2, "buoy", 7), (3, "chart", 9)]


def seed_target(dsn: str) -> None:
    """Create ``items`` with three rows in the target behind ``dsn``."""
    with _connect(dsn) as db:
        db.execute(TABLE_DDL)
        for row in SEED_ROWS:
            db.execute("INSERT INTO items (id, name, qty) VALUES (?, ?, ?)", row)


class _Db:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        if dsn.startswith("sqlite:///"):
            self.conn: Any = sqlite3.connect(dsn.removeprefix("sqlite:///"), isolation_level=None)
            self.pg = False
        else:
            import psycopg

            self.conn = psycopg.connect(dsn, autocommit=True)
            self.pg = True

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.pg:
            sql = sql.replace("?", "%s")
        cur = self.conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []

    def __enter__(self) -> _Db:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def _connect(dsn: str) -> _Db:
    return _Db(dsn)


@dataclass
class EffectWorld:
    """A Pilot home with the target ``shop`` and helpers to preview, issue, apply and look."""

    home: Path
    dsn: str
    issuer: dict[str, Any]
    holder: dict[str, Any]
    pilot: Pilot
    events: list[dict[str, Any]] = field(default_factory=list)

    # -- requests and previews --------------------------------------------------------

    def request(self, members: list[dict[str, Any]], inputs: dict[str, list[dict[str, Any]]],
                request_id: str = "req-1", strength: dict[str, str] | None = None
                ) -> EffectPreviewRequest:
        """A preview request for ``members`` (declaration members) with JSON ``inputs``."""
        import json

        declaration = parse_declaration({"version": "marque-effect-set/0.1", "members": members})
        relations = {eid: capture_input(json.dumps(rows).encode(), "json")
                     for eid, rows in inputs.items()}
        scope = logical_request_scope(authority_scope_cid("local", "tester"), request_id)
        draft = EffectPreviewRequest(declaration, relations, scope, "sha256:" + "0" * 64,
                                     {eid: Strength(s) for eid, s in (strength or {}).items()})
        return EffectPreviewRequest(declaration, relations, scope,
                                    run_identity_cid(scope, draft.bound()), draft.strength)

    def preview(self, members: list[dict[str, Any]], inputs: dict[str, list[dict[str, Any]]],
                **kw: Any) -> EffectPreview:
        """Preview on ``shop`` through the Pilot (stored in its ledger)."""
        preview: EffectPreview = self.pilot.preview_effects(self.request(members, inputs, **kw),
                                                            "shop")
        return preview

    # -- marques ----------------------------------------------------------------------------

    def issue(self, effect_preview_cid: str, *, executions: int = 1, max_rows: int = 100,
              attempts: int = 3, ttl: int = 600) -> str:
        """A marque for the preview, signed by the trusted issuer."""
        return issue_marque(self.issuer, pilot_id=self.pilot.pilot_id,
                            incarnation=self.pilot.incarnation, target="shop",
                            holder_jwk=public_jwk(self.holder),
                            change=EffectSetChange(effect_preview_cid),
                            budget=Budget(executions, max_rows, attempts), ttl_seconds=ttl)

    def run(self, token: str, nonce: str) -> Outcome:
        """Execute ``token`` for ``nonce`` with a fresh proof; events land in ``events``."""
        proof = make_proof(self.holder, token, nonce=nonce, pilot_id=self.pilot.pilot_id)
        return self.pilot.execute(token, proof, nonce, on_event=self.events.append)

    def receipts(self, token: str, nonce: str) -> dict[str, Any]:
        """Everything the ledger holds of that execution."""
        marque_id = str((unverified_claims(token) or {})["jti"])
        return self.pilot.effect_receipts(marque_id, nonce)

    # -- the target, read directly --------------------------------------------------------

    def items(self) -> dict[int, tuple[str, int]]:
        """``{id: (name, qty)}`` straight from the target."""
        with _connect(self.dsn) as db:
            return {r[0]: (r[1], r[2]) for r in db.execute(
                "SELECT id, name, qty FROM items ORDER BY id")}

    def sql(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run SQL on the target behind the Pilot's back (``?`` placeholders)."""
        with _connect(self.dsn) as db:
            return db.execute(text, params)

    def row_stamps(self) -> list[tuple[Any, ...]]:
        """``(kind, rows_affected, action)`` of every row stamp, oldest first."""
        return [(s["kind"], s["rows_affected"], s["action"])
                for s in bank_at(self.dsn).row_stamps()]

    def reopen(self) -> Pilot:
        """Close and open the Pilot again from its home (start-up recovery included)."""
        self.pilot.close()
        self.pilot = open_pilot(self.home)
        return self.pilot

    def close(self) -> None:
        self.pilot.close()


def build_effect_world(tmp_path: Path, dsn: str) -> EffectWorld:
    """A home in ``tmp_path/home`` serving ``dsn`` as ``shop`` (seeded with ``items``)."""
    seed_target(dsn)
    home = tmp_path / "home"
    issuer, holder = new_key(), new_key()
    init_home(home, PILOT_ID)
    trust_issuer(home, public_jwk(issuer))
    add_target(home, "shop", dsn)
    return EffectWorld(home, dsn, issuer, holder, open_pilot(home))


def member(effect_id: str, kind: str, *, policy: str = "halt", key: tuple[str, ...] = ("id",),
           max_items: int = 100) -> dict[str, Any]:
    """A declaration member on ``items``."""
    return {"effect_id": effect_id, "kind": kind, "table": "items", "key": list(key),
            "failure_policy": policy, "max_items": max_items}


#: A child process's script: open the Pilot home ``argv[1]`` and execute the marque in
#: file ``argv[2]`` with a proof by the holder key in file ``argv[3]``, nonce ``argv[4]``.
_CRASHING_APPLY = """
import json, sys
from marque.pilot import open_pilot
from marque.token import make_proof
home, token_file, holder_file, nonce = sys.argv[1:]
pilot = open_pilot(home)
token = open(token_file).read()
proof = make_proof(json.load(open(holder_file)), token, nonce=nonce, pilot_id=pilot.pilot_id)
pilot.execute(token, proof, nonce)
"""


def apply_killed_after_row_2(world: EffectWorld,
                             tmp_path: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Issue an update of ``fix`` (rows 1, 2, 3 → qty 11, 22, 33), close the world's Pilot,
    and apply the marque (nonce ``n-1``) in a child process that ``MARQUE_CRASH_AT=
    after_commit@2`` kills right after row 2 committed; the marque and the finished child."""
    preview = world.preview([member("fix", "update")],
                            {"fix": [{"id": 1, "qty": 11}, {"id": 2, "qty": 22},
                                     {"id": 3, "qty": 33}]})
    token = world.issue(preview.effect_preview_cid)
    world.pilot.close()
    token_file, holder_file = tmp_path / "marque.jws", tmp_path / "holder.jwk"
    token_file.write_text(token)
    holder_file.write_text(json.dumps(world.holder))
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MARQUE_CRASH_AT": "after_commit@2", "PYTHONPATH": str(root / "src")}
    done = subprocess.run([sys.executable, "-c", _CRASHING_APPLY, str(world.home),
                           str(token_file), str(holder_file), "n-1"], env=env, timeout=60,
                          capture_output=True, text=True)
    return token, done
