"""The ``marque`` command line: DESIGN §9's contract, one module per command group.

Every command takes ``--json`` and then prints exactly one JSON object on
stdout; streamed events go to stderr as JSON lines. Exit statuses come from
the outcome (0 applied, 4 aborted_not_applied, 5 indeterminate, 6 in_progress)
or from the error class (2 usage, 3 refused, 7 unavailable, 8 logbook broken) — never from a
table kept here. The plumbing is in :mod:`marque.cli.common`; command modules
import what a command needs inside the command, so ``marque exec`` pays only
for what it runs.
"""

from __future__ import annotations

import sys

import click

from marque import __version__
from marque.cli.common import CommandExit, emit_json, printable
from marque.cli.control import COMMANDS as CONTROL_COMMANDS
from marque.cli.effects import effects
from marque.cli.execution import exec_, outcome_, reconcile
from marque.cli.harbour import harbour
from marque.cli.harbour_oidc import oidc  # noqa: F401 - registers `harbour oidc`
from marque.cli.harbour_serve import harbour_serve  # noqa: F401 - registers `harbour serve`
from marque.cli.issue import issue, proof
from marque.cli.keys import keys
from marque.cli.ledger import ledger
from marque.cli.logbook import logbook
from marque.cli.login import COMMANDS as LOGIN_COMMANDS
from marque.cli.pilot import pilot
from marque.cli.serve import pilot_serve  # noqa: F401 - registers `pilot serve`
from marque.errors import InvalidInput

__all__ = ["app", "main"]


@click.group(no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="marque", message="%(prog)s %(version)s")
def app() -> None:
    """Marque: run approved database changes exactly once, within budget, honestly."""


@app.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object on stdout.")
def demo(as_json: bool) -> None:
    """The whole story on embedded defaults, in a temporary home, narrated."""
    from marque.demo import run_demo

    raise CommandExit(run_demo(as_json=as_json))


for _command in (keys, pilot, harbour, issue, proof, exec_, outcome_, reconcile, effects, ledger,
                 logbook, *CONTROL_COMMANDS, *LOGIN_COMMANDS):
    app.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
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
