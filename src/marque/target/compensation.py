"""The undo of an executed change, derived from its preview's sealed row images.

A rolled-back preview imaged every row a statement changed, before and after
(:mod:`marque.target.row_images`). From those images this module writes new
SQL — never a change of the approved text — that puts each row back:

* an **updated** row gets its changed columns' before-values again;
* a **deleted** row is inserted again, with every column it had;
* an **inserted** row is deleted.

Each row is one statement, **fenced on the after-image**: it touches the row
only while the row still holds exactly what the original execution wrote,
every column the image holds compared — the key's by ``=`` (it is NOT NULL, and
its index finds the row), every other NULL-safely (``IS`` on SQLite, ``IS NOT
DISTINCT FROM`` on PostgreSQL); a row to insert again is fenced on its key
still being free. Each statement carries ``expect_rows = 1``, so a row changed
since (by anyone) makes its statement touch no row, and the Pilot rolls the
whole attempt back as ``undo_conflict`` (:class:`marque.errors.UndoConflict`):
an undo never overwrites a later change, and is never half-applied.

The statements are built with sqlglot from quoted identifiers and bound
parameters — JSON scalars, as every statement's are: the image values by the
image's ``types``, bytes as hex the statement decodes (``decode(…, 'hex')``,
SQLite's ``unhex``), a jsonb as its JSON text, an array as its literal, each
typed parameter cast to its column's type on PostgreSQL, and a ``json`` value, which
has no equality operator, compared by its exact text); no value is ever pasted
into SQL text. A value the image could not carry (``{"$unencoded": …}``) makes
its statement's undo unavailable, never a guessed restore. The
statements undo the original's in reverse order, so a row two statements
changed is walked back through both.

What cannot be undone is said, not guessed (:class:`marque.errors.UndoUnavailable`):
a statement previewed by count only (its reason is quoted), images past the
cap, an explain preview, no preview at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from marque.change import Statement
from marque.errors import UndoUnavailable
from marque.target.image_values import bind_text, is_bytes, typed_kind, unencoded_reason

__all__ = ["UndoRow", "Compensation", "compensate"]

#: What each undo statement does to its row, by what the original did to it.
_UNDO_OF = {"update": "restore", "delete": "reinsert", "insert": "remove"}


@dataclass(frozen=True)
class UndoRow:
    """One row the undo puts back: its original statement, table, key and what happens."""

    statement: int  # the original's statement index
    table: str
    key: dict[str, Any]
    op: str  # restore | reinsert | remove
    #: The values the row gets back (restore: the changed columns; reinsert: every one).
    restores: dict[str, Any] | None
    #: The after-image the row must still hold (remove, restore); None for a reinsert.
    fenced_on: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The row as a request object shows it."""
        return {"statement": self.statement, "table": self.table, "key": dict(self.key),
                "op": self.op, "restores": self.restores, "fenced_on": self.fenced_on}


@dataclass(frozen=True)
class Compensation:
    """The undo's statements and, position for position, the row each one puts back."""

    statements: tuple[Statement, ...]
    rows: tuple[UndoRow, ...]


def _refuse(message: str, **detail: Any) -> UndoUnavailable:
    return UndoUnavailable(message, detail=detail)


def _table(text: str, dialect: str) -> exp.Table:
    try:
        parsed = exp.to_table(text, dialect=dialect)
    except Exception as exc:  # sqlglot raises several error types on text it cannot read
        raise _refuse(f"the imaged table name {text[:80]!r} could not be read back",
                      table=text[:80]) from exc
    parts = [p for p in (parsed.catalog, parsed.db) if p]
    return exp.table_(parsed.name, db=parts[-1] if parts else None,
                      catalog=parts[0] if len(parts) == 2 else None, quoted=True)


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


class _Binder:
    """Image values as one statement's undo binds them: decoded by their column's type
    (``types``), each typed parameter cast to it on PostgreSQL (see
    :mod:`marque.target.image_values`)."""

    def __init__(self, types: dict[str, str], dialect: str, index: int) -> None:
        self.types = types
        self.dialect = dialect
        self.index = index

    def param(self, column: str, value: Any) -> exp.Expression:
        """The placeholder ``value`` of ``column`` is bound to: bytes decoded from their
        hex, a PostgreSQL json, jsonb or array cast to the column's type."""
        mark = exp.Placeholder()
        if is_bytes(value) or (self.dialect == "postgres"
                               and typed_kind(self.types.get(column)) == "bytea"):
            return exp.Anonymous(this="unhex", expressions=[mark]) if self.dialect == "sqlite" \
                else exp.Anonymous(this="decode", expressions=[mark, exp.Literal.string("hex")])
        type_name = self.types.get(column)
        if self.dialect != "postgres" or typed_kind(type_name) is None:
            return mark
        try:
            to = exp.DataType.build(str(type_name), dialect="postgres", udt=True)
        except Exception as exc:  # sqlglot raises several error types on text it cannot read
            raise _refuse(f"statement {self.index}'s column {column} has the type "
                          f"{str(type_name)[:80]!r}, which the undo cannot write a cast to",
                          statement=self.index, column=column) from exc
        return exp.Cast(this=mark, to=to)

    def value(self, column: str, value: Any) -> Any:
        """``value`` as it is bound (UndoUnavailable if the image does not carry it)."""
        why = unencoded_reason(column, value)
        if why is None:
            try:
                return bind_text(value, self.types.get(column))
            except ValueError as exc:
                why = f"column {column}'s image value cannot be read back ({exc})"
        raise _refuse(f"statement {self.index}'s rows cannot be restored: {why}",
                      statement=self.index, column=column, reason=why)

    def equals(self, column: str, value: Any, key: bool) -> exp.Expression:
        """``column`` compared with its parameter: the key's by ``=``, any other NULL-safely;
        a ``json`` value by its text (json has no equality operator; its text is exact)."""
        if self.dialect == "postgres" and typed_kind(self.types.get(column)) == "json":
            return exp.NullSafeEQ(this=exp.Cast(this=_column(column),
                                                to=exp.DataType.build("text")),
                                  expression=exp.Placeholder())
        kind = exp.EQ if key else exp.NullSafeEQ
        return kind(this=_column(column), expression=self.param(column, value))


def _fence(values: dict[str, Any], key: Sequence[str], bind: _Binder
           ) -> tuple[Any, list[Any]]:
    """``k = ? AND … AND col IS ? AND …`` over every column of ``values``: the key's
    columns (NOT NULL by definition, and indexed) by ``=``, every other NULL-safely;
    each part sorted by name, so the text is stable."""
    conditions: list[exp.Expression] = []
    params: list[Any] = []
    for name in sorted(k for k in values if k in key):
        conditions.append(bind.equals(name, values[name], True))
        params.append(bind.value(name, values[name]))
    for name in sorted(k for k in values if k not in key):
        conditions.append(bind.equals(name, values[name], False))
        params.append(bind.value(name, values[name]))
    return exp.and_(*conditions), params


def _restore(table: exp.Table, key: dict[str, Any], row: dict[str, Any],
             bind: _Binder) -> tuple[str, list[Any]]:
    before, after = row["before"], row["after"]
    changed = [c for c in row.get("changed") or [] if c in before]
    sets = [exp.EQ(this=_column(c), expression=bind.param(c, before[c])) for c in changed]
    fence, fence_params = _fence(after, list(key), bind)
    node = exp.Update(this=table.copy(), expressions=sets, where=exp.Where(this=fence))
    return node.sql(dialect=bind.dialect), [bind.value(c, before[c]) for c in changed] \
        + fence_params


def _reinsert(table: exp.Table, key: dict[str, Any], row: dict[str, Any],
              bind: _Binder) -> tuple[str, list[Any]]:
    before = row["before"]
    columns = sorted(before)
    taken, key_params = _fence(key, list(key), bind)
    exists = exp.Exists(this=exp.select(exp.Literal.number(1)).from_(table.copy())
                        .where(taken))
    select = exp.select(*[bind.param(c, before[c]) for c in columns]).where(exp.not_(exists))
    node = exp.Insert(this=exp.Schema(this=table.copy(),
                                      expressions=[exp.to_identifier(c, quoted=True)
                                                   for c in columns]),
                      expression=select,
                      returning=exp.Returning(expressions=[_column(k) for k in key]))
    return node.sql(dialect=bind.dialect), [bind.value(c, before[c]) for c in columns] \
        + key_params


def _remove(table: exp.Table, key: dict[str, Any], row: dict[str, Any],
            bind: _Binder) -> tuple[str, list[Any]]:
    fence, params = _fence(row["after"], list(key), bind)
    node = exp.Delete(this=table.copy(), where=exp.Where(this=fence))
    return node.sql(dialect=bind.dialect), params


def _usable(index: int, images: Any) -> dict[str, Any] | None:
    """A statement's images, checked whole enough to undo (None: it wrote no rows)."""
    if images is None:
        return None
    if not isinstance(images, dict) or images.get("status") != "captured":
        reason = images.get("reason") if isinstance(images, dict) else None
        raise _refuse(f"statement {index}'s rows were not imaged ({reason or 'no images'}), "
                      "so there is nothing sealed to restore them from", statement=index,
                      reason=reason)
    if images.get("truncated") or images.get("shown") != images.get("total"):
        raise _refuse(f"statement {index} changed {images.get('total')} row(s), more than the "
                      f"{images.get('shown')} whose images a preview keeps: the rest were "
                      "counted, not imaged, so they cannot be restored", statement=index,
                      total=images.get("total"), shown=images.get("shown"))
    return images


def _names_ok(names: Sequence[str], dialect: str, index: int) -> None:
    # psycopg reads every % in a statement's text as a parameter mark.
    if dialect == "postgres" and any("%" in n for n in names):
        raise _refuse(f"statement {index} names a column with '%' in it, which the undo "
                      "cannot bind parameters beside on PostgreSQL", statement=index)


def compensate(preview: Any, dialect: str) -> Compensation:
    """The undo of the change ``preview`` (a stored preview object) previewed, in
    ``dialect`` (``sqlite`` or ``postgres``); ``UndoUnavailable`` says why there is none."""
    if not isinstance(preview, dict):
        raise _refuse("the request was never previewed (routing allowed it at once), so no "
                      "row images were sealed to undo it from")
    if preview.get("mode") != "rollback":
        raise _refuse(f"the request was previewed in {preview.get('mode')!r} mode, which "
                      "executes nothing and images no row", mode=preview.get("mode"))
    statements = preview.get("statements")
    if not isinstance(statements, list):
        raise _refuse("the stored preview lists no statements")
    built: list[Statement] = []
    rows: list[UndoRow] = []
    for index in reversed(range(len(statements))):
        entry = statements[index] if isinstance(statements[index], dict) else {}
        images = _usable(index, entry.get("row_images"))
        if images is None:
            continue
        table = _table(str(images.get("table")), dialect)
        types = images.get("types")
        bind = _Binder({str(c): str(t) for c, t in (types or {}).items()}
                       if isinstance(types, dict) else {}, dialect, index)
        for row in reversed(images.get("rows") or []):
            op, key = row.get("op"), dict(row.get("key") or {})
            image = row.get("after") if op != "delete" else row.get("before")
            _names_ok([*(image or {}), *key], dialect, index)
            if op == "update" and not row.get("changed"):
                continue  # nothing was changed, so nothing is put back
            if op == "update":
                sql, params = _restore(table, key, row, bind)
                restores = {c: row["before"][c] for c in row["changed"]}
            elif op == "delete":
                sql, params = _reinsert(table, key, row, bind)
                restores = dict(row["before"])
            elif op == "insert":
                sql, params = _remove(table, key, row, bind)
                restores = None
            else:
                raise _refuse(f"statement {index} has a row image of unknown kind {op!r}",
                              statement=index)
            built.append(Statement(sql, tuple(params), expect_rows=1))
            rows.append(UndoRow(index, str(images.get("table")), key, _UNDO_OF[op], restores,
                                None if op == "delete" else dict(row["after"])))
    if not built:
        raise _refuse("the request changed no row its preview imaged: there is nothing to "
                      "undo")
    return Compensation(tuple(built), tuple(rows))
