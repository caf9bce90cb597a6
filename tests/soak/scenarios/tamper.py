"""Matrix row 12: logbook tampering — a flipped byte, a deletion, a reordering, a truncation.

Three logbooks, each written by the product itself and then tampered with
behind its back with plain SQL, one tamper per case at a position drawn from
``ctx.rng``, then restored row for row before the next:

* a Pilot's embedded logbook (``logbook.sqlite3`` in a Pilot home), filled by
  real executions whose outcome reports the Pilot journals;
* a Harbourmaster's SQLite store (a ``harbour init`` home), filled by
  ``store.append`` with bodies drawn from ``ctx.rng``;
* its PostgreSQL sibling, when ``ctx.pg_admin_dsn`` is given.

Tampers (:data:`TAMPERS`): ``flip`` flips one bit of one byte of one stored
field of entry *k* (body, kind, actor, subject, at, hash, prev_hash, and the
Pilot's entry key); ``delete`` removes entry *k* (not the last: that is a
truncation); ``delete_renumbered`` removes it and renumbers the rest to hide
the gap; ``reorder`` swaps the positions of entries *k* and *j*; ``truncate``
cuts entries *k*..*n* (on a Harbourmaster, half the time also rewinding its
head row, as an attacker who knows about it would).

Each tamper must be named at the right ``seq`` by every path that can see it:
the chain walk itself (:func:`marque.logbook.chain.verify_entries` /
``Logbook.check``), ``marque.cli.logbook_homes.verify_home`` (what ``marque logbook
verify --home`` runs, which on a Harbourmaster also holds the chain to its
head row), the same with the head saved before the tamper (signed by the
issuer on a Harbourmaster; ``--head``), and, for a sample, the real CLI. A
truncation is invisible to the chain alone (that is asserted too), named by
the saved head always and by the head row unless it was rewound. Every few
cases an untampered logbook must verify intact, so "broken" is not the
verifiers' only answer.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.cli import cli_env

from marque.cli.logbook_homes import head_of, saved_head, verify_home
from marque.errors import LogbookBroken, MarqueError
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.setup import init_harbour
from marque.logbook.chain import verify_against_head, verify_entries
from marque.logbook.embedded import Logbook
from marque.pilot.home import PilotHome
from soak.scenario import RunContext, ScenarioResult, scenario
from soak.scenarios._world import MARQUE, TokenWorld

TAMPERS = ("flip", "delete", "delete_renumbered", "reorder", "truncate")
#: Entries each logbook holds before the tampering starts.
ENTRIES = 40
#: One round (a case on each logbook) in this many also runs the real CLI; coprime with the
#: five tampers, so the CLI sees each of them.
CLI_ROUNDS = 21
#: An untampered control every this many cases.
CONTROL_EVERY = 25


class RawLogbook:
    """Plain SQL on one logbook table, behind the product's back: snapshot, tamper, restore."""

    def __init__(self, name: str, home: Path, columns: Sequence[str], *,
                 connect: Callable[[], Any], placeholder: str = "?",
                 head_row: bool = False, text_fields: Sequence[str] = ()) -> None:
        self.name = name
        self.home = home
        self.columns = list(columns)
        self._connect = connect
        self._p = placeholder
        self.head_row = head_row
        self.text_fields = list(text_fields)
        self.rows = self.query(f"SELECT {', '.join(self.columns)} FROM logbook ORDER BY seq")
        self.head = (self.query("SELECT seq, hash, at FROM logbook_head")[0]
                     if head_row else None)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cur = conn.execute(sql.replace("?", self._p), tuple(params))
            rows = list(cur.fetchall()) if cur.description is not None else []
            conn.commit()
            return rows
        finally:
            conn.close()

    def script(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Several statements in one transaction."""
        conn = self._connect()
        try:
            for sql, params in statements:
                conn.execute(sql.replace("?", self._p), tuple(params))
            conn.commit()
        finally:
            conn.close()

    @property
    def n(self) -> int:
        return len(self.rows)

    def restore(self) -> None:
        marks = ", ".join("?" for _ in self.columns)
        statements: list[tuple[str, Sequence[Any]]] = [("DELETE FROM logbook", ())]
        statements += [(f"INSERT INTO logbook ({', '.join(self.columns)}) VALUES ({marks})", row)
                       for row in self.rows]
        if self.head is not None:
            statements.append(("UPDATE logbook_head SET seq = ?, hash = ?, at = ?", self.head))
        self.script(statements)

    def row(self, seq: int) -> dict[str, Any]:
        return dict(zip(self.columns, self.rows[seq - 1], strict=True))


@dataclass
class Tamper:
    """One planned tamper: what, where, and the ``seq`` each verification must name."""

    kind: str
    seq: int
    detail: str
    #: What the chain walk alone must say (None: intact — a truncation).
    chain: int | None
    #: What ``verify_home`` without a saved head must say.
    home: int | None
    #: What verification against the head saved before the tamper must say.
    with_head: int


def plan(book: RawLogbook, kind: str, rng: Any) -> tuple[Tamper, list[tuple[str, Sequence[Any]]]]:
    """A tamper of ``kind`` at positions drawn from ``rng``, and the SQL that applies it."""
    n = book.n
    if kind == "flip":
        return _plan_flip(book, rng)
    if kind in ("delete", "delete_renumbered"):
        k = rng.randint(1, n - 1)
        sql: list[tuple[str, Sequence[Any]]] = [("DELETE FROM logbook WHERE seq = ?", (k,))]
        if kind == "delete_renumbered":
            # Renumber one row at a time, upwards, so the primary key never collides.
            sql += [("UPDATE logbook SET seq = ? WHERE seq = ?", (s - 1, s))
                    for s in range(k + 1, n + 1)]
        return Tamper(kind, k, f"entry {k} removed", k, k, k), sql
    if kind == "reorder":
        k, j = sorted(rng.sample(range(1, n + 1), 2))
        sql = [("UPDATE logbook SET seq = ? WHERE seq = ?", (-1, k)),
               ("UPDATE logbook SET seq = ? WHERE seq = ?", (k, j)),
               ("UPDATE logbook SET seq = ? WHERE seq = ?", (j, -1))]
        return Tamper(kind, k, f"entries {k} and {j} swapped", k, k, k), sql
    assert kind == "truncate"
    k = rng.randint(2, n)
    sql = [("DELETE FROM logbook WHERE seq >= ?", (k,))]
    rewound = book.head_row and rng.random() < 0.5
    if rewound:
        prev = book.row(k - 1)
        sql.append(("UPDATE logbook_head SET seq = ?, hash = ?, at = ?",
                    (k - 1, prev["hash"], prev["at"])))
    # Only a Harbourmaster keeps a head row: a Pilot's cut tail needs the saved head.
    home = k if book.head_row and not rewound else None
    what = f"entries {k}..{n} cut" + (" and the head row rewound" if rewound else "")
    return Tamper(kind, k, what, None, home, k), sql


def _plan_flip(book: RawLogbook, rng: Any) -> tuple[Tamper, list[tuple[str, Sequence[Any]]]]:
    k = rng.randint(1, book.n)
    row = book.row(k)
    while True:
        field = rng.choice([*book.text_fields, "at"])
        value = row[field]
        if field == "at":
            raw = bytearray(struct.pack("<d", float(value)))
            i, bit = rng.randrange(8), rng.randrange(8)
            raw[i] ^= 1 << bit
            new: Any = struct.unpack("<d", bytes(raw))[0]
            if new != new or new in (float("inf"), float("-inf")) or new == value:
                continue  # NaN and infinities do not survive every column type
        else:
            if not value:
                continue
            i, bit = rng.randrange(len(value)), rng.randrange(7)
            c = chr(ord(value[i]) ^ (1 << bit))
            if c == "\x00":
                continue  # PostgreSQL text cannot hold NUL
            new = value[:i] + c + value[i + 1:]
            if field == "body" and _same_json(value, new):
                continue  # the same content in other bytes (an escape's case): no tamper
            if field == "entry_key" and any(book.row(j)["entry_key"] == new
                                            for j in range(1, book.n + 1)):
                continue  # another entry's key (n-1 ↔ n-3): the unique index refuses it
        sql = [(f"UPDATE logbook SET {field} = ? WHERE seq = ?", (new, k))]
        return Tamper("flip", k, f"entry {k}: one bit of {field} flipped", k, k, k), sql


def _same_json(old: str, new: str) -> bool:
    try:
        return bool(json.loads(old) == json.loads(new))
    except ValueError:
        return False


# -- the three logbooks ------------------------------------------------------------------------


_PILOT_COLUMNS = ("seq", "entry_key", "kind", "actor", "subject", "body", "at", "prev_hash",
                  "hash", "chain_format")
_HARBOUR_COLUMNS = ("seq", "at", "kind", "actor", "subject", "body", "prev_hash", "hash")


def pilot_logbook(root: Path, entries: int) -> RawLogbook:
    """A Pilot home whose own logbook journals ``entries`` real executions."""
    world = TokenWorld(root)
    marque = world.marque()
    pilot = world.open()
    try:
        for i in range(entries):
            nonce = f"n{i}"
            pilot.execute(marque, world.proof(marque, nonce), nonce)
    finally:
        pilot.close()
    path = PilotHome(world.home).logbook_path
    return RawLogbook("pilot", world.home, _PILOT_COLUMNS,
                      connect=lambda: sqlite3.connect(path),
                      text_fields=("kind", "actor", "subject", "body", "prev_hash", "hash",
                                   "entry_key"))


def harbour_logbook(root: Path, entries: int, rng: Any, *,
                    store_dsn: str | None = None) -> RawLogbook:
    """A Harbourmaster home (SQLite, or PostgreSQL at ``store_dsn``) with ``entries`` more."""
    home = root / ("harbour-pg" if store_dsn else "harbour")
    init_harbour(home, store_dsn=store_dsn)
    store = open_home_store(HarbourHome(home))
    try:
        for i in range(entries):
            body = {"i": i, "note": rng.choice(["plain", "ünïcødé", "tab\there", "\u001f",
                                                 "quote\"s", "x" * rng.randint(0, 200)]),
                    "amount": rng.randint(-10**12, 10**12), "ratio": rng.random(),
                    "nested": {"list": [rng.randint(0, 9) for _ in range(rng.randint(0, 5))]}}
            store.append(rng.choice(["request.created", "execution.applied", "finding.x"]),
                         rng.choice(["alice", "pilot:p1", "admin"]), f"rq_{i}", body)
    finally:
        store.close()
    if store_dsn is None:
        path = home / "harbour.sqlite3"
        connect: Callable[[], Any] = lambda: sqlite3.connect(path)  # noqa: E731
        placeholder = "?"
    else:
        import psycopg

        def connect() -> Any:
            conn = psycopg.connect(store_dsn)
            conn.execute("SET search_path TO marque_harbour")
            return conn
        placeholder = "%s"
    return RawLogbook("harbour-postgres" if store_dsn else "harbour-sqlite", home,
                      _HARBOUR_COLUMNS, connect=connect, placeholder=placeholder,
                      head_row=True,
                      text_fields=("kind", "actor", "subject", "body", "prev_hash", "hash"))


# -- verification --------------------------------------------------------------------------------


def chain_break(book: RawLogbook) -> int | None:
    """The chain walk alone (no head): the ``seq`` it names, or None if it holds."""
    if book.name == "pilot":
        logbook = Logbook(str(PilotHome(book.home).logbook_path))
        try:
            found = logbook.check()
        finally:
            logbook.close()
        return None if found is None else found.seq
    store = open_home_store(HarbourHome(book.home))
    try:
        entries = [e.to_dict() for e in store.logbook_entries(after=0, limit=10_000)]
    finally:
        store.close()
    found = verify_entries(entries)
    return None if found is None else found.seq


def home_break(book: RawLogbook, head: dict[str, Any] | None) -> int | None:
    """``verify_home`` (``marque logbook verify --home``), with or without a saved head."""
    try:
        checked = None if head is None else saved_head(book.home, head)
        verify_home(book.home, checked)
    except LogbookBroken as exc:
        return int(exc.detail["seq"])
    return None


def cli_break(book: RawLogbook, head_file: Path | None) -> tuple[int, int | None]:
    """The real CLI: (exit status, the break's seq)."""
    args = [str(MARQUE), "logbook", "verify", "--home", str(book.home), "--json"]
    if head_file is not None:
        args += ["--head", str(head_file)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=cli_env())
    try:
        body = json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, None
    found = body.get("break") or {}
    return proc.returncode, found.get("seq")


@scenario(12, "tamper", quick=240, full=1_000)
def run(ctx: RunContext, *, skip_apply: Callable[[Tamper], bool] | None = None
        ) -> ScenarioResult:
    """Row 12: every tamper named at its ``seq`` by every verification path, over each logbook.

    ``skip_apply`` (tests only) leaves chosen tampers unapplied while still
    asking verification about them, to show the checker reports the miss.
    """
    result = ScenarioResult("tamper", cases=0)
    started = time.monotonic()
    root = ctx.workdir / "tamper"
    books = [pilot_logbook(root / "pilot", ENTRIES),
             harbour_logbook(root, ENTRIES, ctx.rng)]
    database = None
    if ctx.pg_admin_dsn is not None:
        from support.pgcluster import create_database

        database, dsn = create_database(ctx.pg_admin_dsn)
        books.append(harbour_logbook(root, ENTRIES, ctx.rng, store_dsn=dsn))
    heads: dict[str, tuple[dict[str, Any], Path]] = {}
    for book in books:
        saved = head_of(book.home)
        path = root / f"{book.name}-head.json"
        path.write_text(json.dumps(saved, sort_keys=True) + "\n")
        heads[book.name] = (saved, path)
    tally: dict[str, dict[str, int]] = {}
    cli_runs = controls = 0
    try:
        for index in range(ctx.count):
            book = books[index % len(books)]
            kind = TAMPERS[(index // len(books)) % len(TAMPERS)]
            if index % CONTROL_EVERY == 0:
                controls += 1
                _control(result, book, heads[book.name][0])
            tamper, sql = plan(book, kind, ctx.rng)
            result.cases += 1
            ctx.history.record("invoke", op="tamper", logbook=book.name, kind=kind,
                               seq=tamper.seq, detail=tamper.detail)
            if skip_apply is None or not skip_apply(tamper):
                book.script(sql)
            use_cli = (index // len(books)) % CLI_ROUNDS == 0
            found = _verify(result, book, tamper, heads[book.name], cli=use_cli)
            cli_runs += use_cli
            ctx.history.record("ok", op="tamper", logbook=book.name, kind=kind,
                               seq=tamper.seq, found=found)
            per = tally.setdefault(book.name, {})
            per[kind] = per.get(kind, 0) + 1
            book.restore()
        for book in books:
            controls += 1
            _control(result, book, heads[book.name][0])
    finally:
        if database is not None and ctx.pg_admin_dsn is not None:
            from support.pgcluster import drop_database

            drop_database(ctx.pg_admin_dsn, database)
    result.figures.update({"by_logbook": tally, "controls_intact": controls,
                           "cli_runs": cli_runs, "entries_each": ENTRIES,
                           "seconds": round(time.monotonic() - started, 2)})
    return result


def _verify(result: ScenarioResult, book: RawLogbook, tamper: Tamper,
            head: tuple[dict[str, Any], Path], *, cli: bool) -> dict[str, Any]:
    """Ask every path about ``tamper``; a violation for each that names the wrong ``seq``."""
    found: dict[str, Any] = {}
    expected = {"chain": tamper.chain, "home": tamper.home, "with_head": tamper.with_head}
    try:
        found["chain"] = chain_break(book)
        found["home"] = home_break(book, None)
        found["with_head"] = home_break(book, head[0])
    except MarqueError as exc:
        result.violations.append(f"{book.name} {tamper.detail}: verification raised "
                                 f"{exc.code}: {exc.message}")
        return found
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
        result.violations.append(f"{book.name} {tamper.detail}: verification raised "
                                 f"{type(exc).__name__}: {exc}")
        return found
    if cli:
        status, seq = cli_break(book, None)
        found["cli"] = seq
        broken = LogbookBroken.exit_status
        if (status, seq) != ((broken, tamper.home) if tamper.home is not None else (0, None)):
            result.violations.append(f"{book.name} {tamper.detail}: `logbook verify` exited "
                                     f"{status} naming {seq}, expected {tamper.home}")
        status, seq = cli_break(book, head[1])
        found["cli_head"] = seq
        if (status, seq) != (broken, tamper.with_head):
            result.violations.append(f"{book.name} {tamper.detail}: `logbook verify --head` "
                                     f"exited {status} naming {seq}, expected "
                                     f"{tamper.with_head}")
    for path, want in expected.items():
        if found[path] != want:
            result.violations.append(f"{book.name} {tamper.detail}: {path} named "
                                     f"{found[path]}, expected {want}")
    return found


def _control(result: ScenarioResult, book: RawLogbook, head: dict[str, Any]) -> None:
    """The untampered logbook verifies intact by every path, and against its saved head."""
    try:
        found = (chain_break(book), home_break(book, None), home_break(book, head))
    except Exception as exc:  # noqa: BLE001
        result.violations.append(f"{book.name} control: {type(exc).__name__}: {exc}")
        return
    if found != (None, None, None):
        result.violations.append(f"{book.name} control: an untampered logbook was reported "
                                 f"broken at {found}")
    if book.head_row:
        entries = [dict(zip(book.columns, r, strict=True)) for r in book.rows]
        for entry in entries:
            entry["body"] = json.loads(entry["body"])
        if verify_against_head(entries, dict(zip(("seq", "hash", "at"), book.head or (),
                                                  strict=True))) is not None:
            result.violations.append(f"{book.name} control: the snapshot does not reach its "
                                     "head")
