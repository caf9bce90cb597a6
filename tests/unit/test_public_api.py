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
