"""Which exceptions are a target database's own: what a target may translate into a
Marque outcome, and what it must let through as the fault of ours it is.

A target turns an error of its driver (``sqlite3.Error``, ``psycopg.Error``) or of the
connection under it (``OSError``: a socket, a file) into the most specific Marque error
— ``target_unavailable``, ``statement_error``, ``commit_unknown``. Any other exception
(a ``TypeError``, a ``KeyError``) is a bug in Marque, not something the database said:
it is let through as it is, and the Pilot records the attempt or row as unknown
(reconciliation settles it from the stamp), never as failed.
"""

from __future__ import annotations

import sqlite3
import sys

__all__ = ["is_driver_error"]


def is_driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error of a target's driver or connection, not one of ours."""
    if isinstance(exc, sqlite3.Error | OSError):
        return True
    # Looked up, not imported: psycopg is an optional extra and slow to import, and until a
    # PostgreSQL target has imported it no psycopg error can exist.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)
