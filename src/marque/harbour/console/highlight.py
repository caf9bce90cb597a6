"""SQL highlighting for the console: every character escaped, then wrapped in spans.

Approvers read statements exactly as stored, so the highlighter never changes
text: it splits the SQL into tokens (comments, strings, quoted identifiers,
numbers, placeholders, words, the rest), escapes each token's text with
:func:`markupsafe.escape`, and wraps the kinds it recognises in a ``<span>``
with a CSS class. The markup it returns is safe *because* every piece of user
text went through ``escape``; nothing else is ever marked safe. Removing the
tags and unescaping gives back the statement, byte for byte.

Statements that change or destroy data (``UPDATE``, ``DELETE``, ``DROP``,
``TRUNCATE``, ``ALTER``, ``GRANT``, ``REVOKE``) get a second class, so a
reviewer's eye lands on them first.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

__all__ = ["highlight_sql", "tokens"]

_TOKEN = re.compile(r"""
    (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<string>'(?:[^']|'')*(?:'|\Z))
  | (?P<ident>"(?:[^"]|"")*(?:"|\Z)|`[^`]*(?:`|\Z))
  | (?P<number>\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b)
  | (?P<param>\?\d*|\$\d+|:[A-Za-z_]\w*|%\(\w+\)s|%s)
  | (?P<word>[A-Za-z_][A-Za-z_0-9$]*)
  | (?P<space>\s+)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)

KEYWORDS = frozenset("""
    all alter and any as asc begin between by call case cast check commit conflict
    constraint copy create cross default delete desc distinct do drop else end except
    exists false fetch for foreign from full grant group having if ilike in index inner
    insert intersect into is join key left like limit lock not nothing null nulls offset
    on only or order outer over partition primary read recursive references replace
    returning revoke right rollback row rows savepoint select set share table then to
    transaction true truncate union unique update using values view when where window
    with
""".split())
#: Keywords that start a change a reviewer must look at twice.
DANGER = frozenset({"update", "delete", "drop", "truncate", "alter", "grant", "revoke"})

_CLASSES = {"comment": "sql-comment", "string": "sql-string", "ident": "sql-ident",
            "number": "sql-number", "param": "sql-param"}


def tokens(sql: str) -> list[tuple[str, str]]:
    """``(kind, text)`` pairs whose texts, joined, are ``sql`` exactly."""
    found: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup or "other"
        text = match.group()
        if kind == "word":
            kind = "danger" if text.lower() in DANGER else \
                "keyword" if text.lower() in KEYWORDS else "word"
        found.append((kind, text))
    return found


def highlight_sql(sql: str) -> Markup:
    """``sql`` as HTML: escaped text, keywords and literals in classed spans."""
    parts: list[str] = []
    for kind, text in tokens(sql):
        escaped = str(escape(text))
        if kind == "keyword":
            parts.append(f'<span class="sql-kw">{escaped}</span>')
        elif kind == "danger":
            parts.append(f'<span class="sql-kw sql-danger">{escaped}</span>')
        elif kind in _CLASSES:
            parts.append(f'<span class="{_CLASSES[kind]}">{escaped}</span>')
        else:
            parts.append(escaped)
    # Safe: every fragment above is either a fixed tag or the escape() of user text.
    return Markup("".join(parts))
