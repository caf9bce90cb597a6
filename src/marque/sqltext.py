"""What an approved statement may be: exactly one statement, inside our transaction.

The Pilot runs approved SQL inside the fenced transaction it opened, so a
statement must never end, split or reconfigure that transaction: a ``COMMIT``
would publish the stamp and half the change before ``max_rows`` is asserted,
a ``ROLLBACK`` would erase the stamp and let the rest apply unfenced, a
``SET statement_timeout`` would lift the Pilot's timeout. This module finds
the statement boundaries and the leading keyword with a small lexer that
knows SQL's quoting (``'…'`` with ``''``, ``"…"``, ``$tag$…$tag$``, ``--`` and
``/* */`` comments); it does not try to parse SQL.
"""

from __future__ import annotations

import re

#: Leading keywords an approved statement may not start with.
FORBIDDEN = frozenset({
    "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE",
    "PREPARE", "SET", "RESET", "ATTACH", "DETACH", "PRAGMA", "VACUUM", "LOCK",
    "DISCARD", "LISTEN", "UNLISTEN", "NOTIFY", "COPY",
})
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_WORD = re.compile(r"[A-Za-z_]+")


class SqlTextError(ValueError):
    """The SQL is not one allowed statement."""


def _code_spans(sql: str) -> list[tuple[int, int]]:
    """Spans of ``sql`` outside quotes and comments; raises on an unterminated one."""
    spans: list[tuple[int, int]] = []
    i, start, n = 0, 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            spans.append((start, i))
            j = i + 1
            while True:
                j = sql.find(ch, j)
                if j < 0:
                    raise SqlTextError("unterminated quoted string")
                if j + 1 < n and sql[j + 1] == ch:  # doubled quote is an escaped quote
                    j += 2
                    continue
                break
            i = start = j + 1
        elif sql.startswith("--", i):
            spans.append((start, i))
            j = sql.find("\n", i)
            i = start = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            spans.append((start, i))
            j = sql.find("*/", i + 2)
            if j < 0:
                raise SqlTextError("unterminated comment")
            i = start = j + 2
        elif ch == "$" and (m := _DOLLAR.match(sql, i)) and (i == 0 or not (
                sql[i - 1].isalnum() or sql[i - 1] == "_")):
            spans.append((start, i))
            tag = m.group(0)
            j = sql.find(tag, m.end())
            if j < 0:
                raise SqlTextError("unterminated dollar-quoted string")
            i = start = j + len(tag)
        else:
            i += 1
    spans.append((start, n))
    return spans


def check_statement(sql: str) -> str:
    """Return ``sql`` if it is one statement that leaves the transaction alone.

    Raises :class:`SqlTextError` naming the problem otherwise.
    """
    code = " ".join(sql[a:b] for a, b in _code_spans(sql))
    body = code.strip()
    # One trailing semicolon is harmless; anything after a semicolon is a second statement.
    if body.endswith(";"):
        body = body[:-1]
    if ";" in body:
        raise SqlTextError("holds more than one statement; give each its own --sql")
    word = _WORD.search(body.lstrip("( \t\r\n"))
    if word is None:
        raise SqlTextError("holds no statement")
    keyword = word.group(0).upper()
    if keyword in FORBIDDEN:
        raise SqlTextError(
            f"starts with {keyword}: statements may not control the transaction, the session "
            "or the connection the Pilot runs them in"
        )
    return sql
