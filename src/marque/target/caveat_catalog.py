"""What a preview's caveats need from a target's catalog (``marque.preview_caveats``).

Each reader runs on the preview's own connection, inside its transaction and
before the statement it answers for, so it sees what earlier statements of the
change created (a trigger, a function) and nothing of what this statement
will do. Every query only reads the catalog and is written not to fail for a
name that does not exist (``to_regclass``, a plain lookup), because a failed
query would abort the preview's transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from marque.preview_caveats import NOT_VOLATILE, VOLATILE, FunctionCall, TableName

__all__ = ["PostgresCatalog", "SqliteCatalog"]

# SQLite marks a function that always gives the same result for the same input with this
# flag (SQLITE_DETERMINISTIC) in pragma_function_list.
_SQLITE_DETERMINISTIC = 0x800

_PG_REGCLASS = ("to_regclass(CASE WHEN %(schema)s::text IS NULL THEN quote_ident(%(name)s) "
                "ELSE quote_ident(%(schema)s) || '.' || quote_ident(%(name)s) END)")


class PostgresCatalog:
    """PostgreSQL's catalog through one psycopg connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def _rows(self, sql: str, params: dict[str, Any]) -> list[Any]:
        return list(self.conn.execute(sql, params).fetchall())

    def triggers(self, table: TableName) -> list[str]:
        rows = self._rows(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = " + _PG_REGCLASS
            + " AND NOT tgisinternal AND tgenabled <> 'D' ORDER BY tgname",
            {"schema": table.schema, "name": table.name})
        return [str(r[0]) for r in rows]

    def foreign_server(self, table: TableName) -> str | None:
        rows = self._rows(
            "SELECT s.srvname FROM pg_foreign_table f JOIN pg_foreign_server s "
            "ON s.oid = f.ftserver WHERE f.ftrelid = " + _PG_REGCLASS,
            {"schema": table.schema, "name": table.name})
        return str(rows[0][0]) if rows else None

    def sequence_defaults(self, table: TableName) -> list[tuple[str, str]]:
        # Identity columns own their sequence; serial and DEFAULT nextval(…) columns have a
        # default that depends on one. Either way ROLLBACK leaves the sequence advanced.
        rows = self._rows(
            "WITH t AS (SELECT " + _PG_REGCLASS + " AS oid) "
            "SELECT a.attname, pg_get_serial_sequence(a.attrelid::regclass::text, a.attname) "
            "FROM pg_attribute a, t WHERE a.attrelid = t.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.attidentity <> '' "
            "UNION "
            "SELECT a.attname, quote_ident(n.nspname) || '.' || quote_ident(c.relname) "
            "FROM pg_attrdef d JOIN t ON d.adrelid = t.oid "
            "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
            "JOIN pg_depend dep ON dep.classid = 'pg_attrdef'::regclass "
            "AND dep.objid = d.oid AND dep.refclassid = 'pg_class'::regclass "
            "JOIN pg_class c ON c.oid = dep.refobjid AND c.relkind = 'S' "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "ORDER BY 1, 2",
            {"schema": table.schema, "name": table.name})
        return [(str(r[0]), str(r[1])) for r in rows if r[1] is not None]

    def volatility(self, call: FunctionCall) -> str | None:
        rows = self._rows(
            "SELECT p.provolatile FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proname = %(name)s AND CASE WHEN %(schema)s::text IS NULL "
            "THEN pg_function_is_visible(p.oid) ELSE n.nspname = %(schema)s END",
            {"schema": call.schema, "name": call.name})
        if not rows:
            return None
        # An overloaded name: which one runs is the server's choice, so the worst counts.
        return VOLATILE if any(r[0] == "v" for r in rows) else NOT_VOLATILE

    def enum_values_transactional(self) -> bool:
        # PostgreSQL 12 let ALTER TYPE … ADD VALUE run (and roll back) in a transaction.
        version = self.conn.info.server_version
        return bool(version >= 120000)


class SqliteCatalog:
    """SQLite's catalog through one sqlite3 connection. The preview's authorizer refuses
    ``PRAGMA`` (and the ``pragma_*`` functions) for approved SQL; the one read of
    ``pragma_function_list`` here lifts it for that read only."""

    def __init__(self, conn: sqlite3.Connection, authorizer: Any) -> None:
        self.conn = conn
        self.authorizer = authorizer
        self._functions: dict[str, list[int]] | None = None

    def triggers(self, table: TableName) -> list[str]:
        if table.schema not in (None, "main", "temp"):
            return []
        master = "sqlite_temp_master" if table.schema == "temp" else "sqlite_master"
        rows = self.conn.execute(
            f"SELECT name FROM {master} WHERE type = 'trigger' AND tbl_name = ? "  # noqa: S608
            "COLLATE NOCASE ORDER BY name", (table.name,)).fetchall()
        return [str(r[0]) for r in rows]

    def foreign_server(self, table: TableName) -> str | None:
        return None  # SQLite has no foreign tables

    def sequence_defaults(self, table: TableName) -> list[tuple[str, str]]:
        # AUTOINCREMENT keeps its counter in sqlite_sequence, an ordinary table that
        # ROLLBACK restores: the preview leaves no trace there.
        return []

    def volatility(self, call: FunctionCall) -> str | None:
        if call.schema is not None:
            return None
        flags = self._function_flags().get(call.name)
        if not flags:
            return None
        if any(not f & _SQLITE_DETERMINISTIC for f in flags):
            return VOLATILE
        return NOT_VOLATILE

    def enum_values_transactional(self) -> bool:
        return True  # SQLite has no enum types

    def _function_flags(self) -> dict[str, list[int]]:
        if self._functions is None:
            self.conn.set_authorizer(None)
            try:
                rows = self.conn.execute("SELECT name, flags FROM pragma_function_list").fetchall()
            except sqlite3.Error:
                rows = []  # a build without the introspection pragmas: every function unknown
            finally:
                self.conn.set_authorizer(self.authorizer)
            functions: dict[str, list[int]] = {}
            for name, flags in rows:
                functions.setdefault(str(name).lower(), []).append(int(flags))
            self._functions = functions
        return self._functions
