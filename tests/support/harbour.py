"""Support for tests of the Harbourmaster as a service: real homes, real processes.

A :class:`Harbour` is a home made, and its principals added and revoked,
through ``marque.harbour.setup`` — the functions the ``marque harbour init`` and
``marque harbour principal`` commands are thin wrappers of (those commands are
tested as commands in ``test_harbour_cli.py``), called in process because a
stack may add half a dozen principals; its routing is set with ``marque
harbour routing set``. A :class:`HarbourServer` is a ``marque harbour serve``
process on a free loopback port; a :class:`PilotServe` is a ``marque pilot
serve`` process over any Pilot home (the one way the tests start one: here, in
the soak's worlds and in the browser tier); a :class:`PilotBank` is a Pilot
home (made by the functions the ``pilot init|trust|target add`` commands wrap)
serving a SQLite bank target and trusting a Harbourmaster's issuer key, run as
a :class:`PilotServe`. Nothing is mocked.

Every child gets the environment :func:`support.cli.cli_env` builds (``MARQUE``,
``TIMEOUT`` and ``cli_env`` are re-exported here for the tests that import them
from this module). This module imports no test helper but :mod:`support.cli`,
:mod:`support.net`, :mod:`support.wait` and :mod:`support.world`, so a test anywhere (``tests/pg``
included, as ``support.harbour``) can use it.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from support.cli import MARQUE, TIMEOUT, cli_env, run_cli
from support.net import free_port
from support.wait import wait_until
from support.world import SqliteBank


def cli_json(*args: Any, cwd: Path | None = None) -> dict[str, Any]:
    """Run ``marque ARGS --json``, which must succeed; its one JSON object."""
    done = run_cli(*args, "--json", cwd=cwd)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    body = json.loads(done.stdout)
    assert isinstance(body, dict), done.stdout
    return body


class Harbour:
    """A Harbourmaster's home, made as ``marque harbour init`` makes it (its core,
    ``init_harbour``, in process: the command is tested as a command in
    ``test_harbour_cli.py``), and its principals' tokens."""

    def __init__(self, home: Path, *, store: str | None = None,
                 routing: str | None = None) -> None:
        from marque.harbour.setup import init_harbour

        self.home = home
        made = init_harbour(home, store_dsn=store, routing_text=routing)
        self.harbour_id: str = made["harbour_id"]
        self.tokens: dict[str, str] = {"admin": made["admin_token"]}

    @property
    def issuer_key(self) -> Path:
        """The private issuer key (``pilot trust`` keeps only its public part)."""
        return self.home / "issuer.jwk"

    def add(self, name: str, *roles: str, key: Path | None = None) -> str:
        """Add a principal (``harbour principal add``'s core); returns (and remembers) its
        token."""
        from marque.harbour.setup import add_principal

        jwk = None if key is None else json.loads(key.read_text())
        token: str = add_principal(self.home, name, list(roles), public_jwk=jwk)["token"]
        self.tokens[name] = token
        return token

    def revoke(self, name: str) -> None:
        """Revoke a principal (its token is kept here, to show it no longer works)."""
        from marque.harbour.setup import revoke_principal

        revoke_principal(self.home, name)

    def set_routing(self, text: str) -> dict[str, Any]:
        """Adopt a routing config (TOML text) with ``marque harbour routing set``."""
        config = self.home / "routing-next.toml"
        config.write_text(text)
        return cli_json("harbour", "routing", "set", "--home", self.home, config)


class HarbourServer:
    """A ``marque harbour serve`` process on a free loopback port.

    Its stderr goes to a file beside its home (never a pipe nobody reads: a service that
    logged more than a pipe holds would stop mid-test); :meth:`logged` reads it."""

    def __init__(self, home: Path, *, port: int = 0, args: tuple[str, ...] = ()) -> None:
        self.log = Path(tempfile.mkstemp(prefix="harbour-serve-", suffix=".log",
                                         dir=Path(home).parent)[1])
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(
                [str(MARQUE), "harbour", "serve", "--home", str(home), "--listen",
                 f"127.0.0.1:{port}", "--json", *args],
                stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                text=True, env=cli_env())
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=TIMEOUT)
            raise AssertionError(self.logged() or "no output")
        self.ready: dict[str, Any] = json.loads(line)
        self.url: str = self.ready["url"]
        self.harbour_id: str = self.ready["harbour_id"]

    def logged(self) -> str:
        """What the service wrote to stderr so far."""
        return self.log.read_text(errors="replace")

    def call(self, method: str, path: str, token: str | None = None,
             **kwargs: Any) -> httpx.Response:
        """One HTTP call, with ``Authorization: Bearer token`` when a token is given."""
        headers = dict(kwargs.pop("headers", None) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.request(method, self.url + path, headers=headers, timeout=TIMEOUT,
                             **kwargs)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop the process (SIGTERM: gracefully); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        status = self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return status


class DiedAtStart(RuntimeError):
    """``pilot serve`` exited (or closed its stdout) before it said it listens: a crash
    point in start-up recovery, or a home it refuses; ``status`` is its exit status."""

    def __init__(self, status: int | None, log: str) -> None:
        super().__init__(f"pilot serve exited {status} before listening: {log[-2000:]}")
        self.status = status


class PilotServe:
    """``marque pilot serve --home HOME --listen LISTEN --json`` as a child process.

    ``listen`` is ``host:port``; port 0 lets the OS choose, and :meth:`start` reads the
    URL from the service's ready line. ``env`` is added to :func:`cli_env` (a crash point,
    faketime). stderr goes to ``log`` (by default a fresh file in ``cwd`` or beside the
    home), never to a pipe nobody drains. :meth:`start` returns the ready line once the
    service listens, or raises :class:`DiedAtStart`.
    """

    #: Seconds a start may take before the service is taken for dead.
    START_SECONDS = 30.0

    def __init__(self, home: Path, *, listen: str = "127.0.0.1:0",
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 workers: int | None = None, log: Path | None = None) -> None:
        self.home = home
        self.listen = listen
        self.env = env
        self.cwd = cwd
        self.workers = workers
        where = cwd if cwd is not None else home.parent
        self.log = log or where / f"pilot-serve-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}
        # A fixed port's URL is known before the start (a joined Pilot's is).
        self.url = "" if listen.endswith(":0") else f"http://{listen}"

    def start(self) -> dict[str, Any]:
        """Run it; its ready line (``url``, ``pilot_id``, ``incarnation``...)."""
        args = [str(MARQUE), "pilot", "serve", "--home", str(self.home), "--listen",
                self.listen, "--json"]
        if self.workers:
            args += ["--workers", str(self.workers)]
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr,
                                         stdin=subprocess.DEVNULL, text=True,
                                         env=cli_env(self.env), cwd=self.cwd)
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.START_SECONDS)
        if not got or not got[0]:
            try:  # it closed its stdout: it is dying, or dead; its status says how
                status: int | None = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                status = None
            self.kill()
            raise DiedAtStart(status, self.stderr())
        self.ready = json.loads(got[0])
        if "url" not in self.ready:  # an error object: it refused to serve
            self.kill()
            raise DiedAtStart(self.proc.returncode, got[0] + self.stderr())
        self.url = str(self.ready["url"])
        return self.ready

    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        return self.log.read_text() if self.log.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` if it still runs."""
        if self.proc is not None and self.alive:
            self.proc.send_signal(sig)

    def wait_dead(self, timeout: float = 30.0) -> int | None:
        """Its exit status once it has died (a crash point), None if it is still up."""
        assert self.proc is not None
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._close()
        return status

    def kill(self) -> None:
        """SIGKILL (a power cut) and reap it."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait(30)
        self._close()

    def stop(self) -> int:
        """SIGTERM, an orderly stop (SIGCONT first, for one left SIGSTOPped); its exit
        status. One that does not stop within a minute is SIGKILLed."""
        if self.proc is None:
            return 0
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            status = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            status = -signal.SIGKILL
        self._close()
        return status

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def new_public_key(path: Path) -> Path:
    """Write a fresh holder's public JWK to ``path`` (its private half is thrown away): a
    key of its own for a principal that never executes — one key is one principal."""
    from marque.token import new_key, public_jwk

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(public_jwk(new_key())))
    return path


class PilotBank:
    """A Pilot home serving a SQLite ``bank`` (accounts 1→100, 2→100), trusting ``harbour``
    (unless ``trust=False``: a Pilot that is to join it, which pins its keys).

    ``holder_pub`` is a requester's public key (give it to ``Harbour.add``);
    ``start()`` runs ``marque pilot serve`` (a :class:`PilotServe`, kept as ``pilot``)
    and returns its URL.
    """

    def __init__(self, root: Path, harbour: Harbour, *, pilot_id: str = "p1",
                 trust: bool = True) -> None:
        self.root = root
        self.pilot_id = pilot_id
        self.home = root / "pilot"
        self.bank = root / "bank.db"
        self.holder_key = root / "holder.jwk"
        self.holder_pub = root / "holder.pub.jwk"
        root.mkdir(parents=True, exist_ok=True)
        SqliteBank(self.bank).create([1, 2])  # both at 100
        # What `keys new`, `pilot init`, `pilot trust` and `pilot target add` run, in
        # process: those commands are tested as commands (tests/e2e/test_home.py, the e2e
        # world template), and a stack needs its Pilot home in a few milliseconds.
        from marque.cli.common import write_private
        from marque.pilot.setup import add_target, init_home, trust_issuer
        from marque.token import new_key, public_jwk

        holder = new_key()
        write_private(self.holder_key, holder)
        self.holder_pub.write_text(json.dumps(public_jwk(holder)))
        self.incarnation: str = init_home(self.home, pilot_id)["incarnation"]
        if trust:
            trust_issuer(self.home, json.loads(harbour.issuer_key.read_text()))
        add_target(self.home, "bank", f"sqlite:///{self.bank.resolve()}")
        self.pilot: PilotServe | None = None
        self.url = ""

    def start(self, *, listen: str = "127.0.0.1:0", env: dict[str, str] | None = None) -> str:
        """Run ``marque pilot serve`` (on a free loopback port, or at ``listen``); its URL."""
        self.pilot = PilotServe(self.home, listen=listen, env=env, cwd=self.root)
        self.pilot.start()
        self.url = self.pilot.url
        return self.url

    def registration(self) -> dict[str, Any]:
        """The body of ``POST /v1/pilots`` for this Pilot."""
        return {"pilot_id": self.pilot_id, "url": self.url, "incarnation": self.incarnation,
                "targets": {"bank": {"dialect": "sqlite"}}}

    def stop(self) -> None:
        """Stop ``pilot serve`` (SIGTERM), if it runs."""
        if self.pilot is not None:
            self.pilot.stop()

    def balances(self) -> dict[int, int]:
        """The bank's balances, read directly."""
        return SqliteBank(self.bank).balances()


def routing_toml(*entries: dict[str, Any]) -> str:
    """A routing config (``marque-routing/0.1``, TOML) of ``entries`` in order; each entry's
    ``principal``, ``target`` and ``resource`` are ``"*"`` unless it says otherwise."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(item) for item in v) + "]"
        return json.dumps(v)  # a string (TOML's basic strings escape as JSON does) or a number

    lines = ['version = "marque-routing/0.1"']
    for entry in entries:
        lines += ["", "[[entry]]"]
        fields = {"principal": "*", "target": "*", "resource": "*", **entry}
        lines += [f"{key} = {value(v)}" for key, v in fields.items()]
    return "\n".join(lines) + "\n"


#: Routing entries the tests' configs are made of.
READS_ALLOWED: dict[str, Any] = {"operation": ["read"], "outcome": "allow"}
WRITES_DENIED: dict[str, Any] = {"operation": ["write"], "outcome": "deny"}


def writes_delegated(approvals: int, **extra: Any) -> dict[str, Any]:
    """Writes, DDL and anything else delegated to ``approvals`` approvers."""
    return {"operation": ["write", "ddl", "other"], "outcome": "delegate",
            "approvals": approvals, **extra}


READ = "SELECT balance FROM accounts WHERE id = 1"
DEBIT = "UPDATE accounts SET balance = balance - 10 WHERE id = 1"


def request_body(sql: str, *, pilot_id: str = "p1", request_id: str | None = None,
                 max_rows: int = 1, ttl_seconds: int = 600) -> dict[str, Any]:
    """A ``POST /v1/requests`` body for one statement against ``bank``."""
    body: dict[str, Any] = {
        "pilot_id": pilot_id, "target": "bank",
        "change": {"statements": [{"sql": sql, "params": []}]},
        "budget": {"executions": 1, "max_rows": max_rows},
        "ttl_seconds": ttl_seconds, "reason": "a test",
    }
    if request_id is not None:
        body["request_id"] = request_id
    return body


class HarbourWorld:
    """A Harbourmaster and a :class:`PilotBank` joined to it: the stack the Harbourmaster's
    end-to-end tests share.

    Its home under ``root / "harbour"`` (``routing``: a config of its own, else the
    bootstrap profile) is served by a :class:`HarbourServer` (``harbour_args`` added to
    ``harbour serve``); the Pilot's home under ``root / bank_dir`` (its bank holds
    accounts 1 and 2 → 100, and 3 → 100 when ``third_account``, then ``bank_sql``) joins
    it with ``marque pilot join`` at a free loopback port (``port``) and, when ``serve``,
    serves there at once. Principals: a requester ``alice`` holding the bank's key, then
    ``principals`` (``(name, role, ...)``; a name in ``keyed`` gets a public key of its
    own), then the Pilot's own ``p1``; :meth:`before_join` runs before them.
    ``trust=False`` leaves the issuer key for the join to pin, as a Pilot joining in
    production does.
    """

    def __init__(self, root: Path, *, routing: str | None = None, bank_dir: str = "pilotbank",
                 trust: bool = True, third_account: bool = True, bank_sql: tuple[str, ...] = (),
                 principals: tuple[tuple[str, ...], ...] = (("bob", "approver"),),
                 keyed: frozenset[str] = frozenset(), harbour_args: tuple[str, ...] = (),
                 serve: bool = False) -> None:
        self.root = root
        self.harbour = Harbour(root / "harbour", routing=routing)
        self.bank = PilotBank(root / bank_dir, self.harbour, trust=trust)
        conn = sqlite3.connect(self.bank.bank)
        with conn:
            if third_account:
                conn.execute("INSERT INTO accounts VALUES (3, 100)")
            for sql in bank_sql:
                conn.execute(sql)
        conn.close()
        self.before_join()
        self.alice = self.harbour.add("alice", "requester", key=self.bank.holder_pub)
        for name, *roles in principals:
            key = new_public_key(root / f"{name}.pub.jwk") if name in keyed else None
            self.harbour.add(name, *roles, key=key)
        pilot_token = self.harbour.add("p1", "pilot")
        self.server = HarbourServer(self.harbour.home, args=harbour_args)
        self.port = free_port()
        self.pilot_url = f"http://127.0.0.1:{self.port}"
        try:
            cli_json("pilot", "join", "--home", self.bank.home, "--harbour", self.server.url,
                     "--token", pilot_token, "--url", self.pilot_url)
            if serve:
                self.bank.start(listen=f"127.0.0.1:{self.port}")
        except BaseException:
            self.stop()
            raise

    def before_join(self) -> None:
        """What a subclass sets up in the Pilot's home (more targets, row keys) once its bank
        is filled, before the principals are added and it joins; nothing here."""

    @property
    def bob(self) -> str:
        """The approver's token (the default ``principals``)."""
        return self.harbour.tokens["bob"]

    def call(self, method: str, path: str, token: str | None, **kwargs: Any) -> httpx.Response:
        """One HTTP call to the Harbourmaster, as ``token``."""
        return self.server.call(method, path, token, **kwargs)

    def stop(self) -> None:
        """Stop ``pilot serve`` (if it runs) and ``harbour serve``."""
        self.bank.stop()
        self.server.stop()


def execute_marque(pilot_url: str, holder_key: Path, marque: str,
                   nonce: str) -> dict[str, Any]:
    """POST the marque (with a proof by the key in ``holder_key``) to the Pilot's
    /v1/executions, which must answer 200; the outcome line."""
    from marque.token import make_proof

    holder = json.loads(holder_key.read_text())
    proof = make_proof(holder, marque, nonce=nonce, pilot_id="p1")
    with httpx.stream("POST", f"{pilot_url}/v1/executions", timeout=60,
                      json={"marque": marque, "nonce": nonce, "proof": proof}) as streamed:
        assert streamed.status_code == 200, streamed.read()
        events = [json.loads(line) for line in streamed.iter_lines() if line.strip()]
    outcome: dict[str, Any] = events[-1]["outcome"]
    return outcome


def wait_for_request(call: Callable[..., httpx.Response], rq: str, token: str,
                     ready: Callable[[dict[str, Any]], Any],
                     seconds: float) -> dict[str, Any]:
    """``GET /v1/requests/{rq}`` (through ``call``, as ``token``) every 0.2 s until
    ``ready`` says yes or ``seconds`` have passed; the last body shown."""
    seen: list[dict[str, Any]] = []

    def shown_ready() -> Any:
        seen.append(call("GET", f"/v1/requests/{rq}", token).json())
        return ready(seen[-1])

    wait_until(shown_ready, timeout=seconds, step=0.2)
    return seen[-1]


#: An Effect Set that tops up three of `bank`'s accounts (1 and 2 exist; tests add 3).
TOPUP_DECLARATION = {"version": "marque-effect-set/0.1", "members": [
    {"effect_id": "topup", "kind": "update", "table": "accounts", "key": ["id"],
     "failure_policy": "halt", "max_items": 10}]}
TOPUP_ROWS = [{"id": 1, "balance": 150}, {"id": 2, "balance": 250}, {"id": 3, "balance": 350}]


def effect_body(rows: list[dict[str, Any]], *, request_id: str,
                declaration: dict[str, Any] | None = None,
                inputs: dict[str, Any] | None = None, max_rows: int = 10,
                reason: str = "top up three accounts") -> dict[str, Any]:
    """A POST /v1/requests body for an Effect Set against `bank` (by default a
    :data:`TOPUP_DECLARATION` of ``rows``)."""
    declared = declaration or TOPUP_DECLARATION
    if inputs is None:
        columns = sorted(rows[0]) if rows else ["balance", "id"]
        inputs = {"topup": {"version": "marque-effect-input/0.1", "columns": columns,
                            "rows": rows}}
    return {"request_id": request_id, "pilot_id": "p1", "target": "bank",
            "change": {"effect_set": {"declaration": declared, "inputs": inputs}},
            "budget": {"executions": 1, "max_rows": max_rows}, "ttl_seconds": 600,
            "reason": reason}
