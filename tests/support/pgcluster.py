"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb + pg_ctl.

Runs the server as the ``postgres`` OS user when we are root (PostgreSQL
refuses to run as root), on a free loopback port, in a temporary directory
that is removed on stop. Faults are real: :meth:`crash` is
``pg_ctl stop -m immediate``.

``initdb`` runs once per process: every cluster's data directory is a copy of
that pristine one (``cp -a``: the same files initdb would write, a second
instead of a few), with its own settings appended to its own
``postgresql.conf``. The template is removed when the process exits.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from support.net import free_port


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding initdb, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit()
        else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


#: A pristine initdb data directory per server bindir, made by the first cluster.
_TEMPLATES: dict[Path, Path] = {}


class PgCluster:
    """One PostgreSQL cluster in a temporary directory."""

    def __init__(self, *, max_connections: int = 200, fsync: bool = True) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(
                "PostgreSQL server binaries not found (apt-get install postgresql); "
                "or set MARQUE_TEST_PG_DSN"
            )
        self.bindir = bindir
        self.max_connections = max_connections
        #: A Pilot refuses a ledger on a server without fsync (``ledger_not_durable``); a
        #: test that wants one says so. fsync costs ~60 µs a commit on this disk.
        self.fsync = fsync
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="marque-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _cmd(self, *args: str) -> list[str]:
        if self._as_postgres:
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def _run(self, *args: str) -> None:
        subprocess.run(self._cmd(*args), check=True, capture_output=True, timeout=120)

    def _template(self) -> Path:
        """This process's pristine data directory for ``bindir`` (initdb'd on first use)."""
        found = _TEMPLATES.get(self.bindir)
        if found is not None and found.is_dir():
            return found
        root = Path(tempfile.mkdtemp(prefix="marque-pg-template-"))
        atexit.register(shutil.rmtree, root, True)
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(root / "data"), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-sync")
        _TEMPLATES[self.bindir] = root / "data"
        return root / "data"

    def init(self) -> PgCluster:
        self._run("cp", "-a", str(self._template()), str(self.data))
        conf = self.data / "postgresql.conf"
        extra = (
            f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.root}'\n"
            f"max_connections = {self.max_connections}\n"
            # Process crashes are what we inject; the OS page cache survives them, so
            # torn pages cannot happen. fsync stays on (see __init__) unless asked.
            f"fsync = {'on' if self.fsync else 'off'}\nfull_page_writes = off\n"
            "shared_buffers = 64MB\n"
        )
        with open(conf, "a", encoding="utf-8") as handle:
            handle.write(extra)
        return self

    def start(self) -> PgCluster:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                      "stop"),
            capture_output=True, timeout=120,
        )

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: no checkpoint, crash recovery on next start."""
        self.stop("immediate")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = "postgres") -> str:
        return (f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"
                "?sslmode=disable&gssencmode=disable")


def create_database(admin_dsn: str) -> tuple[str, str]:
    """A fresh database on the server of ``admin_dsn``: (name, dsn)."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = admin_dsn.partition("?")
    dsn = base.rsplit("/", 1)[0] + "/" + name + (("?" + query) if query else "")
    return name, dsn


def drop_database(admin_dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
