"""Row images of a ``MERGE`` on PostgreSQL 15+, which has no ``RETURNING`` for it.

A ``MERGE INTO t USING s ON c WHEN …`` may update, delete and insert rows in one
statement, and which of its matched rows a ``WHEN MATCHED AND …`` clause really
touches is the server's decision. So, inside the preview's rolled-back
transaction and around the statement exactly as approved:

* before it, ``SELECT t.*, <tuple id> FROM t WHERE EXISTS (SELECT 1 FROM s WHERE c)``:
  every target row the ``ON`` matches, with its tuple id (``tableoid`` and
  ``ctid``), binding the placeholders of ``USING`` and ``ON``; and, if this
  transaction already wrote rows (an earlier statement of the change), the tuple
  ids of those rows of ``t``;
* after it, the matched rows read again by their keys: a row gone was deleted, a
  row under a new tuple id was updated (PostgreSQL writes a new tuple version for
  every update, even one that changes no value), a row under its old tuple id was
  not touched; and, when the ``MERGE`` can insert, the rows of ``t`` this
  transaction wrote (``xmin``) that are neither a matched key nor a tuple written
  before it: the inserted rows.

As for every statement, the count the server reports must equal the rows the
images account for, or the images are dropped as unavailable. Count only, with
the reason: a ``USING`` or ``ON`` that calls a function the parser does not
know (a second evaluation may match other rows), ``WHEN NOT MATCHED BY
SOURCE`` (rows the ``ON`` does not match), an ``UPDATE`` of the key itself, a
table without a row key. Under ``READ COMMITTED`` another transaction could
commit a matching row in the instant between the before-read and the
``MERGE``; that row would be shown as inserted, not updated (docs/harbour.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlglot import exp

from marque.target.image_capture import (
    Capture,
    ImageSession,
    Plan,
    captured_images,
    placeholders,
    row_key,
    select_keys,
    sorted_orders,
    unaliased,
    unavailable,
    unsafe_where,
)

__all__ = ["MergeCapture", "plan_merge", "start_merge"]

#: The derived queries' extra column: a row version's tuple id, never part of an image.
_TID = '"marque$tid"'
#: PostgreSQL's 32-bit xid (what ``xmin`` holds) of a 64-bit ``xid8``.
_XID_MASK = 0xFFFF_FFFF


def _tid(ref: str) -> str:
    return f"{ref}.tableoid::oid::text || ':' || {ref}.ctid::text AS {_TID}"


def plan_merge(node: exp.Merge, params: Sequence[Any], session: ImageSession) -> Plan | str:
    """What to select around a ``MERGE``, or why its rows cannot be imaged (a reason)."""
    if session.dialect != "postgres":
        return "MERGE is previewed by count only"
    target = node.this
    using = node.args.get("using")
    on = node.args.get("on")
    whens = node.args.get("whens")
    if not isinstance(target, exp.Table) or using is None or on is None or whens is None:
        return "this MERGE could not be read to derive its row images: previewed by count only"
    if node.args.get("returning") is not None:
        return "a MERGE with RETURNING is previewed by count only"
    unsafe = unsafe_where(on)
    if unsafe:
        return unsafe.replace("its WHERE", "its ON") + ": previewed by count only"
    for func in using.find_all(exp.Func):
        if isinstance(func, exp.Anonymous | exp.Rand):
            return (f"its USING calls {func.sql()[:60]!r}, which may give other rows to a "
                    "second query: previewed by count only")
    keyed = row_key(session, target)
    if isinstance(keyed, str):
        return keyed
    key, source = keyed
    inserts = deletes = False
    for when in whens.expressions:
        if when.args.get("source"):
            return "a MERGE with WHEN NOT MATCHED BY SOURCE is previewed by count only"
        then = when.args.get("then")
        if isinstance(then, exp.Insert):
            inserts = True
        elif isinstance(then, exp.Update):
            # Columns a tuple assignment, SET (a, b) = (…), names too.
            assigned = {c.name.lower() for e in then.expressions if isinstance(e, exp.EQ)
                        for c in (e.this.expressions if isinstance(e.this, exp.Tuple)
                                  else [e.this])}
            if assigned & {k.lower() for k in key}:
                return "the MERGE changes the row key itself: previewed by count only"
        elif isinstance(then, exp.Var) and then.name.upper() == "DELETE":
            deletes = True
    ref = exp.to_identifier(target.alias).sql(dialect="postgres") if target.alias else \
        unaliased(target).sql(dialect="postgres")
    # Placeholders come in text order: USING, then ON, then the WHEN clauses.
    count = placeholders(using) + placeholders(on)
    before = (f"SELECT {ref}.*, {_tid(ref)} FROM {target.sql(dialect='postgres')} WHERE "
              f"EXISTS (SELECT 1 FROM {using.sql(dialect='postgres')} "
              f"WHERE {on.sql(dialect='postgres')})")
    return Plan("merge", unaliased(target), key, before, list(params[:count]),
                 updates_on_conflict=inserts, merge_deletes=deletes, key_source=source)


def _written(session: ImageSession, plan: Plan) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The rows of the plan's table this transaction wrote so far (none without an xid)."""
    _, rows = session.query("SELECT pg_current_xact_id_if_assigned()::text", ())
    if not rows or rows[0][0] is None:
        return [], []
    table = plan.table.sql(dialect="postgres")
    return session.query(f"SELECT *, {_tid(table)} FROM {table} WHERE xmin = %s::xid",
                         (str(int(rows[0][0]) & _XID_MASK),))


def _split(columns: list[str], rows: list[tuple[Any, ...]]
           ) -> tuple[list[str], list[tuple[Any, ...]], list[str]]:
    """Rows without their tuple id column, and the tuple ids."""
    if not columns:
        return [], [], []
    return columns[:-1], [r[:-1] for r in rows], [str(r[-1]) for r in rows]


def start_merge(session: ImageSession, plan: Plan) -> MergeCapture:
    """Before the ``MERGE`` runs: its matched rows and the tuples already written."""
    assert plan.before_sql is not None
    columns, rows, tids = _split(*session.query(plan.before_sql, plan.before_params))
    written_before: set[str] = set()
    if plan.updates_on_conflict:  # it may insert: the rows written before it are set aside
        written_before = set(_split(*_written(session, plan))[2])
    return MergeCapture(plan, columns, rows, tids, written_before)


class MergeCapture(Capture):
    """The row images of one ``MERGE`` (:func:`start_merge`)."""

    def __init__(self, plan: Plan, columns: list[str], before: list[tuple[Any, ...]],
                 tids: list[str], written_before: set[str]) -> None:
        super().__init__(plan, columns, before)
        self._tids = tids
        self._written_before = written_before

    def finish(self, session: ImageSession, rowcount: int,
               returned: tuple[list[str], list[tuple[Any, ...]]] | None = None
               ) -> dict[str, Any]:
        """Read the matched rows again and the inserted ones; build ``row_images``."""
        plan = self._plan
        before = self._keyed(self._columns, self._before)
        tid_of = dict(zip(before, self._tids, strict=True))
        columns, rows, tids = _split(*select_keys(session, plan,
                                                   [v[2] for v in before.values()],
                                                   extra=_tid(plan.table.sql(
                                                       dialect="postgres"))))
        after = self._keyed(columns, rows)
        after_tid = dict(zip(after, tids, strict=True))
        changes: dict[str, dict[str, Any]] = {}
        for at, (key, old, _) in before.items():
            new = after.get(at)
            if new is None and not plan.merge_deletes:
                # Gone, though the MERGE deletes nothing: its key moved, somehow unseen.
                return unavailable("a matched row could not be read back by its key, and the "
                                   "MERGE deletes no row: previewed by count only")
            if new is None:
                changes[at] = {"key": key, "op": "delete", "before": old, "after": None,
                               "changed": sorted(old)}
            elif after_tid[at] != tid_of[at]:
                changes[at] = {"key": key, "op": "update", "before": old, "after": new[1],
                               "changed": sorted(c for c in new[1] if old.get(c) != new[1][c])}
        if plan.updates_on_conflict:
            columns, rows, tids = _split(*_written(session, plan))
            fresh = [(row, tid) for row, tid in zip(rows, tids, strict=True)
                     if tid not in self._written_before]
            inserted = {at: v for at, v in self._keyed(columns, [r for r, _ in fresh]).items()
                        if at not in before}
            if inserted and plan.key_source == "declared":
                # A declared key may be held by an untouched row too: read them all back.
                self._keyed(*select_keys(session, plan, [v[2] for v in inserted.values()]))
            for at, (key, row, _) in inserted.items():
                changes[at] = {"key": key, "op": "insert", "before": None, "after": row,
                               "changed": sorted(row)}
        if len(changes) != rowcount:
            return unavailable(
                f"the MERGE reports {rowcount} row(s) but its images account for "
                f"{len(changes)} (a trigger, another constraint, or rows changed meanwhile): "
                "previewed by count only")
        ordered = [changes[o] for o in sorted_orders(changes)]
        for change in ordered:
            change["key"] = dict(zip(plan.key, change["key"], strict=True))
        return captured_images(plan, session, ordered, before)

