"""One statement's row images, taken around it: the plan, the capture, the keyed reads.

:mod:`marque.target.row_images` says what is imaged and why (and plans the ``INSERT``,
``UPDATE`` and ``DELETE``); :mod:`marque.target.merge_images` plans and captures a
``MERGE``. Both stand on this module: a :class:`Plan` of what to select around the
statement, a :class:`Capture` that reads the rows before it and after it, and the
queries that read rows back by their keys.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlglot import exp

from marque.cid import cid
from marque.target.image_values import BYTES_TAG, UNENCODED_TAG, encode

__all__ = ["ROW_IMAGE_CAP", "KEY_SOURCES", "ImageSession", "ImageUnavailable", "Plan",
           "Capture", "captured_images", "unavailable", "not_a_key", "sorted_orders",
           "placeholders", "unsafe_where", "unaliased", "row_key", "select_keys",
           "select_insert_keys"]

#: Rows stored in full per statement; past it the first ones in key order, and the count.
ROW_IMAGE_CAP = 100

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


def sorted_orders(orders: Any) -> list[str]:
    """Canonical key texts in the keys' natural order: numbers by value, before text."""
    def rank(value: Any) -> tuple[int, Any]:
        if value is None:
            return (0, 0)
        if isinstance(value, bool | int | float):
            return (1, value)
        return (2, str(value))
    return sorted(orders, key=lambda o: [rank(v) for v in json.loads(o)])


@dataclass
class Plan:
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


def not_a_key(plan: Plan, key: list[Any], repeated: bool) -> ImageUnavailable:
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


#: A row by the canonical text of its key: (key as JSON, row as JSON, key as the driver
#: gave it).
_Keyed = tuple[list[Any], dict[str, Any], list[Any]]


class Capture:
    """The row images of one statement, taken around it (:func:`start_capture`)."""

    def __init__(self, plan: Plan, columns: list[str], before: list[tuple[Any, ...]]):
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
               ) -> dict[str, _Keyed]:
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
        out: dict[str, _Keyed] = {}
        for row in rows:
            key = [self._encode(columns[i], row[i], record) for i in index]
            order = _key_order(key)
            declared = self._plan.key_source == "declared"
            if order in out or (declared and None in key):
                # A declared key can do this (and a SQLite primary key, which admits NULLs);
                # merged into one row, two rows would make a wrong diff.
                raise not_a_key(self._plan, key, order in out)
            out[order] = (key, {c: self._encode(c, v, record)
                                for c, v in zip(columns, row, strict=True)},
                          [row[i] for i in index])
        return out

    def finish(self, session: ImageSession, rowcount: int,
               returned: tuple[list[str], list[tuple[Any, ...]]] | None = None
               ) -> dict[str, Any]:
        """Read the after-images and build the statement's ``row_images``."""
        if self._plan.kind == "returned":
            self._plan = self._plan_from_returning(session, rowcount, returned)
        plan = self._plan
        before = self._keyed(self._columns, self._before)
        if plan.kind in ("update", "delete") and len(before) != rowcount:
            return unavailable(
                f"the statement changed {rowcount} row(s) but {len(before)} matched its "
                "WHERE just before it (another transaction changed rows meanwhile?): "
                "previewed by count only")
        after, order = self._after_images(session, before)
        changes = self._changes(before, after, order)
        if isinstance(changes, dict):
            return changes
        if len(changes) != rowcount:
            return unavailable(
                f"the statement reports {rowcount} row(s) but its images account for "
                f"{len(changes)} (a conflict on another constraint, a trigger, or rows "
                "changed meanwhile): previewed by count only")
        return captured_images(plan, session, changes, before)

    def _plan_from_returning(self, session: ImageSession, rowcount: int,
                             returned: tuple[list[str], list[tuple[Any, ...]]] | None) -> Plan:
        """An insert plan keyed by what the statement's own RETURNING named: keys the
        database made."""
        plan = self._plan
        if returned is None or len(returned[1]) != rowcount:
            raise ImageUnavailable("the statement's RETURNING did not name every "
                                   "inserted row: previewed by count only")
        mark = "%s" if session.dialect == "postgres" else "?"
        named = self._keyed(*returned, record=False)
        return Plan("insert", plan.table, plan.key, None, [],
                    insert_keys=[([mark] * len(plan.key), list(raw))
                                 for _, _, raw in named.values()],
                    key_source=plan.key_source)

    def _after_images(self, session: ImageSession, before: dict[str, _Keyed]
                      ) -> tuple[dict[str, _Keyed], list[str]]:
        """The rows as the statement left them, by key, and the keys' order."""
        plan = self._plan
        order = sorted_orders(before)
        after: dict[str, _Keyed] = {}
        declared = plan.key_source == "declared"
        if plan.kind == "update":
            # Only the rows that will be shown need their new image — unless the key is
            # only declared: then every key is read back, so a second row holding one
            # (not matched by the WHERE) is found, not merged into the diff.
            columns, rows = select_keys(session, plan,
                                        [before[o][2] for o in
                                         (order if declared else order[:ROW_IMAGE_CAP])])
            after = self._keyed(columns, rows)
        elif plan.kind == "delete" and declared and before:
            # The deleted rows are gone (in this transaction): a row still holding one of
            # their keys is another row the declared key does not tell apart.
            columns, rows = select_keys(session, plan, [before[o][2] for o in order])
            if rows:
                raise not_a_key(plan, list(self._keyed(columns, rows[:1]).values())[0][0],
                                True)
        elif plan.kind in ("insert", "upsert"):
            columns, rows = select_insert_keys(session, plan)
            after = self._keyed(columns, rows)
            order = sorted_orders(set(before) | set(after))
        return after, order

    def _changes(self, before: dict[str, _Keyed], after: dict[str, _Keyed], order: list[str]
                 ) -> list[dict[str, Any]] | dict[str, Any]:
        """Each changed row in key order, or the ``row_images`` saying why there are none."""
        plan = self._plan
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
        return changes


def captured_images(plan: Plan, session: ImageSession, changes: list[dict[str, Any]],
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
                           (before[o] for o in sorted_orders(before))]),
    }


def placeholders(node: exp.Expression | None) -> int:
    return 0 if node is None else sum(1 for _ in node.find_all(exp.Placeholder))


def unsafe_where(where: exp.Expression) -> str:
    if any(True for _ in where.find_all(exp.Subquery, exp.Select)):
        return "its WHERE has a subquery"
    for func in where.find_all(exp.Func):
        if isinstance(func, exp.Anonymous | exp.Rand):
            return (f"its WHERE calls {func.sql()[:60]!r}, which may give another answer to "
                    "a second query")
    return ""


def _table_name(table: exp.Table) -> tuple[str | None, str]:
    return (table.db or None), table.name


def unaliased(table: exp.Table) -> exp.Table:
    copy = table.copy()
    copy.set("alias", None)
    return copy


def row_key(session: ImageSession, table: exp.Table) -> tuple[list[str], str] | str:
    """The columns naming ``table``'s rows and where they came from, or why there are none."""
    schema, name = _table_name(table)
    key, source = session.row_key(unaliased(table).sql(dialect=session.dialect), schema, name)
    if not key:
        # Worded as before declared keys existed: a preview's bytes stay the same.
        return (f"table {name} has no primary key (nor a unique index over NOT NULL "
                "columns): previewed by count only")
    return key, source


def _key_filter(plan: Plan, session: ImageSession, rows: list[tuple[list[str], list[Any]]],
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


def select_keys(session: ImageSession, plan: Plan, keys: list[list[Any]], extra: str = ""
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


def select_insert_keys(session: ImageSession, plan: Plan
                        ) -> tuple[list[str], list[tuple[Any, ...]]]:
    assert plan.insert_keys is not None
    if not plan.insert_keys:
        return [], []
    sql, params = _key_filter(plan, session, plan.insert_keys)
    return session.query(sql, params)
