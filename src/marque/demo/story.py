"""The demo's narrator: steps, the command an operator would type, checks, events, tables.

Without a console (``marque demo --json``) it only records the checks, which
become the one JSON object the demo prints.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["Story", "show_balances", "show_preview"]

#: Event fields worth a line in the narration (the rest is in ``--json``).
_EVENT_FIELDS = ("sql", "rows", "rows_affected", "max_rows", "status", "stamp", "error")


class Story:
    """Narrates to ``console`` (None: silent) and keeps every check's verdict."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.steps: list[dict[str, Any]] = []

    def say(self, text: str) -> None:
        """A line of narration (rich markup)."""
        if self.console:
            self.console.print(text)

    def step(self, title: str, aside: str | None = None) -> None:
        """The heading of a step of the story."""
        self.say(f"\n[bold]{escape(title)}[/]" + (f" [dim]({escape(aside)})[/]" if aside else ""))

    def command(self, line: str) -> None:
        """The CLI command that does the same as this step, for the reader to reuse."""
        self.say(f"  [dim]$ {escape(line)}[/]")

    def check(self, name: str, ok: bool, detail: str) -> None:
        """Record whether the step behaved, and say so."""
        self.steps.append({"step": name, "ok": ok, "detail": detail})
        mark = "[bold green]✔[/]" if ok else "[bold red]✘[/]"
        self.say(f"  {mark} {escape(detail)}")

    def event(self, event: dict[str, Any]) -> None:
        """One event of an execution, as the Pilot streams it."""
        extra = {k: v for k, v in event.items() if k in _EVENT_FIELDS}
        shown = escape(json.dumps(extra)) if extra else ""
        self.say(f"    [cyan]● {escape(str(event.get('event')))}[/] [dim]{shown}[/]")


def show_balances(story: Story, title: str, balances: dict[int, int]) -> None:
    """The bank's accounts as a table."""
    if story.console is None:
        return
    table = Table(title=title, title_justify="left")
    table.add_column("account")
    table.add_column("balance", justify="right")
    for account, balance in balances.items():
        table.add_row(str(account), str(balance))
    story.console.print(table)


def show_preview(story: Story, preview: dict[str, Any]) -> None:
    """The stored preview an approver decides on: rows per statement, and their samples."""
    if story.console is None:
        return
    within = "within" if preview.get("within_max_rows") else "[bold red]OVER[/]"
    story.say(f"    preview ({escape(str(preview.get('mode')))}): {preview.get('total_rows')} "
              f"row(s), {within} max_rows {preview.get('max_rows')}")
    for statement in preview.get("statements") or []:
        story.say(f"      {escape(str(statement.get('sql')))} → {statement.get('rows')} row(s)")
