"""The error registry, ``marque.errors``' own tree and docs/errors.md say the same thing.

Every error class of ``marque.errors`` is either one of the kinds (a base without a
code of its own) or registered under a stable code no other class carries; the tree
in the module docstring lists each class once, under its real base, with its code;
and every code has its row in docs/errors.md naming its class, exit status and HTTP
status.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from marque import errors

DOCS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
#: The kinds: bases an error is caught by, never raised with a code of their own.
KINDS = {errors.UsageError, errors.Refusal, errors.NotApplied, errors.Indeterminate,
         errors.Unavailable}
#: One line of the docstring tree: its box-drawing indent, the class, then the rest.
TREE_LINE = re.compile(r"^(?P<indent>[│├└─ ]*)(?P<name>[A-Z]\w*)(?:\s+(?P<rest>.*))?$")
#: One row of a docs table of codes: | `code` | `Class` | exit | HTTP | …
DOC_ROW = re.compile(r"^\| `(?P<code>[a-z_]+)` \| `(?P<cls>\w+)` \| (?P<exit>\d+) \| "
                     r"(?P<http>\d+) \|")


def error_classes() -> list[type[errors.MarqueError]]:
    """Every MarqueError class defined in marque.errors, the root included."""
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.MarqueError) and cls.__module__ == errors.__name__]


def docstring_tree() -> dict[str, tuple[str | None, str]]:
    """The module docstring's tree: class name → (its parent's name, the rest of its line)."""
    doc = errors.__doc__ or ""
    lines = [line[4:] for line in doc.splitlines() if line.startswith("    ")]
    tree: dict[str, tuple[str | None, str]] = {}
    stack: list[str] = []
    for line in lines:
        match = TREE_LINE.match(line)
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match["indent"]) // 4
        name = match["name"]
        assert name not in tree, f"{name} is listed twice in the tree"
        del stack[depth:]
        tree[name] = (stack[-1] if stack else None, match["rest"] or "")
        stack.append(name)
    return tree


def test_every_class_has_a_code_of_its_own_or_is_a_kind() -> None:
    for cls in error_classes():
        if cls is errors.MarqueError or cls in KINDS:
            assert cls.code not in errors.MarqueError._registry, cls
            continue
        assert errors.lookup(cls.code) is cls, f"{cls.__name__} has no code of its own"


def test_codes_are_unique_and_snake_case() -> None:
    codes = [cls.code for cls in error_classes()
             if cls is not errors.MarqueError and cls not in KINDS]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", code) for code in codes), codes
    assert set(codes) == set(errors.MarqueError._registry)


def test_the_docstring_tree_lists_each_class_under_its_base_with_its_code() -> None:
    tree = docstring_tree()
    classes = {cls.__name__: cls for cls in error_classes()}
    assert set(tree) == set(classes), (
        f"missing from the tree: {sorted(set(classes) - set(tree))}; "
        f"not classes: {sorted(set(tree) - set(classes))}")
    for name, (parent, rest) in tree.items():
        cls = classes[name]
        if cls is errors.MarqueError:
            assert parent is None
            continue
        assert parent == cls.__bases__[0].__name__, f"{name} is not under {parent}"
        words = rest.split()
        if cls in KINDS:
            assert not words or words[0] not in errors.MarqueError._registry, name
        else:
            assert words and words[0] == cls.code, f"{name}'s line does not say {cls.code}"


def doc_rows() -> dict[str, tuple[str, int, int]]:
    rows: dict[str, tuple[str, int, int]] = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        if match := DOC_ROW.match(line):
            assert match["code"] not in rows, f"{match['code']} has two rows in errors.md"
            rows[match["code"]] = (match["cls"], int(match["exit"]), int(match["http"]))
    return rows


@pytest.mark.parametrize("code", sorted(errors.MarqueError._registry))
def test_every_code_has_its_row_in_the_docs(code: str) -> None:
    cls = errors.lookup(code)
    rows = doc_rows()
    assert code in rows, f"docs/errors.md has no row for {code}"
    assert rows[code] == (cls.__name__, cls.exit_status, cls.http_status)


def test_the_docs_name_no_code_that_is_not_registered() -> None:
    assert set(doc_rows()) <= set(errors.MarqueError._registry)
