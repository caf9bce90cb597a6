"""Connection strings: ``sqlite:///relative``, ``sqlite:////absolute``, ``postgresql://…``.

A relative SQLite path means nothing on its own: whoever holds the DSN says
what it is relative to. A command line resolves it against the caller's
working directory (:func:`resolve_sqlite` with ``Path.cwd()``); ``pilot.json``
resolves it against the Pilot's home, so a home can move.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from marque.errors import InvalidInput, PostgresSupportMissing

SQLITE_PREFIX = "sqlite:///"
_PASSWORD_IN_URL = re.compile(r"://([^:/@]*):[^@/]*@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


def is_sqlite(dsn: str) -> bool:
    """Whether ``dsn`` names a SQLite file."""
    return dsn.startswith(SQLITE_PREFIX)


def is_postgres(dsn: str) -> bool:
    """Whether ``dsn`` names a PostgreSQL database."""
    return dsn.startswith(("postgresql://", "postgres://"))


def require_postgres_support(dsn: str) -> None:
    """Refuse a PostgreSQL ``dsn`` at once when its driver cannot be imported.

    The driver comes with the ``postgres`` extra; a plain ``pip install marque``
    has none, and a bare ``ImportError`` deep inside a command would tell its user
    nothing they can act on (and break ``--json``'s one object).
    """
    if not is_postgres(dsn):
        return
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "psycopg"
        raise PostgresSupportMissing(
            f"PostgreSQL support needs `pip install 'marque[postgres]'` (no module named "
            f"{missing!r} in this Python environment)", detail={"missing_module": missing},
        ) from exc


def sqlite_path(dsn: str) -> str:
    """The file path of a ``sqlite:///path`` DSN."""
    if not is_sqlite(dsn) or len(dsn) == len(SQLITE_PREFIX):
        raise InvalidInput(f"not a SQLite DSN: {redact(dsn)} (expected sqlite:///path)")
    return dsn[len(SQLITE_PREFIX) :]


def sqlite_dsn(path: str | os.PathLike[str]) -> str:
    """The DSN of a SQLite file path (absolute paths get four slashes)."""
    return SQLITE_PREFIX + os.fspath(path)


def check_shape(dsn: str, what: str) -> str:
    """``dsn`` if it is a SQLite or PostgreSQL DSN; else ``InvalidInput`` naming ``what``."""
    if is_sqlite(dsn):
        sqlite_path(dsn)
        return dsn
    if is_postgres(dsn):
        return dsn
    raise InvalidInput(f"{what} must be sqlite:///path or postgresql://…, got {redact(dsn)}")


def is_relative_sqlite(dsn: str) -> bool:
    """Whether ``dsn`` is a SQLite DSN with a relative path."""
    return is_sqlite(dsn) and not os.path.isabs(sqlite_path(dsn))


def resolve_sqlite(dsn: str, base: str | os.PathLike[str]) -> str:
    """``dsn`` with a relative SQLite path made absolute against ``base``; others unchanged."""
    if not is_relative_sqlite(dsn):
        return dsn
    return sqlite_dsn(os.path.normpath(Path(base).absolute() / sqlite_path(dsn)))


def relative_to(dsn: str, base: str | os.PathLike[str]) -> str:
    """An absolute SQLite DSN inside ``base`` made relative to it; others unchanged."""
    if not is_sqlite(dsn) or is_relative_sqlite(dsn):
        return dsn
    path = Path(sqlite_path(dsn))
    try:
        return sqlite_dsn(path.relative_to(Path(base).absolute()))
    except ValueError:
        return dsn


def redact(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (safe to print and log)."""
    dsn = _PASSWORD_IN_URL.sub(r"://\1:***@", dsn)
    return _PASSWORD_IN_QUERY.sub(r"\1***", dsn)


def describe(dsn: str) -> str:
    """Where ``dsn`` points, for a message: a file path, or ``host:port/dbname``."""
    if is_sqlite(dsn):
        return sqlite_path(dsn)
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return redact(dsn)
    return f"{host}:{port}{parts.path or ''}"
