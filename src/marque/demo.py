"""``marque demo``: the whole story on embedded defaults, narrated.

A temporary home with a SQLite ledger and a SQLite bank; one marque spent
once, replayed, refused when its budget is gone; another refused by its
``max_rows`` assertion with nothing changed. Each step states what should
happen and checks that it did; the demo exits 0 only if every step behaved.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from marque.change import Budget, Change, Statement
from marque.errors import MarqueError
from marque.outcome import Outcome
from marque.pilot import open_pilot
from marque.pilot.core import Pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk

DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"
INTEREST = "UPDATE accounts SET balance = balance + 5"


class _Story:
    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.steps: list[dict[str, Any]] = []

    def say(self, text: str) -> None:
        if self.console:
            self.console.print(text)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.steps.append({"step": name, "ok": ok, "detail": detail})
        mark = "[bold green]✔[/]" if ok else "[bold red]✘[/]"
        self.say(f"  {mark} {detail}")


def _balances(path: Path) -> dict[int, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())


def _show_balances(story: _Story, title: str, balances: dict[int, int]) -> None:
    if story.console is None:
        return
    table = Table(title=title, title_justify="left")
    table.add_column("account")
    table.add_column("balance", justify="right")
    for account, balance in balances.items():
        table.add_row(str(account), str(balance))
    story.console.print(table)


def _exec(
    story: _Story, pilot: Pilot, holder: dict[str, Any], token: str, nonce: str
) -> Outcome | MarqueError:
    def show(event: dict[str, Any]) -> None:
        extra = {k: v for k, v in event.items()
                 if k in ("sql", "rows", "rows_affected", "max_rows", "status", "error")}
        story.say(f"    [cyan]● {event['event']}[/] [dim]{json.dumps(extra) if extra else ''}[/]")

    proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot.pilot_id)
    try:
        outcome = pilot.execute(token, proof, nonce, on_event=show)
    except MarqueError as exc:
        story.say(f"    [yellow]refused[/]: {exc.code} — {exc.message}")
        return exc
    story.say(f"    → [bold]{outcome.status}[/] attempt={outcome.attempt} "
              f"rows_affected={outcome.rows_affected} replayed={outcome.replayed}"
              + (f" error={outcome.error['code']}" if outcome.error else ""))
    return outcome


def _is(result: Outcome | MarqueError, test: Callable[[Outcome], bool]) -> bool:
    return isinstance(result, Outcome) and test(result)


def run_demo(*, as_json: bool = False) -> int:
    """Run the narrated demo; returns the exit status (0 only if every step behaved)."""
    story = _Story(None if as_json else Console(highlight=False, soft_wrap=True))
    with tempfile.TemporaryDirectory(prefix="marque-demo-") as tmp:
        root = Path(tmp)
        home, bank = root / "pilot", root / "bank.db"
        story.say(f"[bold]Marque demo[/] — a temporary home at {root}\n")

        with sqlite3.connect(bank) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            conn.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 100)])
        conn.close()

        story.say("[bold]1. Set up a Pilot[/] (marque keys new / pilot init / trust / target add)")
        issuer, holder = new_key(), new_key()
        identity = init_home(home, "demo-pilot")
        trust_issuer(home, public_jwk(issuer))
        add_target(home, "bank", "sqlite:///" + str(bank))
        story.say(f"    Pilot {identity['pilot_id']}, ledger incarnation "
                  f"{identity['incarnation']}, target 'bank' → {bank.name}")
        before = _balances(bank)
        _show_balances(story, "Balances before", before)

        def marque(sql: str, executions: int, max_rows: int) -> str:
            return issue_marque(
                issuer, pilot_id=identity["pilot_id"], incarnation=identity["incarnation"],
                target="bank", holder_jwk=public_jwk(holder),
                change=Change((Statement(sql),)), budget=Budget(executions, max_rows, 3),
                ttl_seconds=900, subject="demo-operator",
            )

        pilot = open_pilot(home)
        try:
            debit = marque(DEBIT, executions=1, max_rows=1)
            story.say(f"\n[bold]2. A marque for[/] [italic]{DEBIT}[/]\n"
                      "    budget: executions=1, max_rows=1 — executed with nonce 'pay-1'")
            first = _exec(story, pilot, holder, debit, "pay-1")
            story.check("applied", _is(first, lambda o: o.status == "applied"
                                       and o.rows_affected == 1 and not o.replayed),
                        "applied once, one row")
            story.check("balance_after_debit", _balances(bank)[1] == 90, "account 1 is now 90")

            story.say("\n[bold]3. The same nonce again[/] (a retry after a dropped connection)")
            again = _exec(story, pilot, holder, debit, "pay-1")
            story.check("replayed", _is(again, lambda o: o.status == "applied" and o.replayed),
                        "the recorded outcome comes back, replayed=true")
            story.check("not_reapplied", _balances(bank)[1] == 90,
                        "account 1 is still 90: nothing ran twice")

            story.say("\n[bold]4. A new nonce on the spent marque[/]")
            spent = _exec(story, pilot, holder, debit, "pay-2")
            story.check("budget_exhausted",
                        isinstance(spent, MarqueError) and spent.code == "budget_exhausted",
                        "refused with budget_exhausted; no claim recorded")

            story.say(f"\n[bold]5. A marque for[/] [italic]{INTEREST}[/] "
                      "(touches 2 rows) with max_rows=1")
            wide = _exec(story, pilot, holder, marque(INTEREST, 1, 1), "interest-1")
            story.check("max_rows_exceeded", _is(wide, lambda o: o.status == "aborted_not_applied"
                        and (o.error or {}).get("code") == "max_rows_exceeded"),
                        "aborted_not_applied with max_rows_exceeded — rolled back, not truncated")
            after = _balances(bank)
            story.check("nothing_changed", after == {1: 90, 2: 100},
                        "balances unchanged by the refused change")
            _show_balances(story, "\nBalances after", after)

            stats = pilot.stats()
        finally:
            pilot.close()

        story.say("\n[bold]6. The ledger[/] (marque ledger stats)")
        for key in ("pilot_id", "incarnation", "live_marques", "claims", "attempts_by_status",
                    "unreported_outcomes", "size_bytes"):
            value = stats[key]
            if isinstance(value, dict):  # attempts by status: "applied 2, in_progress 0, …"
                value = ", ".join(f"{k} {v}" for k, v in value.items())
            story.say(f"    {key:<20} {value}")
        story.check("ledger", stats["claims"] == 2 and stats["unreported_outcomes"] == 0,
                    "two nonces claimed, every outcome reported to the logbook")

    ok = all(step["ok"] for step in story.steps)
    if as_json:
        sys.stdout.write(json.dumps({"ok": ok, "steps": story.steps, "before": before,
                                     "after": after, "ledger": stats}, sort_keys=True) + "\n")
    else:
        story.say("\n[bold green]Every step behaved.[/]" if ok
                  else "\n[bold red]Some step did not behave — see ✘ above.[/]")
    return 0 if ok else 1
