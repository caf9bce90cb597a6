"""The console's SQL highlighter escapes every character and changes no text."""

from __future__ import annotations

import html
import re

from hypothesis import given
from hypothesis import strategies as st

from marque.harbour.console.highlight import highlight_sql, tokens

TAG = re.compile(r"</?span[^>]*>")


def plain(markup: str) -> str:
    """The text a browser shows for the highlighter's markup."""
    return html.unescape(TAG.sub("", markup))


def test_script_tags_and_quotes_come_out_escaped() -> None:
    """`<script>`, quotes and ampersands in strings, comments and identifiers are escaped;
    the only tags are the highlighter's own spans."""
    sql = ("UPDATE t SET note = '<script>alert(\"x\")</script>' WHERE \"<b>\" = 1 "
           "-- </span><script>&amp;")
    out = str(highlight_sql(sql))
    assert "<script" not in out and "<b>" not in out
    assert "&lt;script&gt;" in out and "&#34;" in out and "&amp;amp;" in out
    assert set(re.findall(r"<(/?\w+)", out)) == {"span", "/span"}
    assert plain(out) == sql


def test_keywords_literals_and_dangerous_verbs_are_classed() -> None:
    """Keywords, strings, numbers, placeholders and comments get their classes; DELETE and
    DROP are marked dangerous."""
    out = str(highlight_sql("DELETE FROM t WHERE id = ? AND n > 2 -- why\nDROP TABLE x"))
    assert '<span class="sql-kw sql-danger">DELETE</span>' in out
    assert '<span class="sql-kw">FROM</span>' in out
    assert '<span class="sql-param">?</span>' in out
    assert '<span class="sql-number">2</span>' in out
    assert '<span class="sql-comment">-- why</span>' in out
    assert '<span class="sql-kw sql-danger">DROP</span>' in out


def test_unterminated_strings_and_comments_run_to_the_end() -> None:
    """An open string or block comment is one token to the end; nothing is lost."""
    for sql in ("SELECT 'open <i>", "SELECT 1 /* open <i>", 'SELECT "open'):
        assert plain(str(highlight_sql(sql))) == sql
        assert "<i>" not in str(highlight_sql(sql))


@given(st.text(max_size=200))
def test_any_text_round_trips_and_injects_no_tag(sql: str) -> None:
    """For any text: the tokens join back to it, and the markup holds no tag but spans."""
    assert "".join(text for _, text in tokens(sql)) == sql
    out = str(highlight_sql(sql))
    assert plain(out) == sql
    assert set(re.findall(r"<(/?\w+)", out)) <= {"span", "/span"}
