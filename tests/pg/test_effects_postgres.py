"""Effect Sets on a PostgreSQL target under real faults and through a real Harbourmaster.

* The Pilot reaches ``shop`` through :class:`support.pgproxy.PgProxy`, which cuts the
  connection at the second row's COMMIT (its answer lost, or the COMMIT never
  delivered): the row is ``unknown``, reconciled from its row stamp by a
  tombstone — never resent — and halt / continue dispatch exactly as the seed's
  table says (DESIGN §7, docs/effects.md "halt and continue").
* An Effect Set update request goes through ``harbour serve`` and a joined
  ``pilot serve`` whose target is a PostgreSQL database: routed, previewed,
  approved, executed, verified, with its receipt in ``GET /v1/requests/{id}``.

An AFTER trigger on ``items`` counts every committed write per row, so "never
resent" is the target's own record, not the Pilot's word.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support.effects_world import EffectWorld, build_effect_world, member
from support.harbour import (
    MARQUE,
    TOPUP_ROWS,
    Harbour,
    HarbourServer,
    cli_env,
    cli_json,
    effect_body,
    execute_marque,
    free_port,
    wait_for_request,
)
from support.pgproxy import PgProxy, PgProxyFactory

from marque.change import EffectSetChange
from marque.pilot import open_pilot
from marque.pilot.setup import add_target
from marque.token import unverified_claims

WRITE_LOG = """
CREATE TABLE item_writes (id INTEGER NOT NULL, op TEXT NOT NULL, qty INTEGER);
CREATE FUNCTION log_item_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO item_writes VALUES (OLD.id, TG_OP, NULL);
  ELSE
    INSERT INTO item_writes VALUES (NEW.id, TG_OP, NEW.qty);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER items_write_log AFTER INSERT OR UPDATE OR DELETE ON items
  FOR EACH ROW EXECUTE FUNCTION log_item_write();
"""

ROWS = [{"id": 1, "qty": 11}, {"id": 2, "qty": 22}, {"id": 3, "qty": 33}]


def install_write_log(dsn: str) -> None:
    """Every committed write to ``items`` leaves a row in ``item_writes``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(WRITE_LOG)


def writes(dsn: str) -> list[tuple[int, str, int | None]]:
    """``(id, op, qty)`` of every committed write to ``items``, by id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            "SELECT id, op, qty FROM item_writes ORDER BY id")]


# -- 1. an unknown row from a cut connection, under halt and continue ----------------------


@pytest.fixture
def proxied(tmp_path: Path, pg_dsn: str,
            pg_proxy: PgProxyFactory) -> Iterator[tuple[EffectWorld, PgProxy]]:
    """An Effect Set world on PostgreSQL whose Pilot reaches ``shop`` through the proxy."""
    world = build_effect_world(tmp_path, pg_dsn)
    install_write_log(pg_dsn)
    proxy, proxied_dsn = pg_proxy(pg_dsn)
    world.pilot.close()
    add_target(world.home, "shop", proxied_dsn)
    world.pilot = open_pilot(world.home)
    try:
        yield world, proxy
    finally:
        world.close()


#: (mode, policy) → member receipt states, dispatch ledger states, row 2's reconciled
#: outcome, the row stamps' kinds (oldest first: under continue, row 3 is applied before
#: row 2 is reconciled), the rows' qty, the Run outcome.
CUT_CASES = {
    ("drop_after_commit", "halt"): (
        ["applied", "unknown", "unattempted"], ["applied", "applied", "prepared"], "applied",
        ["applied", "applied"], {1: 11, 2: 22, 3: 9}, "failed"),
    ("drop_after_commit", "continue"): (
        ["applied", "unknown", "applied"], ["applied", "applied", "applied"], "applied",
        ["applied", "applied", "applied"], {1: 11, 2: 22, 3: 33}, "succeeded"),
    ("drop_before_commit", "halt"): (
        ["applied", "unknown", "unattempted"], ["applied", "failed", "prepared"], "failed",
        ["applied", "tombstone"], {1: 11, 2: 7, 3: 9}, "failed"),
    ("drop_before_commit", "continue"): (
        ["applied", "unknown", "applied"], ["applied", "failed", "applied"], "failed",
        ["applied", "applied", "tombstone"], {1: 11, 2: 7, 3: 33}, "failed"),
}


@pytest.mark.parametrize(("mode", "policy"), list(CUT_CASES))
def test_a_row_whose_commit_is_cut_is_unknown_reconciled_from_its_stamp_and_never_resent(
        proxied: tuple[EffectWorld, PgProxy], mode: str, policy: str) -> None:
    """The proxy cuts row 2's COMMIT (answer lost: it committed; COMMIT never delivered: it
    did not): row 2 is sealed unknown, a tombstone settles it (applied / failed) in one
    terminal reconciliation receipt, it is never resent; halt leaves row 3 unattempted,
    continue applies it; the target holds each row's write at most once."""
    world, proxy = proxied
    receipt_states, ledger_states, settled, stamp_kinds, qty, run_outcome = CUT_CASES[
        (mode, policy)]
    preview = world.preview([member("fix", "update", policy=policy)], {"fix": ROWS})
    token = world.issue(preview.effect_preview_cid)
    mid = str((unverified_claims(token) or {})["jti"])
    proxy.arm(mode, skip=1)  # row 1's COMMIT goes through; row 2's is cut

    outcome = world.run(token, "n-1")

    assert proxy.fired.is_set()
    # The target: each row written at most once, row 2 only if its COMMIT reached the server.
    assert {k: v[1] for k, v in world.items().items()} == qty
    assert writes(world.dsn) == [(i, "UPDATE", q) for i, q in sorted(qty.items())
                                 if q != {1: 5, 2: 7, 3: 9}[i]]
    assert [s[0] for s in world.row_stamps()] == stamp_kinds
    dispatched = [e["index"] for e in world.events if e["event"] == "row_dispatching"]
    assert dispatched == ([0, 1] if policy == "halt" else [0, 1, 2])
    assert [e["index"] for e in world.events if e["event"] == "row_unknown"] == [1]

    # The attempt: unknown first, then settled by reconciliation (row 1 applied: applied).
    assert outcome.status == "applied" and not outcome.replayed
    observations = world.pilot.ledger.observations(mid, "n-1")
    assert [(o["status"], o["cause"]) for o in observations] == [
        ("indeterminate", "execution"), ("applied", "reconciliation")]
    assert outcome.result is not None
    summary = outcome.result["effect_set"]
    assert summary["row_states"] == {"fix": ["applied", settled, receipt_states[2]]}
    assert summary["run_outcome"] == run_outcome
    assert summary["rows_affected"] == sum(1 for s in ledger_states if s == "applied")

    # The dispatch ledger: every row dispatched at most once.
    receipts = world.receipts(token, "n-1")
    assert [r["state"] for r in receipts["rows"]] == ledger_states
    assert [r["attempt"] for r in receipts["rows"]] == [1, 1, 1 if policy == "continue" else 0]
    assert receipts["rows"][1]["was_unknown"] is True
    if settled == "failed":
        assert receipts["rows"][1]["outcome"]["error"]["code"] == "commit_unknown"

    # The receipts as sealed: the set is unknown_outcome; the member entry is unknown.
    [member_receipt] = receipts["member_receipts"]
    assert [row["state"] for row in member_receipt["rows"]] == receipt_states
    unknown_entry = member_receipt["rows"][1]
    assert "outcome_receipt_cid" not in unknown_entry and "ledger_head_cid" in unknown_entry
    sealed = receipts["set_receipt"]
    assert sealed["status"] == "unknown_outcome"
    assert [(m["effect_id"], m["state"]) for m in sealed["members"]] == [("fix", "unknown")]
    assert summary["set_receipt_cid"] == sealed["receipt_cid"]

    # One reconciliation receipt for row 2, terminal, chained to the sealed receipts.
    [chain] = receipts["reconciliation_receipts"]
    row2 = preview.member("fix").changes[1]
    assert chain["row_preview_cid"] == row2.row_preview_cid
    assert (chain["attempt_sequence"], chain["terminal"]) == (1, True)
    assert "previous_reconciliation_receipt_cid" not in chain
    assert chain["outcome"]["state"] == settled
    assert chain["effect_set_receipt_cid"] == sealed["receipt_cid"]
    assert chain["prior_receipt_cid"] == member_receipt["receipt_cid"]
    assert chain["prior_ledger_head_cid"] == unknown_entry["ledger_head_cid"]
    assert chain["dispatch_entry_cid"] == unknown_entry["dispatch_entry_cid"]
    assert chain["idempotency_key"] == row2.row_idempotency_key
    held = world.pilot.ledger.effect_rows(mid, "n-1")[1].outcome_receipt
    assert held is not None and chain["outcome_receipt_cid"] == held["receipt_cid"]

    # The same nonce again: the recorded outcome, nothing sent.
    again = world.run(token, "n-1")
    assert again.replayed and again.status == "applied"
    assert len(world.row_stamps()) == len(stamp_kinds)
    assert len(writes(world.dsn)) == len([q for i, q in qty.items()
                                          if q != {1: 5, 2: 7, 3: 9}[i]])


# -- 2. an Effect Set request through the Harbourmaster, on a PostgreSQL target ------------


#: Writes to ``public.accounts`` (as the routing names a PostgreSQL member's table) are
#: delegated; anything else is denied — so a delegated set proves how it was routed.
PG_ROUTING = """\
version = "marque-routing/0.1"

[[entry]]
principal = "*"
target = ["bank"]
resource = ["public.accounts"]
operation = ["write"]
outcome = "delegate"
approvals = 1

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = "*"
except = [EXCEPT]
outcome = "deny"
""".replace("EXCEPT", '{principal = "*", target = ["bank"], resource = ["public.accounts"], '
                      'operation = ["write"]}')


class PgStack:
    """``harbour serve`` (routing: PG_ROUTING; its store a SQLite file in its home, or the
    PostgreSQL database ``store``), a joined ``pilot serve``
    whose target ``bank`` is a PostgreSQL database (``accounts``: 1, 2, 3 → 100, with the
    write log), a requester holding a key, and an approver."""

    def __init__(self, root: Path, dsn: str, *, store: str | None = None) -> None:
        self.dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.execute("INSERT INTO accounts VALUES (1, 100), (2, 100), (3, 100)")
            conn.execute(WRITE_LOG.replace("ON items", "ON accounts")
                         .replace("NEW.qty", "NEW.balance"))
        self.harbour = Harbour(root / "harbour", routing=PG_ROUTING, store=store)
        self.holder_key = root / "holder.jwk"
        made = cli_json("keys", "new", "--out", self.holder_key)
        holder_pub = root / "holder.pub.jwk"
        holder_pub.write_text(json.dumps(made["public_jwk"]))
        self.alice = self.harbour.add("alice", "requester", key=holder_pub)
        self.bob = self.harbour.add("bob", "approver")
        pilot_token = self.harbour.add("p1", "pilot")
        self.server = HarbourServer(self.harbour.home)
        self.home = root / "pilot"
        cli_json("pilot", "init", "--home", self.home, "--pilot-id", "p1")
        cli_json("pilot", "trust", "--home", self.home, self.harbour.issuer_key)
        cli_json("pilot", "target", "add", "--home", self.home, "bank", dsn)
        port = free_port()
        cli_json("pilot", "join", "--home", self.home, "--harbour", self.server.url,
                 "--token", pilot_token, "--url", f"http://127.0.0.1:{port}")
        self.pilot = subprocess.Popen(
            [str(MARQUE), "pilot", "serve", "--home", str(self.home), "--listen",
             f"127.0.0.1:{port}", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=cli_env(), cwd=root)
        assert self.pilot.stdout is not None
        line = self.pilot.stdout.readline()
        assert line, self.pilot.stderr.read() if self.pilot.stderr else "no output"
        self.pilot_url: str = json.loads(line)["url"]

    def call(self, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
        return self.server.call(method, path, token, **kwargs)

    def balances(self) -> dict[int, int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return dict(conn.execute(  # type: ignore[arg-type]
                "SELECT id, balance FROM accounts ORDER BY id").fetchall())

    def execute(self, marque: str, nonce: str) -> dict[str, Any]:
        """POST the marque to the Pilot's /v1/executions; the outcome line."""
        return execute_marque(self.pilot_url, self.holder_key, marque, nonce)

    def stop(self) -> None:
        if self.pilot.poll() is None:
            self.pilot.terminate()
            self.pilot.wait(timeout=60)
        for stream in (self.pilot.stdout, self.pilot.stderr):
            if stream is not None:
                stream.close()
        self.server.stop()


@pytest.fixture
def pg_stack(tmp_path: Path, pg_dsn: str) -> Iterator[PgStack]:
    running = PgStack(tmp_path, pg_dsn)
    try:
        yield running
    finally:
        running.stop()


def test_an_effect_set_request_on_a_postgres_target_is_routed_previewed_approved_and_verified(
        pg_stack: PgStack) -> None:
    """Over HTTP, on PostgreSQL: the update of 3 rows is delegated (only public.accounts is),
    previewed row by row from the database, approved, issued naming the effect_preview_cid,
    applied with one committed write and one row stamp per row, and verified with its set
    receipt in GET /v1/requests/{id}."""
    body = effect_body(TOPUP_ROWS, request_id="pg-topup-1")
    answer = pg_stack.call("POST", "/v1/requests", pg_stack.alice, json=body)
    assert answer.status_code == 201, answer.text
    request = answer.json()
    assert request["state"] == "awaiting_approval"
    assert request["routing"]["outcome"] == "delegate"
    preview = request["preview"]
    assert preview["target"] == "bank" and preview["executed"] is False
    [shown] = preview["members"]
    assert [(c["before"], c["after"]["value"]["balance"]) for c in shown["changes"]] == [
        ({"state": "present", "value": {"id": i, "balance": 100}}, b)
        for i, b in ((1, 150), (2, 250), (3, 350))]
    assert all(c["target_version"]["kind"] == "row_content" for c in shown["changes"])
    assert request["checkpoint"]["body"]["preview_cid"] == preview["effect_preview_cid"]
    assert pg_stack.balances() == {1: 100, 2: 100, 3: 100}

    approved = pg_stack.call("POST", f"/v1/requests/{request['id']}/approve", pg_stack.bob,
                             json={"reason": "three rows, as shown"})
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "prepared"
    handed = pg_stack.call("GET", f"/v1/requests/{request['id']}/marque", pg_stack.alice).json()
    claims = unverified_claims(handed["marque"]) or {}
    assert claims["change"] == EffectSetChange(preview["effect_preview_cid"]).to_claim()

    outcome = pg_stack.execute(handed["marque"], "n-1")
    assert outcome["status"] == "applied" and outcome["rows_affected"] == 3
    assert pg_stack.balances() == {1: 150, 2: 250, 3: 350}
    assert writes(pg_stack.dsn) == [(1, "UPDATE", 150), (2, "UPDATE", 250), (3, "UPDATE", 350)]
    with psycopg.connect(pg_stack.dsn, autocommit=True) as conn:
        stamps = conn.execute("SELECT kind, rows_affected, marque_id, nonce "
                              "FROM marque.row_stamps").fetchall()
    assert sorted(stamps) == [("applied", 1, claims["jti"], "n-1")] * 3

    final = _wait(pg_stack, request["id"], lambda r: r["state"] == "verified"
                  and r["receipt"] is not None)
    assert final["state"] == "verified", final
    assert [(e["nonce"], e["status"]) for e in final["executions"]] == [("n-1", "applied")]
    receipt = final["receipt"]
    assert (receipt["status"], receipt["run_outcome"]) == ("applied", "succeeded")
    assert receipt["row_states"] == {"topup": ["applied", "applied", "applied"]}
    assert receipt["effect_preview_cid"] == preview["effect_preview_cid"]
    assert receipt["set_receipt"]["authorization"] == {
        "kind": "approval", "checkpoint_cid": request["checkpoint"]["cid"],
        "resolution_cids": claims["approval"]["resolutions"]}
    assert [(m["effect_id"], m["state"]) for m in receipt["set_receipt"]["members"]] == [
        ("topup", "applied")]


@pytest.fixture
def pg_store_stack(tmp_path: Path, pg_dsn: str, pg_admin_dsn: str) -> Iterator[PgStack]:
    """A PgStack whose Harbourmaster keeps its store in a PostgreSQL database of its own."""
    from support.pgcluster import create_database, drop_database

    name, store = create_database(pg_admin_dsn)
    running = PgStack(tmp_path, pg_dsn, store=store)
    try:
        yield running
    finally:
        running.stop()
        drop_database(pg_admin_dsn, name)


def test_an_effect_set_request_on_a_postgres_harbourmaster_store_keeps_its_receipt(
        pg_store_stack: PgStack) -> None:
    """With the Harbourmaster's store in PostgreSQL: a request with change.effect_set is
    stored, previewed, approved and issued from that store; the Pilot applies it; its report
    (set receipt, row states, the Run's projection) lands in the store's reports table, and
    GET /v1/requests/{id} shows the request verified with that receipt."""
    stack = pg_store_stack
    store = json.loads((stack.harbour.home / "harbour.json").read_text())["store"]
    assert store.startswith("postgresql://")
    assert not list(stack.harbour.home.glob("*.sqlite3"))  # nothing of the store in the home
    body = effect_body([{"id": 1, "balance": 110}, {"id": 3, "balance": 330}],
                       request_id="pg-store-1", reason="two rows")
    answer = stack.call("POST", "/v1/requests", stack.alice, json=body)
    assert answer.status_code == 201, answer.text
    request = answer.json()
    assert request["state"] == "awaiting_approval"
    assert "effect_set" in request["change"]
    effect_preview_cid = request["preview"]["effect_preview_cid"]
    assert request["checkpoint"]["body"]["preview_cid"] == effect_preview_cid
    with psycopg.connect(store, autocommit=True) as conn:
        [(stored_change,)] = conn.execute(
            "SELECT change FROM marque_harbour.requests WHERE id = %s",
            (request["id"],)).fetchall()
    assert "effect_set" in json.loads(stored_change)

    approved = stack.call("POST", f"/v1/requests/{request['id']}/approve", stack.bob,
                          json={"reason": "two rows, as shown"})
    assert approved.status_code == 200, approved.text
    handed = stack.call("GET", f"/v1/requests/{request['id']}/marque", stack.alice).json()
    claims = unverified_claims(handed["marque"]) or {}
    assert claims["change"] == EffectSetChange(effect_preview_cid).to_claim()

    outcome = stack.execute(handed["marque"], "n-1")
    assert outcome["status"] == "applied" and outcome["rows_affected"] == 2
    assert stack.balances() == {1: 110, 2: 100, 3: 330}

    final = _wait(stack, request["id"], lambda r: r["state"] == "verified"
                  and r["receipt"] is not None)
    assert final["state"] == "verified", final
    receipt = final["receipt"]
    assert (receipt["status"], receipt["run_outcome"]) == ("applied", "succeeded")
    assert receipt["row_states"] == {"topup": ["applied", "applied"]}
    assert receipt["effect_preview_cid"] == effect_preview_cid
    assert receipt["run_state"]["state"] == "succeeded"
    assert receipt["set_receipt"]["authorization"]["checkpoint_cid"] == \
        request["checkpoint"]["cid"]
    with psycopg.connect(store, autocommit=True) as conn:
        reports = [json.loads(r[0]) for r in conn.execute(
            "SELECT body FROM marque_harbour.reports WHERE marque_id = %s",
            (claims["jti"],)).fetchall()]
    assert [r["effect_set"]["set_receipt_cid"] for r in reports] == [
        receipt["set_receipt_cid"]]


def _wait(stack: PgStack, rq: str, ready: Any, seconds: float = 20) -> dict[str, Any]:
    return wait_for_request(stack.call, rq, stack.alice, ready, seconds)
