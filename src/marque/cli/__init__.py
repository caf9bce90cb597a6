"""The ``marque`` command line: DESIGN §9's contract, one module per command group.

Every command takes ``--json`` and then prints exactly one JSON object on
stdout; streamed events go to stderr as JSON lines. Exit statuses come from
the outcome (0 applied, 4 aborted_not_applied, 5 indeterminate, 6 in_progress)
or from the error class (2 usage, 3 refused, 7 unavailable, 8 logbook broken) — never from a
table kept here. The plumbing is in :mod:`marque.cli.common`. A command's module
is imported only when that command runs (:mod:`marque.cli.lazy`), and command
modules import what a command needs inside the command, so ``marque exec`` pays
only for what it runs.
"""

from __future__ import annotations

import gc
import sys

import click

from marque import __version__
from marque.cli.common import CommandExit, emit_json, printable
from marque.cli.lazy import LazyGroup
from marque.errors import InvalidInput

__all__ = ["app", "main"]

#: Every command of ``marque`` but ``demo``, by name: ``"module:attribute"``, imported only
#: when it runs or ``--help`` lists it. A new command is one line here.
COMMANDS = {
    "approve": "marque.cli.control:approve",
    "effects": "marque.cli.effects:effects",
    "exec": "marque.cli.execution:exec_",
    "harbour": "marque.cli.harbour:harbour",
    "issue": "marque.cli.issue:issue",
    "keys": "marque.cli.keys:keys",
    "ledger": "marque.cli.ledger:ledger",
    "logbook": "marque.cli.logbook:logbook",
    "login": "marque.cli.login:login",
    "logout": "marque.cli.login:logout",
    "mcp": "marque.cli.agents:mcp_command",
    "outcome": "marque.cli.execution:outcome_",
    "pilot": "marque.cli.pilot:pilot",
    "proof": "marque.cli.issue:proof",
    "reconcile": "marque.cli.execution:reconcile",
    "reject": "marque.cli.control:reject",
    "request": "marque.cli.control:request_",
    "requests": "marque.cli.control:requests",
    "undo": "marque.cli.undo:undo",
}


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS, no_args_is_help=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="marque", message="%(prog)s %(version)s")
def app() -> None:
    """Marque: run approved database changes exactly once, within budget, honestly."""


@app.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
def demo(as_json: bool) -> None:
    """The whole story on embedded defaults, in a temporary home, narrated."""
    from marque.demo import run_demo

    raise CommandExit(run_demo(as_json=as_json))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
    try:
        _run(args)
    finally:
        # The process ends next: moving every object to the permanent generation spares
        # the interpreter's exit a last collection over everything the command built.
        gc.freeze()


def _run(args: list[str]) -> None:
    try:
        app.main(args, prog_name="marque", standalone_mode=False)
    except CommandExit as done:
        sys.exit(done.status)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(InvalidInput.exit_status)
    except click.ClickException as exc:
        # Errors found by the parser still honour --json's one-object contract.
        message = printable(exc.format_message())
        if "--json" in args:
            emit_json({"error": {"code": InvalidInput.code, "message": message,
                                 "sqlstate": None}})
        else:
            sys.stderr.write(f"usage: {message}\n(see `marque --help`)\n")
        sys.exit(InvalidInput.exit_status if isinstance(exc, click.UsageError) else 1)
    except click.exceptions.Abort:
        sys.exit(130)
    except (KeyboardInterrupt, EOFError):
        sys.exit(130)
    sys.exit(0)
