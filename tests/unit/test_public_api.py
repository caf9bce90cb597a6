"""The curated public API: ``marque.__all__`` is pinned, and importing marque is free."""

from __future__ import annotations

import subprocess
import sys

import marque

PUBLIC = {
    "__version__", "open_pilot", "Pilot", "Settings", "Outcome", "Status", "Change",
    "Statement", "Guard", "Budget", "issue_marque", "make_proof", "new_key", "public_jwk",
    "thumbprint", "MarqueError", "UsageError", "Refusal", "NotApplied", "Indeterminate",
    "Unavailable", "canonicalize",
}


def test_all_is_pinned() -> None:
    """Adding or removing a public name is a deliberate change to this list."""
    assert set(marque.__all__) == PUBLIC


def test_every_public_name_resolves() -> None:
    """Each name in __all__ is an attribute of the package (resolved lazily)."""
    for name in marque.__all__:
        assert getattr(marque, name) is not None, name
    assert marque.open_pilot is __import__("marque.pilot", fromlist=["x"]).open_pilot


def test_unknown_attribute_is_an_attribute_error() -> None:
    """A name that is not public raises AttributeError, like any module."""
    try:
        marque.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_marque_or_its_cli_loads_no_database_or_crypto() -> None:
    """`import marque.cli` pulls in neither joserfc, cryptography, sqlite3 nor psycopg."""
    code = ("import sys, marque.cli; heavy = [m for m in ('joserfc', 'cryptography', "
            "'sqlite3', 'psycopg', 'rich') if m in sys.modules]; print(','.join(heavy))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == ""


def test_exec_loads_no_module_it_does_not_run() -> None:
    """`marque exec` on a SQLite home imports no other command's module, no web stack, no
    SQL parser (sqlglot is for previews) and no Effect Set machinery, while `--help` still
    finds every command."""
    code = (
        "import sys, click\n"
        "from marque.cli import app\n"
        "ctx = click.Context(app, info_name='marque')\n"
        "assert app.get_command(ctx, 'exec') is not None\n"
        "import marque.pilot, marque.ledger.sqlite, marque.target.sqlite\n"
        "heavy = ('sqlglot', 'uvicorn', 'starlette', 'asyncio', 'psycopg', 'httpx',\n"
        "         'marque.cli.serve', 'marque.cli.harbour_serve', 'marque.cli.control',\n"
        "         'marque.effects.dispatch', 'marque.effects.declare')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
        "print(','.join(app.list_commands(ctx)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded, listed = done.stdout.splitlines()
    assert loaded == ""
    assert {"exec", "pilot", "harbour", "issue", "requests", "login", "demo"} <= set(
        listed.split(","))
