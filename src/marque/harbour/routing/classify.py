"""Statement classification for routing (DESIGN §11.3): what a statement does, and to what.

``classify(sql, dialect)`` parses one statement with ``sqlglot`` in the
target's dialect (``"postgres"`` or ``"sqlite"``) and returns its
:class:`Access` tuples — every resource it touches, each with an operation
``read | write | ddl | other``. Routing checks *every* tuple, so the classifier
errs towards more tuples and stronger operations, never fewer:

* **read** only for a plain query — a ``SELECT`` (or ``VALUES``, or set
  operations of those) with no data-modifying CTE (``WITH d AS (DELETE …)
  SELECT …``), no ``SELECT … INTO`` and no locking clause (``FOR UPDATE``,
  ``FOR NO KEY UPDATE``, ``FOR SHARE``, ``FOR KEY SHARE``). A query that has
  any of these is a **write**: the ``INTO`` table, the tables under the lock,
  the DML targets of its CTEs are written. A token-level backstop also turns
  a would-be read that contains ``INTO`` or ``FOR UPDATE|SHARE|NO|KEY`` into a
  write, in case the parser ever drops such a clause.
* **write** for ``INSERT``, ``UPDATE``, ``DELETE`` and ``MERGE`` on their
  target table; every other table they mention (a ``FROM``, ``USING``, a
  subquery) is a **read** tuple of the same statement, so reading a table
  through a write still needs read routing for it.
* **ddl** for ``CREATE``, ``ALTER`` and ``DROP`` of a table or view (and
  ``CREATE INDEX`` on its table), and for ``TRUNCATE``: it removes every row
  at once, without row-level triggers, under an exclusive lock — an act on the
  table rather than on its rows, so it is routed with schema changes. DDL on
  anything that is not a table (functions, sequences, triggers, schemas,
  indexes by name, …) is ddl on ``"*"``.
* **other** on ``"*"`` for everything else: ``COPY`` (in any direction),
  ``CALL``, ``DO``, ``PRAGMA``, ``SET``, ``EXPLAIN``, ``GRANT``, ``ATTACH``,
  ``VACUUM``, transaction control, statements ``sqlglot`` only keeps as an
  opaque command, text that does not parse at all, and anything unknown.
  ``classify`` never raises on bad SQL.

**Functions.** No classifier sees inside a function: ``SELECT delete_all()``
or ``SELECT nextval('s')`` parse as plain queries and *are* classified
``read``. What keeps that safe is not this module: a request evaluated as
all-read is issued with ``"access": "read_only"`` and the Pilot runs it in a
read-only transaction, where such a function's write fails. A function body
can also touch any table, so a call to a function ``sqlglot`` does not know as
a built-in (a user-defined or schema-qualified function, or an explicit
``OPERATOR(…)``) adds a tuple ``(statement's operation, "*")``. A statement
that names no table at all (``SELECT 1``) is classified on ``"*"`` too, so
every statement yields at least one tuple and is routed.

**Resource names** are ``schema.table``. An unqualified name is qualified
with the schema it resolves to under the default search rules: ``public`` on
PostgreSQL (assuming the target role's ``search_path`` is the default; a name
PostgreSQL would find in ``pg_catalog`` or ``pg_temp`` first is still reported
as ``public.…``) and ``main`` on SQLite (a ``temp`` table of the same name
would shadow it). Unquoted identifiers are lower-cased (PostgreSQL folds them;
SQLite ignores case, so every SQLite name is lower-cased); a quoted PostgreSQL
identifier keeps its case, because ``"Orders"`` is a different table from
``orders``. A PostgreSQL database qualifier (``db.schema.table``) is dropped:
the server refuses cross-database references. Names that refer to a CTE of
the statement are not resources.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from marque.errors import InvalidInput

# sqlglot warns on stderr whenever it keeps a statement as an opaque command
# (CALL, DO, …); for the classifier that is an answer (`other`), not news.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

__all__ = ["Access", "DIALECTS", "ANY_RESOURCE", "READ", "WRITE", "DDL", "OTHER_OPERATION",
           "classify"]

#: The dialects statements can be classified in (sqlglot's names).
DIALECTS: Final = ("postgres", "sqlite")
#: The resource of a tuple that may touch any table.
ANY_RESOURCE: Final = "*"

READ: Final = "read"
WRITE: Final = "write"
DDL: Final = "ddl"
OTHER_OPERATION: Final = "other"

_DEFAULT_SCHEMA = {"postgres": "public", "sqlite": "main"}
_QUERY_TYPES = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)
_WRITE_TYPES = (exp.Insert, exp.Update, exp.Delete, exp.Merge)
_DDL_TYPES = (exp.Create, exp.Drop, exp.Alter, exp.TruncateTable)
# Nodes that make a statement "other" wherever they appear: opaque commands,
# COPY (a DML subclass in sqlglot, but it reads or writes files and programs),
# and session or transaction control.
_OTHER_TYPES: tuple[type[exp.Expression], ...] = (
    exp.Command, exp.Copy, exp.Pragma, exp.Set, exp.Transaction, exp.Commit, exp.Rollback,
    exp.Use, exp.Grant, exp.Attach, exp.Detach,
)
_TABLE_KINDS = frozenset({"TABLE", "VIEW"})
_LOCK_WORDS = frozenset({"UPDATE", "SHARE", "NO", "KEY"})


@dataclass(frozen=True, order=True)
class Access:
    """One tuple of a statement: an operation on a resource (``schema.table`` or ``"*"``)."""

    operation: str
    resource: str


def classify(sql: str, dialect: str) -> list[Access]:
    """The :class:`Access` tuples of ``sql`` in ``dialect`` (see the module docstring).

    Never raises for SQL it cannot parse or does not know: that is
    ``[Access("other", "*")]``. Raises :class:`InvalidInput` only for an
    unknown ``dialect``. Tuples are de-duplicated, in order of first appearance.
    """
    if dialect not in DIALECTS:
        raise InvalidInput(f"unknown SQL dialect {dialect!r} (one of {', '.join(DIALECTS)})")
    unknown = [Access(OTHER_OPERATION, ANY_RESOURCE)]
    try:
        statements = sqlglot.parse(sql, read=dialect)
        tokens = sqlglot.tokenize(sql, read=dialect)
    except Exception:  # sqlglot raises several error types (and worse) on odd input
        return unknown
    if not statements or any(not isinstance(s, exp.Expression) for s in statements):
        return unknown
    out: list[Access] = []
    for statement in statements:
        assert isinstance(statement, exp.Expression)
        try:
            accesses = _classify_statement(statement, dialect, tokens)
        except Exception:  # an AST shape this module did not foresee: be conservative
            accesses = unknown
        for access in accesses:
            if access not in out:
                out.append(access)
    return out


def _classify_statement(
    statement: exp.Expression, dialect: str, tokens: list[Token]
) -> list[Access]:
    operation = _operation(statement, tokens)
    if operation == OTHER_OPERATION:
        return [Access(OTHER_OPERATION, ANY_RESOURCE)]
    if operation == DDL and not _ddl_on_table(statement):
        return [Access(DDL, ANY_RESOURCE)]
    strong = _strong_tables(statement)
    out: list[Access] = []
    for table in statement.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier) or _is_cte_reference(table, dialect):
            continue
        out.append(Access(strong.get(id(table), READ), _resource(table, dialect)))
    if _calls_unknown_function(statement) or not any(a.operation == operation for a in out):
        out.append(Access(operation, ANY_RESOURCE))
    return out


def _operation(statement: exp.Expression, tokens: list[Token]) -> str:
    if any(isinstance(node, _OTHER_TYPES) for node in statement.walk()):
        return OTHER_OPERATION
    if isinstance(statement, _DDL_TYPES):
        return DDL
    if isinstance(statement, _WRITE_TYPES):
        return WRITE
    if not isinstance(statement, _QUERY_TYPES):
        return OTHER_OPERATION
    for node in statement.walk():
        if isinstance(node, _WRITE_TYPES):
            return WRITE  # a data-modifying CTE
        if isinstance(node, _DDL_TYPES):
            return OTHER_OPERATION  # nothing sane nests DDL in a query
        if isinstance(node, exp.Select) and (node.args.get("into") or node.args.get("locks")):
            return WRITE
    if _tokens_lock_or_into(tokens):
        return WRITE
    return READ


def _tokens_lock_or_into(tokens: list[Token]) -> bool:
    """Backstop: ``INTO`` or ``FOR UPDATE|SHARE|NO KEY|KEY SHARE`` anywhere in the text."""
    for index, token in enumerate(tokens):
        if token.token_type == TokenType.INTO:
            return True
        if token.token_type == TokenType.FOR and index + 1 < len(tokens):
            if tokens[index + 1].text.upper() in _LOCK_WORDS:
                return True
    return False


def _ddl_on_table(statement: exp.Expression) -> bool:
    """Whether a DDL statement acts on tables (or views) we can name; else it is ddl on ``*``."""
    if isinstance(statement, exp.TruncateTable):
        return True
    kind = str(statement.args.get("kind") or "").upper()
    if isinstance(statement, exp.Create) and kind == "INDEX":
        index = statement.this
        return isinstance(index, exp.Index) and isinstance(index.args.get("table"), exp.Table)
    return kind in _TABLE_KINDS


def _strong_tables(statement: exp.Expression) -> dict[int, str]:
    """Table nodes that are written or altered (by ``id``), with that operation."""
    strong: dict[int, str] = {}

    def mark(node: object, operation: str) -> None:
        if isinstance(node, exp.Schema):
            node = node.this
        if isinstance(node, exp.Index):
            node = node.args.get("table")
        if isinstance(node, exp.Table):
            strong[id(node)] = operation

    if isinstance(statement, exp.TruncateTable):
        for table in statement.expressions:
            mark(table, DDL)
    elif isinstance(statement, exp.Drop):
        for table in statement.args.get("tables") or [statement.this]:
            mark(table, DDL)
    elif isinstance(statement, exp.Alter):
        # Every table an ALTER names is altered or bound to (RENAME TO, REFERENCES).
        for table in statement.find_all(exp.Table):
            mark(table, DDL)
    elif isinstance(statement, exp.Create):
        mark(statement.this, DDL)
    for node in statement.walk():
        if isinstance(node, _WRITE_TYPES):
            mark(node.this, WRITE)
        elif isinstance(node, exp.Select):
            into = node.args.get("into")
            if isinstance(into, exp.Into):
                mark(into.this, WRITE)
            if node.args.get("locks"):
                for table in node.find_all(exp.Table):
                    strong.setdefault(id(table), WRITE)
    return strong


def _calls_unknown_function(statement: exp.Expression) -> bool:
    """A call sqlglot does not know as a built-in: its body is hidden, so it may touch anything."""
    return any(
        isinstance(node, exp.Anonymous | exp.AnonymousAggFunc | exp.Operator)
        for node in statement.walk()
    )


def _name(identifier: object, dialect: str) -> str:
    if isinstance(identifier, exp.Identifier):
        text = identifier.this
        if dialect == "postgres" and identifier.quoted:
            return str(text)
        return str(text).lower()
    return str(identifier).lower()


def _resource(table: exp.Table, dialect: str) -> str:
    db = table.args.get("db")
    schema = _name(db, dialect) if db is not None else _DEFAULT_SCHEMA[dialect]
    return f"{schema}.{_name(table.this, dialect)}"


def table_resource(table: str, dialect: str) -> str:
    """The resource of a table an Effect Set member names (``name`` or ``schema.name``, plain
    identifiers): qualified with the dialect's default schema and named as the classifier
    names a *quoted* identifier, since the Pilot quotes every identifier it writes —
    lower-cased on SQLite (it ignores case), exact on PostgreSQL (``"Orders"`` is not
    ``orders``)."""
    if dialect not in DIALECTS:
        raise InvalidInput(f"unknown SQL dialect {dialect!r} (one of {', '.join(DIALECTS)})")
    schema, _, name = table.rpartition(".")
    schema = schema or _DEFAULT_SCHEMA[dialect]
    if dialect != "postgres":
        schema, name = schema.lower(), name.lower()
    return f"{schema}.{name}"


def _with_clause(node: exp.Expression) -> exp.With | None:
    for value in node.args.values():
        if isinstance(value, exp.With):
            return value
    return None


def _is_cte_reference(table: exp.Table, dialect: str) -> bool:
    """Whether an unqualified table name resolves to a CTE in scope rather than a table.

    A non-recursive CTE sees only the CTEs defined before it; a recursive WITH
    sees all of its CTEs; the body of a statement sees all of its own.
    """
    if table.args.get("db") is not None or table.args.get("catalog") is not None:
        return False
    name = _name(table.this, dialect)
    chain: list[Any] = [table]
    parent = table.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    for position in range(1, len(chain)):
        clause = _with_clause(chain[position])
        if clause is None:
            continue
        ctes = list(clause.expressions)
        aliases = [_name(_alias_identifier(cte), dialect) for cte in ctes]
        if chain[position - 1] is clause:
            # The table sits inside one of this WITH's own CTE definitions.
            inner = chain[position - 2]
            index = next((i for i, cte in enumerate(ctes) if cte is inner), len(ctes))
            visible = aliases if clause.args.get("recursive") else aliases[:index]
        else:
            visible = aliases
        if name in visible:
            return True
    return False


def _alias_identifier(cte: exp.Expression) -> object:
    alias = cte.args.get("alias")
    if isinstance(alias, exp.TableAlias):
        return alias.this
    return cte.alias
