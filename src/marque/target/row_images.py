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

A captured statement stores up to
:data:`~marque.target.image_capture.ROW_IMAGE_CAP` rows in key order
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

from collections.abc import Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from marque.cid import cid
from marque.target.image_capture import (
    Capture,
    ImageSession,
    ImageUnavailable,
    Plan,
    placeholders,
    row_key,
    select_insert_keys,
    unaliased,
    unavailable,
    unsafe_where,
)
from marque.target.image_values import typed_kind
from marque.target.merge_images import plan_merge, start_merge

__all__ = ["ROW_DIFF_VERSION", "ROW_DIFF_VERSION_PLAIN", "start_capture", "finish_capture",
           "explain_images", "writes_rows", "diff_body", "diff_cid", "before_state"]

#: The version of the diff's content-id preimage (:func:`diff_body`): 0.2 holds typed
#: values (an image with ``types``); a diff with none keeps 0.1, its bytes unchanged.
ROW_DIFF_VERSION = "marque-row-diff/0.2"
#: The version of a diff none of whose images holds a typed value.
ROW_DIFF_VERSION_PLAIN = "marque-row-diff/0.1"

_WRITE_KINDS = (exp.Update, exp.Delete, exp.Insert, exp.Merge)


# -- planning: what to select, from the statement's parse ---------------------------------


def _plan(sql: str, params: Sequence[Any], session: ImageSession) -> Plan | str:
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
    total = placeholders(node)
    if total != len(params) or any(p.this is not None for p in node.find_all(exp.Placeholder)):
        return ("its parameters are not plain positional placeholders the derived queries "
                "can bind in the same order")
    if isinstance(node, exp.Insert):
        return _plan_insert(node, params, session)
    if isinstance(node, exp.Merge):
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
        unsafe = unsafe_where(where)
        if unsafe:
            return unsafe + ": previewed by count only"
    keyed = row_key(session, table)
    if isinstance(keyed, str):
        return keyed
    key, source = keyed
    kind = "update" if isinstance(node, exp.Update) else "delete"
    if kind == "update":
        assigned = {e.this.name.lower() for e in node.expressions if isinstance(e, exp.EQ)}
        if assigned & {k.lower() for k in key}:
            return "the statement changes the primary key itself: previewed by count only"
    # Placeholders come in text order: SET (UPDATE), then WHERE, then RETURNING.
    skip = sum(placeholders(e) for e in node.expressions) if kind == "update" else 0
    count = placeholders(where)
    select = exp.select("*").from_(table.copy())
    if where is not None:
        select = select.where(where.this.copy())
    return Plan(kind, unaliased(table), key, select.sql(dialect=session.dialect),
                 list(params[skip:skip + count]), key_source=source)


def _returned_keys(node: exp.Insert, table: exp.Table, key: list[str],
                   alternative: str, source: str) -> Plan | None:
    """A plain INSERT whose own RETURNING gives every key column (or ``*``): the new
    rows are read back by the keys it returns."""
    returning = node.args.get("returning")
    if returning is None or node.args.get("conflict") is not None or alternative:
        return None
    named: set[str] = set()
    for item in returning.expressions:
        if isinstance(item, exp.Star):
            return Plan("returned", table, key, None, [], key_source=source)
        if isinstance(item, exp.Column) and not item.table:
            named.add(item.name.lower())
    if all(k.lower() in named for k in key):
        return Plan("returned", table, key, None, [], key_source=source)
    return None


def _literal_key(value: exp.Expression) -> bool:
    if isinstance(value, exp.Neg):
        value = value.this
    if isinstance(value, exp.Cast):
        value = value.this
    return isinstance(value, exp.Literal | exp.Placeholder | exp.Null | exp.Boolean)


def _plan_insert(node: exp.Insert, params: Sequence[Any], session: ImageSession) -> Plan | str:
    """What to select around an ``INSERT`` (or upsert), or why its rows cannot be imaged."""
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
    bare = unaliased(target)
    keyed = row_key(session, target)
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
    if any(k.lower() not in [c.lower() for c in columns] for k in key):
        return _returned_keys(node, bare, key, alternative, source) or (
            "the database makes the inserted rows' keys (a default or a sequence): "
            "previewed by count only")
    conflict = node.args.get("conflict")
    updates = _updates_on_conflict(conflict, key)
    if isinstance(updates, str):
        return updates
    keys = _inserted_keys(values, columns, key, params, session)
    if isinstance(keys, str):
        return keys
    return Plan("upsert" if conflict is not None or alternative else "insert", bare, key,
                None, [], insert_keys=keys, updates_on_conflict=updates, key_source=source)


def _updates_on_conflict(conflict: exp.Expression | None, key: list[str]) -> bool | str:
    """Whether an upsert updates the row it conflicts with (DO UPDATE) rather than leaving
    it (DO NOTHING, OR IGNORE, no ON CONFLICT), or why its rows cannot be imaged."""
    if conflict is None:
        return False
    updates = "UPDATE" in str(conflict.args.get("action") or "").upper()
    targets = [k.this.name.lower() if isinstance(k, exp.Ordered) else k.name.lower()
               for k in conflict.args.get("conflict_keys") or []]
    if updates and sorted(targets) != sorted(k.lower() for k in key):
        return ("its ON CONFLICT names another constraint than the primary key: previewed "
                "by count only")
    if conflict.args.get("constraint"):
        return "its ON CONFLICT names a constraint: previewed by count only"
    return updates


def _inserted_keys(values: exp.Values, columns: list[str], key: list[str],
                   params: Sequence[Any], session: ImageSession
                   ) -> list[tuple[list[str], list[Any]]] | str:
    """Each ``VALUES`` row's key as SQL expressions and their parameters, or why a key is
    not given there."""
    # Placeholders come in text order; a column list has none, so VALUES' are first.
    lowered = [c.lower() for c in columns]
    position = 0
    keys: list[tuple[list[str], list[Any]]] = []
    key_lower = [k.lower() for k in key]
    for row in values.expressions:
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(columns):
            return "its VALUES rows do not match its columns"
        given: dict[str, tuple[str, list[Any]]] = {}
        for column, item in zip(lowered, items, strict=True):
            n = placeholders(item)
            if column in key_lower:
                if not _literal_key(item):
                    return ("an inserted key is computed, not given (a function or an "
                            "expression): previewed by count only")
                given[column] = (item.sql(dialect=session.dialect),
                                 list(params[position:position + n]))
            position += n
        keys.append(([given[k][0] for k in key_lower],
                     [v for k in key_lower for v in given[k][1]]))
    return keys


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
            capture = start_merge(session, plan)
        else:
            if plan.before_sql is not None:
                columns, rows = session.query(plan.before_sql, plan.before_params)
            elif plan.kind == "upsert":
                columns, rows = select_insert_keys(session, plan)
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
