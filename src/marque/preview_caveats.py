"""Preview caveats (DESIGN §10): where a rolled-back preview cannot be the whole truth.

A preview runs a change's statements in a transaction that is always rolled
back. For most SQL that shows exactly what execution will do, and leaves
nothing behind. Some statements escape that: a sequence advanced by the
preview is not rewound by ``ROLLBACK``; a notification is only delivered on
commit; a volatile function gives other results each time; triggers change
rows the statement's count does not show; a foreign table's rows live in
another system; some DDL cannot run inside a transaction at all. For each
statement the Pilot names every such case as a *caveat* — an object
``{code, message, detail}`` in the statement's ``preview_caveats`` — so an
approver knows what the preview could not show (and routing may ask for a
second approver, ``caveats = "two_approvers"``).

The codes are a closed set (:data:`CAVEAT_CODES`), documented in
docs/harbour.md. Finding them has two halves: this module reads the
statement with ``sqlglot`` in the target's dialect (which tables it writes or
touches, which functions it calls, which rows it inserts, whether it is
non-transactional DDL) and decides; a :class:`Catalog` of the target, read
inside the preview's own transaction just before the statement runs (so what
earlier statements of the change created is seen), answers what the text
cannot: which triggers a table has, whether it is a foreign table, which
columns default from a sequence, how volatile a function is. Catalog readers
live with the engines (``target/caveat_catalog.py``); this module runs no SQL.

Like the routing classifier, this errs towards saying more: SQL that does not
parse, or that ``sqlglot`` keeps as an opaque command this module does not
recognise, is an ``unanalysed`` caveat (and is still previewed); a procedure
``CALL`` is read as a function call and a ``DO`` block as volatile code; a
function the catalog does not know is a caveat of its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

# sqlglot warns on stderr for statements it keeps as opaque commands; here that is normal.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

__all__ = [
    "CAVEAT_CODES", "SEQUENCE_ADVANCED", "NOTIFY", "VOLATILE_FUNCTION", "UNKNOWN_FUNCTION",
    "UNANALYSED",
    "NON_TRANSACTIONAL_DDL", "TRIGGERS", "FOREIGN_TABLE", "Catalog", "FunctionCall",
    "Insert", "StatementShape", "TableName", "caveat_codes", "shape", "statement_caveats",
]

SEQUENCE_ADVANCED: Final = "sequence_advanced"
NOTIFY: Final = "notify"
VOLATILE_FUNCTION: Final = "volatile_function"
UNKNOWN_FUNCTION: Final = "unknown_function"
UNANALYSED: Final = "unanalysed"
NON_TRANSACTIONAL_DDL: Final = "non_transactional_ddl"
TRIGGERS: Final = "triggers"
FOREIGN_TABLE: Final = "foreign_table"
#: Every caveat code, in the order a statement's caveats are listed.
CAVEAT_CODES: Final = (NON_TRANSACTIONAL_DDL, UNANALYSED, SEQUENCE_ADVANCED, NOTIFY,
                       VOLATILE_FUNCTION, UNKNOWN_FUNCTION, TRIGGERS, FOREIGN_TABLE)

#: Function volatility as a :class:`Catalog` reports it.
VOLATILE: Final = "volatile"
NOT_VOLATILE: Final = "not_volatile"

# Functions whose effect has a caveat of its own (not listed again as volatile).
_SEQUENCE_FUNCTIONS = frozenset({"nextval", "setval"})
_NOTIFY_FUNCTIONS = frozenset({"pg_notify"})
# SQLite's date and time functions read the clock when given 'now' (or no time value).
_SQLITE_CLOCK_FUNCTIONS = frozenset({"date", "time", "datetime", "julianday", "unixepoch",
                                     "strftime", "timediff"})
_SQLITE_CLOCK_KEYWORDS = {exp.CurrentTimestamp: "current_timestamp",
                          exp.CurrentDate: "current_date", exp.CurrentTime: "current_time"}
_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_$]*)\s*\(")


@dataclass(frozen=True)
class TableName:
    """A table as the statement names it: ``schema`` is None when unqualified (the
    target then resolves it as it would, by its search path)."""

    schema: str | None
    name: str

    def shown(self, dialect: str) -> str:
        """``schema.table``, qualified with the dialect's default schema if unqualified."""
        default = "public" if dialect == "postgres" else "main"
        return f"{self.schema or default}.{self.name}"


@dataclass(frozen=True)
class FunctionCall:
    """A function the statement calls. ``builtin``: ``sqlglot`` knows it (so a name the
    catalog does not list is SQL syntax such as ``COALESCE``, not an unknown function);
    ``reads_clock``: a SQLite date/time function given ``'now'`` or no time value."""

    name: str
    schema: str | None = None
    builtin: bool = False
    reads_clock: bool = False
    #: The first string literal among its arguments (a sequence's or a channel's name).
    argument: str | None = None

    def shown(self) -> str:
        """The call as a person reads it: ``schema.name()``."""
        if self.name.startswith("current_") and self.reads_clock:
            return self.name  # SQLite's CURRENT_TIMESTAMP and kin are keywords, not calls
        return f"{self.schema + '.' if self.schema else ''}{self.name}()"


@dataclass(frozen=True)
class Insert:
    """Rows inserted into ``table``: ``columns`` the statement gives values for (None: all,
    no column list), ``uses_default``: the statement spells ``DEFAULT`` somewhere."""

    table: TableName
    columns: tuple[str, ...] | None
    uses_default: bool


@dataclass(frozen=True)
class StatementShape:
    """What the text of one statement says about it (no catalog needed)."""

    written: tuple[TableName, ...] = ()
    touched: tuple[TableName, ...] = ()
    inserts: tuple[Insert, ...] = ()
    functions: tuple[FunctionCall, ...] = ()
    #: Why the statement cannot run inside a transaction, e.g. ``"CREATE INDEX CONCURRENTLY"``.
    non_transactional: str | None = None
    #: ``ALTER TYPE … ADD VALUE``: transactional only on PostgreSQL 12 and later.
    adds_enum_value: bool = False
    #: The text could not be read (it does not parse, or is an opaque command nothing
    #: here recognises): what it does beyond its row count cannot be told.
    unread: bool = False


class Catalog(Protocol):
    """The target's catalog, read inside the preview's transaction."""

    def triggers(self, table: TableName) -> list[str]:
        """The names of the user triggers on ``table`` (none if it does not exist)."""

    def foreign_server(self, table: TableName) -> str | None:
        """The server of ``table`` if it is a foreign table, else None."""

    def sequence_defaults(self, table: TableName) -> list[tuple[str, str]]:
        """``(column, sequence)`` of every column of ``table`` whose default advances a
        sequence (serial, identity, ``DEFAULT nextval(…)``)."""

    def volatility(self, call: FunctionCall) -> str | None:
        """:data:`VOLATILE`, :data:`NOT_VOLATILE`, or None when no such function exists."""

    def enum_values_transactional(self) -> bool:
        """Whether ``ALTER TYPE … ADD VALUE`` can run (and roll back) in a transaction."""


def caveat(code: str, message: str, **detail: Any) -> dict[str, Any]:
    """One caveat object ``{code, message, detail}``."""
    assert code in CAVEAT_CODES, code
    return {"code": code, "message": message, "detail": detail}


def caveat_codes(preview: Any) -> list[str]:
    """The distinct caveat codes of a statement preview object, in order of first
    appearance; none for anything else (an Effect Set preview has no caveats)."""
    codes: list[str] = []
    statements = preview.get("statements") if isinstance(preview, dict) else None
    for statement in statements if isinstance(statements, list) else []:
        found = statement.get("preview_caveats") if isinstance(statement, dict) else None
        for item in found if isinstance(found, list) else []:
            code = item.get("code") if isinstance(item, dict) else None
            if isinstance(code, str) and code not in codes:
                codes.append(code)
    return codes


# -- the text ---------------------------------------------------------------------------------


def _words(sql: str, dialect: str) -> list[str]:
    """The statement's words outside strings and comments, upper-cased; sqlglot keeps
    the rest of an opaque command as one string token, which is split again here."""
    out: list[str] = []
    for token in sqlglot.tokenize(sql, read=dialect):
        if token.token_type == TokenType.STRING and out and out[0] in ("REINDEX", "CLUSTER"):
            out.extend(token.text.upper().split())
        elif token.token_type not in (TokenType.STRING, TokenType.IDENTIFIER):
            out.append(token.text.upper())
    return out


def _non_transactional(words: Sequence[str], dialect: str) -> str | None:
    """The kind of statement that cannot run inside a transaction block, if it is one."""
    head = " ".join(words[:2])
    if dialect == "sqlite":
        return "VACUUM" if words[:1] == ["VACUUM"] else None
    if words[:1] == ["VACUUM"]:
        return "VACUUM"
    if head in ("CREATE DATABASE", "DROP DATABASE", "CREATE TABLESPACE", "DROP TABLESPACE",
                "ALTER SYSTEM", "CREATE SUBSCRIPTION", "DROP SUBSCRIPTION"):
        return head
    if words[:1] == ["CREATE"] and "INDEX" in words[:3] and "CONCURRENTLY" in words[:4]:
        return "CREATE INDEX CONCURRENTLY"
    if head == "DROP INDEX" and "CONCURRENTLY" in words[:3]:
        return "DROP INDEX CONCURRENTLY"
    if words[:1] == ["REINDEX"]:
        if "CONCURRENTLY" in words:
            return "REINDEX CONCURRENTLY"
        if any(w in ("DATABASE", "SYSTEM") for w in words[1:4]):
            return "REINDEX " + next(w for w in words[1:4] if w in ("DATABASE", "SYSTEM"))
    if words[:1] == ["CLUSTER"] and all(w in ("CLUSTER", "VERBOSE", "(", ")", ";")
                                        for w in words):
        return "CLUSTER without a table"
    if head == "ALTER TABLE" and "DETACH" in words and "CONCURRENTLY" in words:
        return "ALTER TABLE … DETACH PARTITION … CONCURRENTLY"
    if head == "ALTER DATABASE" and "TABLESPACE" in words:
        return "ALTER DATABASE … SET TABLESPACE"
    return None


def _identifier(node: Any, dialect: str) -> str:
    if isinstance(node, exp.Identifier):
        if node.quoted and dialect == "postgres":
            return str(node.this)
        return str(node.this).lower()
    return str(node).lower()


def _table(table: exp.Table, dialect: str) -> TableName:
    db = table.args.get("db")
    return TableName(_identifier(db, dialect) if db is not None else None,
                     _identifier(table.this, dialect))


def _first_string(node: Any) -> str | None:
    for literal in node.find_all(exp.Literal):
        if literal.is_string:
            return str(literal.this)
    return None


def _function(node: exp.Func, dialect: str) -> FunctionCall | None:
    if isinstance(node, exp.Anonymous):
        schema = None
        parent = node.parent
        if isinstance(parent, exp.Dot) and parent.expression is node:
            schema = _identifier(parent.this.this if isinstance(parent.this, exp.Column)
                                 else parent.this, dialect)
        name = node.this
        text = (_identifier(name, dialect) if isinstance(name, exp.Identifier)
                else str(name).lower())
        builtin = False
    elif dialect == "sqlite" and type(node) in _SQLITE_CLOCK_KEYWORDS:
        return FunctionCall(_SQLITE_CLOCK_KEYWORDS[type(node)], builtin=True, reads_clock=True)
    else:
        match = _NAME.match(node.sql(dialect=dialect))
        if match is None:
            return None  # syntax, not a call (CURRENT_TIMESTAMP, CASE, …)
        text, schema, builtin = match.group(1).lower(), None, True
    reads_clock = False
    if dialect == "sqlite" and text in _SQLITE_CLOCK_FUNCTIONS:
        literals = [str(lit.this).lower() for lit in node.find_all(exp.Literal) if lit.is_string]
        args = [a for a in node.args.values() if a is not None]
        reads_clock = "now" in literals or not args or (text == "strftime" and len(literals) < 2)
    return FunctionCall(text, schema, builtin, reads_clock, _first_string(node))


def shape(sql: str, dialect: str) -> StatementShape:
    """What ``sql`` (one statement) says about itself in ``dialect`` (``postgres`` or
    ``sqlite``). Never raises: text that cannot be read is ``unread`` (unless its
    leading words name a non-transactional kind, which is all its caveat needs)."""
    try:
        words = _words(sql, dialect)
    except Exception:  # sqlglot raises several error types on odd input
        words = []
    non_transactional = _non_transactional(words, dialect)
    adds_enum_value = (dialect == "postgres" and words[:2] == ["ALTER", "TYPE"]
                       and "ADD" in words and "VALUE" in words)
    try:
        parsed = [s for s in sqlglot.parse(sql, read=dialect) if isinstance(s, exp.Expression)]
    except Exception:
        parsed = []
    written: list[TableName] = []
    touched: list[TableName] = []
    inserts: list[Insert] = []
    functions: list[FunctionCall] = []
    unread = not parsed
    for statement in parsed:
        if isinstance(statement, exp.Command):
            # Kept whole by sqlglot: only its leading words say what it is.
            unread |= not _read_command(statement, words, dialect, functions)
            continue
        try:
            _read_statement(statement, dialect, written, touched, inserts, functions)
        except Exception:  # an AST shape not foreseen: say what was found so far
            unread = True
    if non_transactional is not None or adds_enum_value or _plain_command(words):
        unread = False  # recognised by its words, which is all its caveat needs
    return StatementShape(tuple(written), tuple(touched), tuple(inserts), tuple(functions),
                          non_transactional, adds_enum_value, unread)


_CALLED = re.compile(r'\s*((?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)'
                     r'(?:\s*\.\s*(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?)\s*\(')
# Opaque commands whose whole effect is their own, rolled back with the preview.
_PLAIN_COMMANDS = (("CREATE", "FUNCTION"), ("CREATE", "PROCEDURE"), ("CREATE", "OR"),
                   ("REINDEX",), ("CLUSTER",), ("ALTER", "TYPE"), ("COMMENT",))


def _read_command(statement: exp.Command, words: Sequence[str], dialect: str,
                  functions: list[FunctionCall]) -> bool:
    """Read an opaque command; False when nothing says what it does."""
    head = str(statement.this).upper()
    rest = statement.expression
    text = str(rest.this) if isinstance(rest, exp.Literal) else ""
    if head == "CALL":
        # A procedure runs code the preview cannot list: read it like a function call.
        match = _CALLED.match(text)
        if match is None:
            return False
        parts = [p.strip() for p in match.group(1).split(".")]
        names = [p[1:-1] if p.startswith('"') else p.lower() for p in parts]
        schema, name = (names[0], names[1]) if len(names) == 2 else (None, names[0])
        _add(functions, FunctionCall(name, schema))
        return True
    if head == "DO":
        _add(functions, FunctionCall("DO", builtin=True))
        return True
    return _plain_command(words)


def _plain_command(words: Sequence[str]) -> bool:
    return any(tuple(words[:len(prefix)]) == prefix for prefix in _PLAIN_COMMANDS)


def _add(items: list[Any], item: Any) -> None:
    if item not in items:
        items.append(item)


def _read_statement(statement: exp.Expression, dialect: str, written: list[TableName],
                    touched: list[TableName], inserts: list[Insert],
                    functions: list[FunctionCall]) -> None:
    for table in statement.find_all(exp.Table):
        if isinstance(table.this, exp.Identifier):
            _add(touched, _table(table, dialect))
    for node in statement.walk():
        if isinstance(node, exp.Insert | exp.Update | exp.Delete | exp.Merge):
            target = node.this
            schema = target if isinstance(target, exp.Schema) else None
            if schema is not None:
                target = schema.this
            if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
                continue
            name = _table(target, dialect)
            _add(written, name)
            if isinstance(node, exp.Insert | exp.Merge):
                columns = None
                if schema is not None and schema.expressions:
                    columns = tuple(_identifier(c.this if isinstance(c, exp.Column) else c,
                                                dialect) for c in schema.expressions)
                if isinstance(node, exp.Merge):
                    columns = None  # its INSERT branch is not read column by column
                uses_default = any(isinstance(n, exp.Var) and str(n.this).upper() == "DEFAULT"
                                   or isinstance(n, exp.Column) and n.name.upper() == "DEFAULT"
                                   and not n.table for n in node.walk())
                _add(inserts, Insert(name, columns, uses_default))
        elif isinstance(node, exp.TruncateTable):
            for table in node.expressions:
                if isinstance(table, exp.Table) and isinstance(table.this, exp.Identifier):
                    _add(written, _table(table, dialect))
        elif isinstance(node, exp.Func) or dialect == "sqlite" and isinstance(
                node, tuple(_SQLITE_CLOCK_KEYWORDS)):
            call = _function(node, dialect) if isinstance(node, exp.Func) else None
            if call is not None:
                _add(functions, call)


# -- statement and catalog together -------------------------------------------------------------


def statement_caveats(sql: str, dialect: str, catalog: Catalog | None) -> tuple[
        list[dict[str, Any]], bool]:
    """The caveats of one statement and whether it may be previewed at all.

    ``(caveats, previewable)``: ``previewable`` is False for a statement that
    cannot run inside a transaction — the preview must then not run it (and says
    so). ``catalog`` None (no catalog could be read) gives only what the text
    shows.
    """
    found = shape(sql, dialect)
    out = _reading_caveats(found, dialect, catalog)
    previewable = not any(c["code"] == NON_TRANSACTIONAL_DDL for c in out)
    out += _rollback_caveats(found, dialect, catalog)
    out += _function_caveats(found, catalog)
    if catalog is not None:
        out += _catalog_caveats(found, dialect, catalog)
    return out, previewable


def _reading_caveats(found: StatementShape, dialect: str,
                     catalog: Catalog | None) -> list[dict[str, Any]]:
    """A statement that cannot run in a transaction, or that could not be read."""
    out: list[dict[str, Any]] = []
    kind = found.non_transactional
    if kind is None and found.adds_enum_value and catalog is not None \
            and not catalog.enum_values_transactional():
        kind = "ALTER TYPE … ADD VALUE"
    if kind is not None:
        out.append(caveat(
            NON_TRANSACTIONAL_DDL,
            f"{kind} cannot run inside a transaction: it was not previewed, and the Pilot, "
            "which runs every change in one transaction, will fail on it too",
            statement_kind=kind, previewed=False))
    if found.unread:
        out.append(caveat(
            UNANALYSED,
            "the statement could not be read here (it does not parse in the "
            f"{dialect} dialect, or is a command nothing here recognises): what it does "
            "beyond its row count could not be told"))
    return out


def _rollback_caveats(found: StatementShape, dialect: str,
                      catalog: Catalog | None) -> list[dict[str, Any]]:
    """What the preview's ROLLBACK does not undo, or did not deliver: sequences, NOTIFY."""
    out: list[dict[str, Any]] = []
    sequences = _sequences(found, dialect, catalog)
    if sequences:
        names = ", ".join(dict.fromkeys(s["sequence"] for s in sequences))
        out.append(caveat(
            SEQUENCE_ADVANCED,
            f"changes sequence(s) {names}: ROLLBACK does not rewind a sequence, so a "
            "rolled-back preview uses up values for good, and execution takes others",
            sequences=sequences))
    channels = [c.argument or "?" for c in found.functions if c.name in _NOTIFY_FUNCTIONS]
    if channels:
        out.append(caveat(
            NOTIFY,
            f"sends notification(s) on {', '.join(dict.fromkeys(channels))}: the rolled-back "
            "preview delivered none; execution delivers them when it commits",
            channels=list(dict.fromkeys(channels))))
    return out


def _function_caveats(found: StatementShape, catalog: Catalog | None) -> list[dict[str, Any]]:
    """Functions that may answer otherwise at execution, or that the catalog does not know."""
    out: list[dict[str, Any]] = []
    volatile, unknown = _functions(found, catalog)
    if volatile:
        out.append(caveat(
            VOLATILE_FUNCTION,
            f"calls volatile function(s) {', '.join(volatile)}: they may return other values "
            "at execution than in the preview, and whatever they do outside this transaction "
            "is not rolled back", functions=volatile))
    if unknown:
        out.append(caveat(
            UNKNOWN_FUNCTION,
            f"calls function(s) {', '.join(unknown)} the target's catalog does not list: "
            "what they do could not be told", functions=unknown))
    return out


def _catalog_caveats(found: StatementShape, dialect: str,
                     catalog: Catalog) -> list[dict[str, Any]]:
    """Tables whose triggers or foreign servers do what the row counts cannot show."""
    out: list[dict[str, Any]] = []
    triggers: list[dict[str, Any]] = [
        {"table": t.shown(dialect), "triggers": listed}
        for t in found.written if (listed := catalog.triggers(t))]
    if triggers:
        shown = "; ".join(f"{t['table']}: {', '.join(t['triggers'])}" for t in triggers)
        out.append(caveat(
            TRIGGERS,
            f"writes table(s) with triggers ({shown}): what the triggers change is not in "
            "the preview's row counts", tables=triggers))
    foreign = [{"table": t.shown(dialect), "server": server}
               for t in found.touched if (server := catalog.foreign_server(t))]
    if foreign:
        shown = ", ".join(f"{f['table']} (server {f['server']})" for f in foreign)
        out.append(caveat(
            FOREIGN_TABLE,
            f"touches foreign table(s) {shown}: their rows live outside this database, "
            "they may differ at execution, and what is written to them may not roll back",
            tables=foreign))
    return out


def _sequences(found: StatementShape, dialect: str,
               catalog: Catalog | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for call in found.functions:
        if call.name in _SEQUENCE_FUNCTIONS and dialect == "postgres":
            out.append({"sequence": call.argument or "?", "through": call.name})
    if catalog is None:
        return out
    for insert in found.inserts:
        for column, sequence in catalog.sequence_defaults(insert.table):
            given = insert.columns is not None and column in insert.columns
            if not given or insert.uses_default:
                out.append({"sequence": sequence, "through": "default",
                            "table": insert.table.shown(dialect), "column": column})
    return out


def _functions(found: StatementShape, catalog: Catalog | None) -> tuple[list[str], list[str]]:
    volatile: list[str] = []
    unknown: list[str] = []
    for call in found.functions:
        if call.name in _SEQUENCE_FUNCTIONS | _NOTIFY_FUNCTIONS:
            continue
        if call.reads_clock:
            _add(volatile, call.shown())
            continue
        if call.name == "DO" and call.builtin:
            _add(volatile, "DO block")
            continue
        if catalog is None:
            continue
        kind = catalog.volatility(call)
        if kind == VOLATILE:
            _add(volatile, call.shown())
        elif kind is None and not call.builtin:
            _add(unknown, call.shown())
    return volatile, unknown
