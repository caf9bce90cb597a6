"""The docs a user reads are true: their examples run, their tables match the code.

The README's tour and Python snippet, and every other example marked as
tested, are run for real in a fresh directory, and what they print is
compared with what the docs say they print. ``docs/errors.md`` must name every
registered error code with its class, exit status and HTTP status;
``docs/cli.md`` must describe every command and option the CLI has, and
nothing it does not have.

The convention, for whoever writes docs (README.md and docs/*.md):

* A fenced block preceded by the line ``<!-- tested -->`` is run. A ``sh``
  block runs in bash with ``set -euo pipefail``; a ``python`` block runs with
  the project's Python. ``PATH`` starts with the project's virtualenv, so
  ``marque`` and ``python3`` are the project's own.
* All tested blocks of one file run in order, in one fresh empty directory
  and one bash session: later blocks see the files and shell variables of
  earlier ones (a tour may be split by prose). Every block must succeed; a
  command that is meant to fail is written ``cmd || echo "exit status $?"``.
* A ``text`` block preceded by ``<!-- output -->``, right after a tested
  block, is what that block prints — stdout and stderr together, as a
  terminal shows them (which is plain text, since it is not a terminal).
  Lines are compared one for one; ``…`` inside a line matches any text, and a
  line that is only ``…`` matches any number of lines.
* Blocks without the marker (PostgreSQL examples, sketches) are not run.
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from marque import errors
from marque.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
TESTED = "<!-- tested -->"
OUTPUT = "<!-- output -->"
ELLIPSIS = "…"
MARKER = "@@marque-docs-block {}@@"
BLOCK_TIMEOUT = 180  # seconds for all tested blocks of one file


@dataclass
class Block:
    """One fenced block marked as tested, and the output the docs promise for it."""

    source: str
    line: int
    lang: str
    code: str
    expected: list[str] | None = None


@dataclass
class DocRun:
    """What running one file's tested blocks did."""

    directory: Path
    returncode: int
    outputs: dict[int, list[str]] = field(default_factory=dict)


def doc_files() -> list[Path]:
    """The README and every page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _fence(lines: list[str], start: int, source: str) -> tuple[str, str, int]:
    """The (language, code, next line index) of the fenced block that opens at ``start``."""
    opening = lines[start].strip()
    if not opening.startswith("```"):
        raise AssertionError(f"{source}:{start + 1}: a marker must be followed by a fenced block")
    lang = opening[3:].strip()
    end = start + 1
    while end < len(lines) and lines[end].strip() != "```":
        end += 1
    if end == len(lines):
        raise AssertionError(f"{source}:{start + 1}: unterminated fenced block")
    return lang, "\n".join(lines[start + 1:end]) + "\n", end + 1


def _next_content(lines: list[str], index: int) -> int:
    while index < len(lines) and not lines[index].strip():
        index += 1
    return index


def marked_blocks(path: Path) -> list[Block]:
    """The blocks of ``path`` marked as tested, in order, with their promised output."""
    source = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        marker = lines[index].strip()
        if marker == TESTED:
            start = _next_content(lines, index + 1)
            lang, code, index = _fence(lines, start, source)
            assert lang in ("sh", "python"), f"{source}:{start + 1}: cannot run ```{lang}"
            blocks.append(Block(source, start + 1, lang, code))
        elif marker == OUTPUT:
            start = _next_content(lines, index + 1)
            lang, code, index = _fence(lines, start, source)
            assert lang == "text", f"{source}:{start + 1}: an output block is ```text"
            assert blocks and blocks[-1].expected is None, (
                f"{source}:{start + 1}: an output block must follow a tested block")
            blocks[-1].expected = code.splitlines()
        else:
            index += 1
    return blocks


def run_blocks(blocks: list[Block], directory: Path, scripts: Path) -> DocRun:
    """Run ``blocks`` in order in one bash session in ``directory``; split output by block."""
    script = ["set -euo pipefail", "exec 2>&1"]
    for number, block in enumerate(blocks):
        script.append(f"printf '\\n{MARKER.format(number)}\\n'")
        if block.lang == "sh":
            script.append(block.code)
        else:
            program = scripts / f"block{number}.py"
            program.write_text(block.code, encoding="utf-8")
            script.append(f"'{sys.executable}' '{program}'")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARQUE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    run = DocRun(directory, proc.returncode)
    pieces = re.split(r"\n?@@marque-docs-block (\d+)@@\n", proc.stdout + proc.stderr)
    for label, text in zip(pieces[1::2], pieces[2::2], strict=True):
        run.outputs[int(label)] = text.splitlines()
    return run


def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.rstrip().split(ELLIPSIS)))


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` is ``expected`` line for line, with ``…`` as the wildcard."""
    patterns = [None if line.strip() == ELLIPSIS else _line_pattern(line) for line in expected]

    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(patterns):
            return j == len(actual)
        pattern = patterns[i]
        if pattern is None:  # any number of lines
            return match(i + 1, j) or (j < len(actual) and match(i, j + 1))
        return (j < len(actual) and pattern.fullmatch(actual[j].rstrip()) is not None
                and match(i + 1, j + 1))

    return match(0, 0)


FILES_WITH_BLOCKS = [path for path in doc_files() if marked_blocks(path)]


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Block], DocRun]]:
    """Every file's tested blocks, run once each in its own fresh directory.

    The files share nothing (each has its own directory, bash session and services on
    ports chosen at run time), so two run at once: most of their time is spent starting
    processes and waiting on them."""
    bases = {path: tmp_path_factory.mktemp(path.stem) for path in FILES_WITH_BLOCKS}

    def run_file(path: Path) -> tuple[str, tuple[list[Block], DocRun]]:
        blocks = marked_blocks(path)
        base = bases[path]
        (base / "work").mkdir()
        (base / "scripts").mkdir()
        return path.name, (blocks, run_blocks(blocks, base / "work", base / "scripts"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run_file, FILES_WITH_BLOCKS))


def _report(block: Block, run: DocRun, number: int) -> str:
    shown = "\n".join(run.outputs.get(number, ["(no output)"]))
    return f"{block.source}:{block.line} ({block.lang} block {number}) printed:\n{shown}"


# -- the examples run as written ------------------------------------------------------------


@pytest.mark.parametrize("name", [path.name for path in FILES_WITH_BLOCKS])
def test_tested_blocks_run_and_print_what_the_docs_show(
    name: str, doc_runs: dict[str, tuple[list[Block], DocRun]]
) -> None:
    """Every tested block of a doc runs to success in order, printing its output block."""
    blocks, run = doc_runs[name]
    if run.returncode != 0:
        failed = max(run.outputs, default=0)
        pytest.fail(f"exit status {run.returncode}; " + _report(blocks[failed], run, failed))
    assert sorted(run.outputs) == list(range(len(blocks))), "not every block ran"
    for number, block in enumerate(blocks):
        if block.expected is not None:
            assert output_matches(block.expected, run.outputs[number]), (
                "expected:\n" + "\n".join(block.expected) + "\n\n" + _report(block, run, number))


def test_the_readme_tour_and_python_snippet_are_tested() -> None:
    """The README's tour and its Python snippet carry the marker, so neither can rot unseen."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text[text.index("## A tour"):text.index("## From Python")]
    python = text[text.index("## From Python"):]
    python = python[:python.index("\n## ", 1)]
    assert tour.count(f"{TESTED}\n```sh") >= 3
    assert f"{TESTED}\n```python" in python
    # Every runnable block in those sections is tested: none is left for a reader to trust.
    assert tour.count("```sh") == tour.count(f"{TESTED}\n```sh")
    assert python.count("```python") == python.count(f"{TESTED}\n```python")


def test_the_tour_changed_the_bank_exactly_as_it_says(
    doc_runs: dict[str, tuple[list[Block], DocRun]]
) -> None:
    """After the tour: one debit and one refund applied, each once, each with its stamp."""
    _, run = doc_runs["README.md"]
    assert run.returncode == 0
    with sqlite3.connect(run.directory / "bank.db") as conn:
        balances = dict(conn.execute("SELECT id, balance FROM accounts"))
        stamps = conn.execute(
            "SELECT nonce, kind, attempt, rows_affected FROM marque_stamps ORDER BY nonce"
        ).fetchall()
    assert balances == {1: 100, 2: 100}
    assert stamps == [("pay-1", "applied", 1, 1), ("refund-1", "applied", 1, 1)]


def test_the_readme_service_example_runs_against_a_served_pilot(
    doc_runs: dict[str, tuple[list[Block], DocRun]], tmp_path: Path
) -> None:
    """"The Pilot as a service": after the tour, its commands run as written against a
    real `pilot serve` over the tour's home (on a free port, not 8750), and the marque
    they execute is a fresh one — never the tour's spent one."""
    from support.harbour import PilotServe

    _, tour = doc_runs["README.md"]
    assert tour.returncode == 0
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## The Pilot as a service"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert "marque pilot serve --home ./pilot --listen 127.0.0.1:8750" in blocks[0]
    service = PilotServe(tour.directory / "pilot", cwd=tour.directory, log=tmp_path / "log")
    service.start()
    try:
        commands = "\n".join(blocks[1:]).replace("http://127.0.0.1:8750", service.url)
        shell = ("set -euo pipefail\n"
                 "field() { python3 -c 'import json, sys; print(json.load(sys.stdin)"
                 "[sys.argv[1]])' \"$1\"; }\n"
                 "INCARNATION=$(marque pilot show --home ./pilot --json | field incarnation)\n"
                 + commands)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARQUE_")}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        done = subprocess.run(["bash", "-c", shell], cwd=tour.directory, env=env,
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    finally:
        service.stop()
    assert done.returncode == 0, done
    assert re.search(r"^applied marque mq_\S+ nonce \S+ attempt 1, rows_affected=1$",
                     done.stdout, re.M), done
    assert '"pilot_id": "pilot-1"' in done.stdout or '"pilot_id":"pilot-1"' in done.stdout
    assert "budget_exhausted" not in done.stdout + done.stderr


_ISSUE_TALK = re.compile(r"\b[Ii]ssues? \d+|\b[Tt]he issue\b(?!r)|\bissue's\b|\bthis issue\b")


def test_no_page_speaks_of_the_projects_issues() -> None:
    """Users have the docs, not the project's issue tracker: a page states what it means
    (a target, a choice) in its own words, never as "issue 15's targets"."""
    pages = [*doc_files(), ROOT / "bench" / "README.md"]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in pages
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _ISSUE_TALK.search(line)]
    assert not found, found


def test_the_cli_exit_table_names_every_exit_status() -> None:
    """docs/cli.md's exit status table has a row for each status an outcome or an error
    class gives (0 and 6 from outcomes; the rest from the error classes), and exit 1 is
    left to what nobody planned for: a bug, which a service answers as ``internal``."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    table = text[text.index("| exit | meaning |"):]
    table = table[:table.index("\n\n")]
    documented = {int(row.split("|")[1]) for row in table.splitlines()[2:]}
    given = {0, 6} | {cls.exit_status for cls in errors.MarqueError._registry.values()}
    assert documented == given
    # exit 1 is left to what nobody planned for; `internal` is a service saying it met one
    assert [cls for cls in errors.MarqueError._registry.values()
            if cls.exit_status == 1] == [errors.Internal]


def test_docs_need_nothing_outside_the_repository() -> None:
    """A user has the repository only: no page points at ../shared or DESIGN.md."""
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text, path
        assert "DESIGN.md" not in text, path


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_links_between_docs_resolve() -> None:
    """Every relative link in the README and docs/ names a file, and an anchor, that exist."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    anchors = {
        path.resolve(): {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
        for path in doc_files()
    }
    broken = []
    for path in doc_files():
        for target in link.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path.resolve()
            if not linked.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and anchor not in anchors.get(linked, set()):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, broken


# -- docs/errors.md names every code ---------------------------------------------------------

_ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*`(\w+)`\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|(.*)\|\s*$")


def documented_errors(text: str) -> dict[str, tuple[str, int, int]]:
    """``code → (class, exit status, HTTP status)`` from the code tables of errors.md."""
    found: dict[str, tuple[str, int, int]] = {}
    for line in text.splitlines():
        match = _ROW.match(line)
        if match:
            code, cls, exit_status, http = match.group(1, 2, 3, 4)
            assert code not in found, f"{code} is documented twice"
            meaning = [cell.strip() for cell in match.group(5).split("|")]
            assert len(meaning) == 2 and all(meaning), f"{code}: meaning and what to do"
            found[code] = (cls, int(exit_status), int(http))
    return found


def test_errors_doc_names_every_registered_code_with_its_statuses() -> None:
    """docs/errors.md has one row per registered code: its class, exit and HTTP status."""
    documented = documented_errors((DOCS / "errors.md").read_text(encoding="utf-8"))
    registered = {code: (cls.__name__, cls.exit_status, cls.http_status)
                  for code, cls in errors.MarqueError._registry.items()}
    missing = sorted(set(registered) - set(documented))
    invented = sorted(set(documented) - set(registered))
    assert not missing, f"codes with no row in docs/errors.md: {missing}"
    assert not invented, f"docs/errors.md documents codes that do not exist: {invented}"
    wrong = {code: (documented[code], registered[code])
             for code in registered if documented[code] != registered[code]}
    assert not wrong, f"(documented, actual) class/exit/HTTP differ: {wrong}"


def test_errors_doc_parser_sees_a_row() -> None:
    """The row parser reads a well-formed row, so an empty parse cannot pass for agreement."""
    row = "| `budget_exhausted` | `BudgetExhausted` | 3 | 403 | spent | get another |"
    assert documented_errors(row) == {"budget_exhausted": ("BudgetExhausted", 3, 403)}


# -- docs/cli.md describes every command and option ------------------------------------------


def cli_commands() -> dict[str, click.Command]:
    """Every command that runs something, by its full path (``pilot target add``)."""
    found: dict[str, click.Command] = {}

    def walk(command: click.Command, path: str, ctx: click.Context) -> None:
        if isinstance(command, click.Group):
            # What `--help` lists: the lazily imported subcommands included.
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"{path} {name}: listed but not found"
                walk(sub, f"{path} {name}".strip(), click.Context(sub, parent=ctx, info_name=name))
        else:
            found[path] = command

    walk(app, "", click.Context(app, info_name="marque"))
    return found


def cli_sections() -> dict[str, str]:
    """The text of each ``### `marque …` `` section of docs/cli.md, by command path."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    for match in re.finditer(r"^### `marque ([a-z -]+)`\n(.*?)(?=^#{1,3} |\Z)", text,
                             re.M | re.S):
        sections[match.group(1)] = match.group(2)
    return sections


def test_cli_doc_describes_every_command_and_no_other() -> None:
    """docs/cli.md has a section for each command the CLI has, and none for one it lacks."""
    commands, sections = set(cli_commands()), set(cli_sections())
    assert not commands - sections, f"undocumented commands: {sorted(commands - sections)}"
    assert not sections - commands, f"documented but absent: {sorted(sections - commands)}"


def test_cli_doc_describes_every_option_and_argument() -> None:
    """Each command's section names each of its options and arguments in its table."""
    sections = cli_sections()
    missing = []
    for path, command in cli_commands().items():
        rows = [line for line in sections.get(path, "").splitlines() if line.startswith("| `")]
        names = [name for name in (row.split("`")[1].split()[0] for row in rows)
                 if name.startswith("--") or re.fullmatch(r"[A-Z_]+", name)]
        for param in command.params:
            if param.name == "help":
                continue
            if isinstance(param, click.Argument):
                wanted = param.human_readable_name
            else:
                wanted = max(param.opts, key=len)
            if wanted not in names:
                missing.append(f"marque {path} {wanted}")
        documented_only = set(names) - {
            max(p.opts, key=len) if isinstance(p, click.Option) else p.human_readable_name
            for p in command.params}
        missing.extend(f"marque {path} {name} (documented, absent)" for name in documented_only)
    assert not missing, missing


def test_every_option_has_help() -> None:
    """`marque CMD --help` explains every option: none is left with an empty line."""
    bare = [f"marque {path} {max(p.opts, key=len)}"
            for path, command in cli_commands().items()
            for p in command.params
            if isinstance(p, click.Option) and p.name != "help" and not (p.help or "").strip()]
    assert not bare, bare
