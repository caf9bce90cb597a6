"""The one migration runner (marque.storage.migrations) over real SQLite files."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from marque.storage import sqlite as sqlite_files
from marque.storage.migrations import Schema, Stored, migrate


class Refused(Exception):
    pass


class Notes(Schema[sqlite3.Connection]):
    """Two steps: a table, then a column; the version in a one-row table."""

    STEPS = (
        ("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
         "CREATE TABLE version (v INTEGER NOT NULL)", "INSERT INTO version VALUES (0)"),
        ("ALTER TABLE notes ADD COLUMN at REAL",),
    )
    latest = len(STEPS)

    def stored(self, conn: sqlite3.Connection) -> Stored:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'version'").fetchone() is None:
            return Stored(0)
        return Stored(int(conn.execute("SELECT v FROM version").fetchone()[0]))

    def step(self, conn: sqlite3.Connection, index: int) -> None:
        for statement in self.STEPS[index]:
            conn.execute(statement)

    def record(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute("UPDATE version SET v = ?", (version,))

    def newer(self, found: int) -> Exception:
        return Refused(found)


def run(conn: sqlite3.Connection) -> int:
    return migrate(Notes(), lambda: contextlib.nullcontext(conn),
                   lambda: sqlite_files.immediate(conn))


def test_a_new_file_takes_every_step_once_and_records_the_latest(tmp_path: Path) -> None:
    conn = sqlite_files.connect(str(tmp_path / "n.sqlite3"), busy_timeout_ms=1000)
    assert run(conn) == 0
    assert run(conn) == 2  # the second open finds it current and runs nothing again
    columns = [row[1] for row in conn.execute("PRAGMA table_info(notes)")]
    assert columns == ["id", "body", "at"]
    assert conn.execute("SELECT v FROM version").fetchone()[0] == 2
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_an_up_to_date_file_is_opened_without_a_write(tmp_path: Path) -> None:
    path = tmp_path / "n.sqlite3"
    run(sqlite_files.connect(str(path), busy_timeout_ms=1000))
    read_only = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    assert run(read_only) == 2  # a write on this connection would raise


def test_an_older_file_moves_forward_and_keeps_its_rows(tmp_path: Path) -> None:
    conn = sqlite_files.connect(str(tmp_path / "n.sqlite3"), busy_timeout_ms=1000)
    for statement in Notes.STEPS[0]:
        conn.execute(statement)
    conn.execute("UPDATE version SET v = 1")
    conn.execute("INSERT INTO notes (body) VALUES ('kept')")
    assert run(conn) == 1
    assert conn.execute("SELECT body, at FROM notes").fetchall() == [("kept", None)]


def test_a_failing_step_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    conn = sqlite_files.connect(str(tmp_path / "n.sqlite3"), busy_timeout_ms=1000)
    for statement in Notes.STEPS[0]:
        conn.execute(statement)
    conn.execute("UPDATE version SET v = 1")
    conn.execute("ALTER TABLE notes ADD COLUMN at REAL")  # step 2's column, already there
    with pytest.raises(sqlite3.OperationalError):
        run(conn)
    assert not conn.in_transaction
    assert conn.execute("SELECT v FROM version").fetchone()[0] == 1


def test_a_newer_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    conn = sqlite_files.connect(str(tmp_path / "n.sqlite3"), busy_timeout_ms=1000)
    run(conn)
    conn.execute("UPDATE version SET v = 3")
    with pytest.raises(Refused):
        run(conn)
    assert conn.execute("SELECT v FROM version").fetchone()[0] == 3
