"""Connection strings: ``sqlite:///relative``, ``sqlite:////absolute``, ``postgresql://…``."""

from __future__ import annotations

from marque.errors import InvalidInput


def is_sqlite(dsn: str) -> bool:
    """Whether ``dsn`` names a SQLite file."""
    return dsn.startswith("sqlite:///")


def is_postgres(dsn: str) -> bool:
    """Whether ``dsn`` names a PostgreSQL database."""
    return dsn.startswith(("postgresql://", "postgres://"))


def sqlite_path(dsn: str) -> str:
    """The file path of a ``sqlite:///path`` DSN."""
    if not is_sqlite(dsn) or len(dsn) == len("sqlite:///"):
        raise InvalidInput(f"not a sqlite DSN: {dsn!r} (expected sqlite:///path)")
    return dsn[len("sqlite:///") :]


def sqlite_dsn(path: str) -> str:
    """The DSN of a SQLite file path (absolute paths get four slashes)."""
    return "sqlite:///" + path
