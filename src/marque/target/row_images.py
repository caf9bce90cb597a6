"""Row images of a rolled-back preview: every changed row before and after (DESIGN §10).

An approver deciding on ``UPDATE accounts SET balance = balance - 10 WHERE id = 1``
is owed the row, not a count. Inside the preview's own transaction — which is
always rolled back — the engine runs, around the statement exactly as approved,
*additional* statements derived from it with ``sqlglot``:

* before it: ``SELECT * FROM <target> WHERE <its WHERE>`` (``UPDATE``/``DELETE``),
  binding the same parameter values the ``WHERE``'s placeholders take, or a
  ``SELECT`` of the keys an ``INSERT``'s ``VALUES`` name (``INSERT``, ``ON
  CONFLICT``, SQLite's ``OR IGNORE``);
* after it: a ``SELECT`` of those keys, giving the new images — or, for an
  ``INSERT`` whose keys the database makes, of the keys its own ``RETURNING``
  gave.

Rows are keyed by the table's primary key, or where it has none by a unique
index over NOT NULL columns (the schema's own declaration that each row is
named by them), or where it has neither by the row key the Pilot's operator
declared for it (``pilot.json``'s ``row_keys``, ``marque pilot target row-key``).
``key_source`` says which (``primary_key``, ``unique_index``, ``declared``). A
declared key is the operator's word, not the schema's: if two rows of the images
share one, or one is NULL, the statement is count only (``code``
``declared_key_not_unique`` / ``declared_key_null``), never a diff that merges
two rows. Whatever cannot be imaged soundly is
said per statement, never guessed: ``{"status": "unavailable", "reason": …}`` —
a table without a primary key, several tables, a ``WITH``, a ``WHERE`` with a
subquery or a function the parser does not know, keys the database makes
(defaults, sequences), a change of the key itself, ``REPLACE``. A ``MERGE``
(PostgreSQL 15+) is imaged by :mod:`marque.target.merge_images`.
The count a statement reports must equal the rows the images account for; if
it does not (another transaction changed rows between the two reads, a trigger,
a conflict on another constraint) the images are dropped as unavailable.

A captured statement stores up to :data:`ROW_IMAGE_CAP` rows in key order
(``shown``), with the exact ``total`` and ``truncated`` past the cap, and
``before_cid``: the CID of *every* row's key and before-image (not only the ones
shown) — what revalidation at approval compares, because a before-image does
not change from one rolled-back run to the next unless the data did (new
values such as ``now()`` or a sequence's next number would).

Values are typed JSON (:mod:`marque.target.image_values`): a jsonb as its JSON,
json as its text, arrays as lists, bytes as ``{"$bytes": …}``, numerics as exact
text. A captured statement whose table has typed columns names them in
``types``, and a diff holding one is ``marque-row-diff/0.2``; a plain table's
images keep the 0.1 bytes they always had.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlglot
from sqlglot import exp

from marque.cid import cid
from marque.target.image_values import BYTES_TAG, UNENCODED_TAG, encode, typed_kind

__all__ = ["ROW_DIFF_VERSION", "ROW_DIFF_VERSION_PLAIN", "ROW_IMAGE_CAP", "KEY_SOURCES",
           "ImageSession", "Capture", "ImageUnavailable",
           "start_capture", "finish_capture", "explain_images", "writes_rows",
           "unavailable", "diff_body",
           "diff_cid", "before_state"]

#: The version of the diff's content-id preimage (:func:`diff_body`): 0.2 holds typed
#: values (an image with ``types``); a diff with none keeps 0.1, its bytes unchanged.
ROW_DIFF_VERSION = "marque-row-diff/0.2"
#: The version of a diff none of whose images holds a typed value.
ROW_DIFF_VERSION_PLAIN = "marque-row-diff/0.1"
#: Rows stored in full per statement; past it the first ones in key order, and the count.
ROW_IMAGE_CAP = 100

_WRITE_KINDS = (exp.Update, exp.Delete, exp.Insert, exp.Merge)


#: Where a statement's row key came from (``row_images.key_source``).
KEY_SOURCES = ("primary_key", "unique_index", "declared")


class ImageUnavailable(Exception):
    """A derived query could not be run: the statement is previewed by count only.
    ``code`` names the reason where a caller may act on it (None: said in words only)."""

    def __init__(self, reason: str, code: str | None = None) -> None:
        super().__init__(reason)
        self.code = code


class ImageSession(Protocol):
    """What an engine lends the capture inside its preview transaction."""

    #: sqlglot's name of the engine's SQL dialect.
    dialect: str

    def query(self, sql: str, params: Sequence[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one derived ``SELECT``; its column names and every row. A failure leaves
        the preview's transaction usable and raises :class:`ImageUnavailable`."""

    def primary_key(self, table_sql: str, schema: str | None, name: str) -> list[str]:
        """The columns that name a table's rows, in key order: its primary key, else a
        unique index over NOT NULL columns ([] when it has neither)."""

    def row_key(self, table_sql: str, schema: str | None, name: str) -> tuple[list[str], str]:
        """As :meth:`primary_key`, else the key declared for the table; with where it came
        from (one of :data:`KEY_SOURCES`, or ``""`` with ``[]`` when there is none)."""

    def column_types(self, table_sql: str) -> dict[str, str]:
        """The table's declared column types by column name ({} where the engine's values
        say their own type, as SQLite's do)."""


def unavailable(reason: str, code: str | None = None) -> dict[str, Any]:
    """A statement's ``row_images`` when its rows cannot be imaged soundly (``code`` only
    where a reason has one, so older previews keep their bytes)."""
    images: dict[str, Any] = {"status": "unavailable", "reason": reason}
    if code is not None:
        images["code"] = code
    return images


def _value(value: Any, type_name: str | None = None) -> Any:
    # Typed JSON, with one canonical form (the diff is hashed): marque.target.image_values.
    return encode(value, type_name)


def _key_order(key: list[Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def _sorted(orders: Any) -> list[str]:
    """Canonical key texts in the keys' natural order: numbers by value, before text."""
    def rank(value: Any) -> tuple[int, Any]:
        if value is None:
            return (0, 0)
        if isinstance(value, bool | int | float):
            return (1, value)
        return (2, str(value))
    return sorted(orders, key=lambda o: [rank(v) for v in json.loads(o)])


@dataclass
class _Plan:
    #: update | delete | insert | upsert | returned (an insert keyed by RETURNING) | merge
    kind: str
    table: exp.Table  # without its alias
    key: list[str]
    before_sql: str | None
    before_params: list[Any]
    #: INSERT: each row's key as SQL expressions and their parameters.
    insert_keys: list[tuple[list[str], list[Any]]] | None = None
    #: upsert: DO UPDATE (True) or DO NOTHING / OR IGNORE (False); merge: it may insert.
    updates_on_conflict: bool = False
    #: merge: a WHEN MATCHED clause may delete.
    merge_deletes: bool = False
    #: One of KEY_SOURCES: the schema's key, or the operator's declared one.
    key_source: str = "primary_key"


def _not_a_key(plan: _Plan, key: list[Any], repeated: bool) -> ImageUnavailable:
    names = ", ".join(plan.key)
    shown = json.dumps(dict(zip(plan.key, key, strict=True)), default=str)[:200]
    if repeated:
        return ImageUnavailable(
            f"the {plan.key_source.replace('_', ' ')} row key ({names}) of "
            f"{plan.table.sql()} is not unique: two rows hold {shown}, so a diff keyed by "
            "it could merge them; previewed by count only",
            code="declared_key_not_unique" if plan.key_source == "declared" else None)
    return ImageUnavailable(
        f"a row of {plan.table.sql()} holds NULL in its {plan.key_source.replace('_', ' ')} "
        f"row key ({names}): {shown}, which names no row; previewed by count only",
        code="declared_key_null")


class Capture:
    """The row images of one statement, taken around it (:func:`start_capture`)."""

    def __init__(self, plan: _Plan, columns: list[str], before: list[tuple[Any, ...]]):
        self._plan = plan
        self._columns = columns
        self._before = before
        #: Declared column types (PostgreSQL), and the columns holding a typed form.
        self.declared_types: dict[str, str] = {}
        self.types: dict[str, str] = {}

    def _encode(self, column: str, value: Any, record: bool = True) -> Any:
        declared = self.declared_types.get(column)
        encoded = _value(value, declared)
        if record and isinstance(encoded, dict) \
                and (BYTES_TAG in encoded or UNENCODED_TAG in encoded):
            self.types[column] = declared or ("blob" if BYTES_TAG in encoded
                                              else type(value).__name__)
        return encoded

    def _keyed(self, columns: list[str], rows: list[tuple[Any, ...]], record: bool = True
               ) -> dict[str, tuple[list[Any], dict[str, Any], list[Any]]]:
        """Rows by the canonical text of their key: ``(key as JSON, row as JSON, key as
        the driver gave it)`` — the raw key is what a later query binds. ``record``: the
        rows are shown (not only a statement's RETURNING, read by other loaders)."""
        if not rows:
            return {}
        lowered = [c.lower() for c in columns]
        if any(k.lower() not in lowered for k in self._plan.key):
            raise ImageUnavailable("the row-image query did not return the key columns: "
                                   "previewed by count only")
        index = [lowered.index(k.lower()) for k in self._plan.key]
        out: dict[str, tuple[list[Any], dict[str, Any], list[Any]]] = {}
        for row in rows:
            key = [self._encode(columns[i], row[i], record) for i in index]
            order = _key_order(key)
            declared = self._plan.key_source == "declared"
            if order in out or (declared and None in key):
                # A declared key can do this (and a SQLite primary key, which admits NULLs);
                # merged into one row, two rows would make a wrong diff.
                raise _not_a_key(self._plan, key, order in out)
            out[order] = (key, {c: self._encode(c, v, record)
                                for c, v in zip(columns, row, strict=True)},
                          [row[i] for i in index])
        return out

    def finish(self, session: ImageSession, rowcount: int,
               returned: tuple[list[str], list[tuple[Any, ...]]] | None = None
               ) -> dict[str, Any]:
        """Read the after-images and build the statement's ``row_images``."""
        plan = self._plan
        if plan.kind == "returned":
            # Keys the database made, named by the statement's own RETURNING.
            if returned is None or len(returned[1]) != rowcount:
                raise ImageUnavailable("the statement's RETURNING did not name every "
                                       "inserted row: previewed by count only")
            mark = "%s" if session.dialect == "postgres" else "?"
            named = self._keyed(*returned, record=False)
            plan = _Plan("insert", plan.table, plan.key, None, [],
                         insert_keys=[([mark] * len(plan.key), list(raw))
                                      for _, _, raw in named.values()],
                         key_source=plan.key_source)
            self._plan = plan
        before = self._keyed(self._columns, self._before)
        order = _sorted(before)
        if plan.kind in ("update", "delete") and len(before) != rowcount:
            return unavailable(
                f"the statement changed {rowcount} row(s) but {len(before)} matched its "
                "WHERE just before it (another transaction changed rows meanwhile?): "
                "previewed by count only")
        after: dict[str, tuple[list[Any], dict[str, Any], list[Any]]] = {}
        declared = plan.key_source == "declared"
        if plan.kind == "update":
            # Only the rows that will be shown need their new image — unless the key is
            # only declared: then every key is read back, so a second row holding one
            # (not matched by the WHERE) is found, not merged into the diff.
            columns, rows = _select_keys(session, plan,
                                         [before[o][2] for o in
                                          (order if declared else order[:ROW_IMAGE_CAP])])
            after = self._keyed(columns, rows)
        elif plan.kind == "delete" and declared and before:
            # The deleted rows are gone (in this transaction): a row still holding one of
            # their keys is another row the declared key does not tell apart.
            columns, rows = _select_keys(session, plan, [before[o][2] for o in order])
            if rows:
                raise _not_a_key(plan, list(self._keyed(columns, rows[:1]).values())[0][0],
                                 True)
        elif plan.kind in ("insert", "upsert"):
            columns, rows = _select_insert_keys(session, plan)
            after = self._keyed(columns, rows)
            order = _sorted(set(before) | set(after))
        changes: list[dict[str, Any]] = []
        for position, at in enumerate(order):
            old = before.get(at)
            new = after.get(at)
            old_row = None if old is None else old[1]
            new_row = None if new is None else new[1]
            key_values = (old or new)[0]  # type: ignore[index]
            if plan.kind == "delete":
                op, changed = "delete", sorted(old_row or {})
            elif old_row is None and new_row is None:
                continue
            elif old_row is None:
                op, changed = "insert", sorted(new_row or {})
            elif plan.kind == "upsert" and not plan.updates_on_conflict:
                continue  # a conflict the statement ignored: the row is not touched
            elif new_row is None:
                if position < ROW_IMAGE_CAP:
                    return unavailable("a changed row could not be read back by its key: "
                                       "previewed by count only")
                op, changed = "update", []
            else:
                op = "update"
                changed = sorted(c for c in new_row if old_row.get(c) != new_row[c])
            changes.append({"key": dict(zip(plan.key, key_values, strict=True)), "op": op,
                            "before": old_row, "after": new_row, "changed": changed})
        if len(changes) != rowcount:
            return unavailable(
                f"the statement reports {rowcount} row(s) but its images account for "
                f"{len(changes)} (a conflict on another constraint, a trigger, or rows "
                "changed meanwhile): previewed by count only")
        return captured_images(plan, session, changes, before)



def captured_images(plan: _Plan, session: ImageSession, changes: list[dict[str, Any]],
                    before: dict[Any, Any]) -> dict[str, Any]:
    """A statement's captured images: every change counted, the first
    :data:`ROW_IMAGE_CAP` shown, and the CID of all the rows as they were before."""
    shown = changes[:ROW_IMAGE_CAP]
    return {
        "status": "captured",
        "table": plan.table.sql(dialect=session.dialect),
        "key": list(plan.key),
        "key_source": plan.key_source,
        "total": len(changes),
        "shown": len(shown),
        "truncated": len(changes) > len(shown),
        "rows": shown,
        "before_cid": cid([{"key": k, "before": row} for k, row, _ in
                           (before[o] for o in _sorted(before))]),
    }

# -- planning: what to select, from the statement's parse ---------------------------------


def _placeholders(node: exp.Expression | None) -> int:
    return 0 if node is None else sum(1 for _ in node.find_all(exp.Placeholder))


def _unsafe_where(where: exp.Expression) -> str:
    if any(True for _ in where.find_all(exp.Subquery, exp.Select)):
        return "its WHERE has a subquery"
    for func in where.find_all(exp.Func):
        if isinstance(func, exp.Anonymous | exp.Rand):
            return (f"its WHERE calls {func.sql()[:60]!r}, which may give another answer to "
                    "a second query")
    return ""


def _table_name(table: exp.Table) -> tuple[str | None, str]:
    return (table.db or None), table.name


def _bare(table: exp.Table) -> exp.Table:
    bare = table.copy()
    bare.set("alias", None)
    return bare


def _plan(sql: str, params: Sequence[Any], session: ImageSession) -> _Plan | str:
    """What to select around ``sql``, or why its rows cannot be imaged (a reason)."""
    try:
        parsed = sqlglot.parse(sql, read=session.dialect)
    except Exception:  # sqlglot raises several error types on input it cannot read
        return "the statement could not be parsed to derive its row images"
    if len(parsed) != 1 or parsed[0] is None:
        return "the statement could not be parsed to derive its row images"
    node = parsed[0]
    if isinstance(node, exp.Query) and not node.args.get("into"):
        if any(True for _ in node.find_all(*_WRITE_KINDS)):
            return "a query with a data-modifying WITH is previewed by count only"
        return ""  # a query: no rows of its own to image
    if not isinstance(node, _WRITE_KINDS):
        return ("only the rows of INSERT, UPDATE and DELETE are imaged: this statement is "
                "previewed by count only")
    if node.args.get("with") or node.args.get("with_"):
        return "a statement with WITH is previewed by count only"
    total = _placeholders(node)
    if total != len(params) or any(p.this is not None for p in node.find_all(exp.Placeholder)):
        return ("its parameters are not plain positional placeholders the derived queries "
                "can bind in the same order")
    if isinstance(node, exp.Insert):
        return _plan_insert(node, params, session)
    if isinstance(node, exp.Merge):
        from marque.target.merge_images import plan_merge  # it builds on this module

        return plan_merge(node, params, session)
    table = node.this
    if not isinstance(table, exp.Table):
        return "its target is not a plain table"
    if node.args.get("from") or node.args.get("from_") or node.args.get("using") \
            or node.args.get("joins") or node.args.get("order") or node.args.get("limit"):
        return "a statement over several tables (FROM/USING), or with ORDER BY/LIMIT, is " \
               "previewed by count only"
    where = node.args.get("where")
    if where is not None:
        unsafe = _unsafe_where(where)
        if unsafe:
            return unsafe + ": previewed by count only"
    keyed = _row_key(session, table)
    if isinstance(keyed, str):
        return keyed
    key, source = keyed
    kind = "update" if isinstance(node, exp.Update) else "delete"
    if kind == "update":
        assigned = {e.this.name.lower() for e in node.expressions if isinstance(e, exp.EQ)}
        if assigned & {k.lower() for k in key}:
            return "the statement changes the primary key itself: previewed by count only"
    # Placeholders come in text order: SET (UPDATE), then WHERE, then RETURNING.
    skip = sum(_placeholders(e) for e in node.expressions) if kind == "update" else 0
    count = _placeholders(where)
    select = exp.select("*").from_(table.copy())
    if where is not None:
        select = select.where(where.this.copy())
    return _Plan(kind, _bare(table), key, select.sql(dialect=session.dialect),
                 list(params[skip:skip + count]), key_source=source)


def _row_key(session: ImageSession, table: exp.Table) -> tuple[list[str], str] | str:
    """The columns naming ``table``'s rows and where they came from, or why there are none."""
    schema, name = _table_name(table)
    key, source = session.row_key(_bare(table).sql(dialect=session.dialect), schema, name)
    if not key:
        # Worded as before declared keys existed: a preview's bytes stay the same.
        return (f"table {name} has no primary key (nor a unique index over NOT NULL "
                "columns): previewed by count only")
    return key, source


def _returned_keys(node: exp.Insert, table: exp.Table, key: list[str],
                   alternative: str, source: str) -> _Plan | None:
    """A plain INSERT whose own RETURNING gives every key column (or ``*``): the new
    rows are read back by the keys it returns."""
    returning = node.args.get("returning")
    if returning is None or node.args.get("conflict") is not None or alternative:
        return None
    named: set[str] = set()
    for item in returning.expressions:
        if isinstance(item, exp.Star):
            return _Plan("returned", table, key, None, [], key_source=source)
        if isinstance(item, exp.Column) and not item.table:
            named.add(item.name.lower())
    if all(k.lower() in named for k in key):
        return _Plan("returned", table, key, None, [], key_source=source)
    return None


def _literal_key(value: exp.Expression) -> bool:
    if isinstance(value, exp.Neg):
        value = value.this
    if isinstance(value, exp.Cast):
        value = value.this
    return isinstance(value, exp.Literal | exp.Placeholder | exp.Null | exp.Boolean)


def _plan_insert(node: exp.Insert, params: Sequence[Any], session: ImageSession) -> _Plan | str:
    target = node.this
    columns: list[str] | None = None
    if isinstance(target, exp.Schema):
        columns = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table):
        return "its target is not a plain table"
    alternative = (node.args.get("alternative") or "").upper()
    if alternative and alternative != "IGNORE":
        return f"INSERT OR {alternative} is previewed by count only"
    values = node.expression
    bare = _bare(target)
    keyed = _row_key(session, target)
    if isinstance(keyed, str):
        return keyed
    key, source = keyed
    if not isinstance(values, exp.Values):
        return _returned_keys(node, bare, key, alternative, source) or (
            "an INSERT … SELECT makes keys the preview cannot name (unless it returns "
            "them): previewed by count only")
    if columns is None:
        try:
            columns = session.query(
                exp.select("*").from_(bare.copy()).limit(0).sql(dialect=session.dialect), ())[0]
        except ImageUnavailable as exc:
            return str(exc)
    lowered = [c.lower() for c in columns]
    if any(k.lower() not in lowered for k in key):
        return _returned_keys(node, bare, key, alternative, source) or (
            "the database makes the inserted rows' keys (a default or a sequence): "
            "previewed by count only")
    conflict = node.args.get("conflict")
    updates = False
    if conflict is not None:
        action = str(conflict.args.get("action") or "").upper()
        updates = "UPDATE" in action
        targets = [k.this.name.lower() if isinstance(k, exp.Ordered) else k.name.lower()
                   for k in conflict.args.get("conflict_keys") or []]
        if updates and sorted(targets) != sorted(k.lower() for k in key):
            return ("its ON CONFLICT names another constraint than the primary key: previewed "
                    "by count only")
        if conflict.args.get("constraint"):
            return "its ON CONFLICT names a constraint: previewed by count only"
    elif alternative == "IGNORE":
        updates = False
    # Placeholders come in text order; a column list has none, so VALUES' are first.
    position = 0
    keys: list[tuple[list[str], list[Any]]] = []
    key_lower = [k.lower() for k in key]
    for row in values.expressions:
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(columns):
            return "its VALUES rows do not match its columns"
        given: dict[str, tuple[str, list[Any]]] = {}
        for column, item in zip(lowered, items, strict=True):
            n = _placeholders(item)
            if column in key_lower:
                if not _literal_key(item):
                    return ("an inserted key is computed, not given (a function or an "
                            "expression): previewed by count only")
                given[column] = (item.sql(dialect=session.dialect),
                                 list(params[position:position + n]))
            position += n
        keys.append(([given[k][0] for k in key_lower],
                     [v for k in key_lower for v in given[k][1]]))
    return _Plan("upsert" if conflict is not None or alternative else "insert", bare, key,
                 None, [], insert_keys=keys, updates_on_conflict=updates, key_source=source)


def _key_filter(plan: _Plan, session: ImageSession, rows: list[tuple[list[str], list[Any]]],
                extra: str = "") -> tuple[str, list[Any]]:
    quoted = [exp.to_identifier(k, quoted=True).sql(dialect=session.dialect) for k in plan.key]
    clauses = []
    params: list[Any] = []
    for exprs, bound in rows:
        clauses.append("(" + " AND ".join(f"{q} = {e}" for q, e in zip(quoted, exprs,
                                                                         strict=True)) + ")")
        params.extend(bound)
    table = plan.table.sql(dialect=session.dialect)
    what = f"*, {extra}" if extra else "*"
    return f"SELECT {what} FROM {table} WHERE " + " OR ".join(clauses), params


def _select_keys(session: ImageSession, plan: _Plan, keys: list[list[Any]], extra: str = ""
                 ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The rows holding ``keys`` (as the driver gave them), with ``extra`` columns after
    the table's own."""
    if not keys:
        return [], []
    mark = "%s" if session.dialect == "postgres" else "?"
    columns: list[str] = []
    rows: list[tuple[Any, ...]] = []
    # In slices, so no engine's limit on bound parameters is reached.
    for start in range(0, len(keys), 200):
        chunk = [([mark] * len(plan.key), list(k)) for k in keys[start:start + 200]]
        sql, params = _key_filter(plan, session, chunk, extra)
        columns, got = session.query(sql, params)
        rows.extend(got)
    return columns, rows


def _select_insert_keys(session: ImageSession, plan: _Plan
                        ) -> tuple[list[str], list[tuple[Any, ...]]]:
    assert plan.insert_keys is not None
    if not plan.insert_keys:
        return [], []
    sql, params = _key_filter(plan, session, plan.insert_keys)
    return session.query(sql, params)


def start_capture(session: ImageSession, sql: str, params: Sequence[Any]
                  ) -> Capture | dict[str, Any] | None:
    """Before the statement runs: a :class:`Capture` to finish after it, the
    ``row_images`` saying why there will be none, or None for a statement that
    writes no rows (a ``SELECT``, DDL)."""
    try:
        plan = _plan(sql, params, session)
    except ImageUnavailable as exc:
        return unavailable(str(exc), exc.code)
    if plan == "":
        return None
    if isinstance(plan, str):
        return unavailable(plan)
    try:
        declared = session.column_types(plan.table.sql(dialect=session.dialect))
        capture: Capture
        if plan.kind == "merge":
            from marque.target.merge_images import start_merge

            capture = start_merge(session, plan)
        else:
            if plan.before_sql is not None:
                columns, rows = session.query(plan.before_sql, plan.before_params)
            elif plan.kind == "upsert":
                columns, rows = _select_insert_keys(session, plan)
            else:
                columns, rows = [], []
            if plan.kind == "insert" and rows:
                columns, rows = [], []  # the insert will fail on them (and the preview too)
            capture = Capture(plan, columns, rows)
    except ImageUnavailable as exc:
        return unavailable(str(exc), exc.code)
    capture.declared_types = declared
    # Every json, jsonb, bytea and array column holds a typed form, NULL or not: the undo
    # binds and compares it by its type.
    capture.types = {c: t for c, t in declared.items() if typed_kind(t) is not None}
    return capture


def finish_capture(capture: Capture | dict[str, Any] | None, session: ImageSession,
                   rowcount: int,
                   returned: tuple[list[str], list[tuple[Any, ...]]] | None = None,
                   ) -> dict[str, Any] | None:
    """After the statement ran: its ``row_images`` (see :func:`start_capture`);
    ``returned`` is what the statement's own ``RETURNING`` gave (columns, every row)."""
    if not isinstance(capture, Capture):
        return capture
    try:
        images = capture.finish(session, rowcount, returned)
    except ImageUnavailable as exc:
        return unavailable(str(exc), exc.code)
    if images.get("status") == "captured" and capture.types:
        # Only where a typed form is held: plain tables' images keep their 0.1 bytes.
        images["types"] = dict(sorted(capture.types.items()))
    return images


def writes_rows(sql: str, dialect: str) -> bool:
    """Whether ``sql`` may write rows (anything the parser cannot read as one statement
    that is not a write counts as one)."""
    try:
        parsed = sqlglot.parse(sql, read=dialect)
    except Exception:  # as in _plan: unreadable means "may write"
        return True
    return not (len(parsed) == 1 and isinstance(parsed[0], exp.Query)
                and not parsed[0].args.get("into")
                and not any(True for _ in parsed[0].find_all(*_WRITE_KINDS)))


def explain_images(sql: str, dialect: str) -> dict[str, Any] | None:
    """A statement's ``row_images`` under an ``explain`` preview: nothing ran, so none."""
    if not writes_rows(sql, dialect):
        return None
    return unavailable("an explain preview executes nothing, so no row was read")


# -- the diff over a whole preview ---------------------------------------------------------


def diff_body(statements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The preimage of a preview's ``diff_cid``: ``{version, statements: [row_images]}``,
    one entry per statement in order (``null`` for a statement that writes no rows);
    ``version`` is :data:`ROW_DIFF_VERSION` when an image holds typed values (``types``),
    else :data:`ROW_DIFF_VERSION_PLAIN` — the bytes such a diff always had."""
    images = [_preimage(s.get("row_images")) for s in statements]
    typed = any(isinstance(i, dict) and "types" in i for i in images)
    return {"version": ROW_DIFF_VERSION if typed else ROW_DIFF_VERSION_PLAIN,
            "statements": images}


def _preimage(images: Any) -> Any:
    """A statement's row images as the diff's preimage holds them: ``key_source`` only when
    the key is declared — then the rows are named by the operator's word, not the schema's,
    which an approver is owed; a schema key's images keep the bytes they had before
    declared keys existed."""
    if isinstance(images, dict) and "key_source" in images \
            and images["key_source"] != "declared":
        return {k: v for k, v in images.items() if k != "key_source"}
    return images


def diff_cid(statements: Sequence[dict[str, Any]]) -> str:
    """The content id (RFC 8785, :func:`marque.cid.cid`) of :func:`diff_body`."""
    return cid(diff_body(statements))


def before_state(statements: Sequence[dict[str, Any]]) -> list[Any]:
    """What revalidation compares of two previews of one change: per statement, whether
    its rows were imaged, how many and the CID of every before-image."""
    out: list[Any] = []
    for statement in statements:
        images = statement.get("row_images")
        if not isinstance(images, dict) or images.get("status") != "captured":
            out.append(None if images is None else images.get("status"))
        else:
            out.append([images.get("total"), images.get("before_cid")])
    return out
