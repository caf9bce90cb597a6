"""``marque pilot serve``: the Pilot's HTTP service (DESIGN §10) on uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from marque.cli.common import (
    CommandExit,
    emit_json,
    err,
    fail,
    guarded,
    home_option,
    json_option,
    literal,
)
from marque.errors import InvalidInput, MarqueError

#: How long SIGTERM waits for in-flight requests before the server stops taking part.
GRACEFUL_SECONDS = 30


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8750), got {listen!r}")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: a streamed response is many small writes, and
    # with Nagle each would wait for the client's delayed ACK (~40 ms a request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    return sock


class _CoalescingTransport:
    """A connection's transport whose writes made in one turn of the event loop leave in
    one ``send``: uvicorn writes a response's status line and headers, then each body
    chunk, each with a system call of its own (and with ``TCP_NODELAY`` a segment of its
    own, each waking the client). Everything else is the real transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()  # what was written before the close still goes out, in order
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _protocol_class() -> type:
    """uvicorn's httptools protocol on a :class:`_CoalescingTransport`."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(
                _CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    return Protocol


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus re-raising the stop signal after a graceful shutdown:
        the Pilot must still be closed (reports flushed, ledger released) and the
        process then exits 0, as an orderly stop.

        ``on_started`` (if given) runs once the server listens *and* its signal handlers
        are in place: a caller told "listening" before then could stop it with a SIGTERM
        that the default action, not the graceful shutdown, would answer."""

        def __init__(self, config: Any, on_started: Callable[[], None] | None = None) -> None:
            super().__init__(config)
            self.on_started = on_started

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.on_started is not None and self.started:
                self.on_started()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    return Server


@click.command("serve")
@home_option
@click.option("--listen", default="127.0.0.1:8750", show_default=True, metavar="HOST:PORT",
              help="Where to listen; port 0 picks a free port (printed once listening).")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Worker processes sharing the socket, each with its own Pilot.")
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None,
              help="PEM certificate: serve HTTPS (with --tls-key).")
@click.option("--tls-key", type=click.Path(path_type=Path), default=None,
              help="PEM private key of --tls-cert.")
@json_option
@guarded
def pilot_serve(home: Path, listen: str, workers: int, tls_cert: Path | None,
                tls_key: Path | None, as_json: bool) -> None:
    """Serve this Pilot over HTTP until SIGTERM or SIGINT.

    Once listening it prints {url, pilot_id, incarnation} (one JSON line with
    --json). SIGTERM stops taking requests, lets running executions finish
    and records their outcomes, then exits.
    """
    from marque.pilot import PilotHome

    host, port = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("--tls-cert and --tls-key go together")
    # Checked before anything is bound or forked: a bad home is one clear error.
    PilotHome(home).load()
    sock = _bind(host, port)
    scheme = "https" if tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown_host}:{sock.getsockname()[1]}"
    if not _is_loopback(host) and tls_cert is None:
        err.say(f"[bold yellow]warning[/]: listening on {literal(host)} without TLS: marques, "
                "proofs and outcomes cross the network in clear text (use --tls-cert/--tls-key)")

    def announce(info: dict[str, Any]) -> None:
        ready = {"url": url, **info}
        if as_json:
            emit_json(ready)
        else:
            err.say(f"Pilot {literal(info['pilot_id'])} ({literal(info['incarnation'])}) "
                    f"serving on {literal(url)}"
                    + (f" with {workers} workers" if workers > 1 else ""))
        sys.stdout.flush()

    def worker(ready: Callable[[dict[str, Any]], None]) -> int:
        try:
            _serve(home, sock, tls_cert, tls_key, ready)
        except MarqueError as exc:  # said by the worker itself: a forked one has no caller
            with contextlib.suppress(CommandExit):
                fail(exc, as_json)
            return exc.exit_status
        return 0

    try:
        if workers == 1:
            # A start refused (ledger_not_durable, home_mismatch…) exits with its status;
            # it used to exit 0 after printing the error (found by the soak, row 16).
            status = worker(announce)
        else:
            from marque.cli.workers import supervise

            status = supervise(workers, worker, announce,
                               lambda text: err.say(f"[bold yellow]warning[/]: {text}"))
    finally:
        sock.close()
    if status:
        raise SystemExit(status)


def _serve(home: Path, sock: socket.socket, tls_cert: Path | None, tls_key: Path | None,
           ready: Callable[[dict[str, Any]], None]) -> None:
    """One worker: open the Pilot, serve on ``sock`` until told to stop, close it."""
    import uvicorn

    from marque.pilot import PilotHome
    from marque.pilot.harbour_link import open_linked_pilot
    from marque.pilot.http import PilotService
    from marque.pilot.reach import check_reachable

    pilot_home = PilotHome(home)
    config = pilot_home.load()
    dsns = {name: pilot_home.resolve(dsn) for name, dsn in config.targets.items()}
    # With a Harbourmaster joined: reports go there too, and the Pilot registers now and
    # every minute (its failures are warnings on stderr, never fatal).
    running = open_linked_pilot(home)

    def reachable(name: str) -> bool:
        check_reachable(name, dsns[name])
        return True

    service = PilotService(running, reachable=reachable, previews=config.previews)
    server_config = uvicorn.Config(
        service.app, log_level="warning", lifespan="off", access_log=False,
        http=_protocol_class(), ws="none",
        # No "server: uvicorn" on every answer: a header each side parses per request,
        # and nothing a caller needs (Date stays: HTTP asks an origin server for it).
        server_header=False,
        # The Pilot reads no client address, so none is taken from X-Forwarded-* headers:
        # nothing to spoof, and no middleware wrapped around every request.
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
    )
    server = _server_class()(server_config, on_started=lambda: ready(
        {"pilot_id": running.pilot_id, "incarnation": running.incarnation}))
    try:
        server.run(sockets=[sock])
    finally:
        service.close()  # running executions finish and record their outcomes
        running.close()
