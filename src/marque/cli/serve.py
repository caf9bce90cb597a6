"""``marque pilot serve``: the Pilot's HTTP service (DESIGN §10) on uvicorn."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import click

from marque.cli.common import emit_json, err, guarded, home_option, json_option, literal
from marque.cli.pilot import pilot
from marque.errors import InvalidInput

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


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus re-raising the stop signal after a graceful shutdown:
        the Pilot must still be closed (reports flushed, ledger released) and the
        process then exits 0, as an orderly stop."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    return Server


@pilot.command("serve")
@home_option
@click.option("--listen", default="127.0.0.1:8750", show_default=True, metavar="HOST:PORT",
              help="Where to listen; port 0 picks a free port (printed once listening).")
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None,
              help="PEM certificate: serve HTTPS (with --tls-key).")
@click.option("--tls-key", type=click.Path(path_type=Path), default=None,
              help="PEM private key of --tls-cert.")
@json_option
@guarded
def pilot_serve(home: Path, listen: str, tls_cert: Path | None, tls_key: Path | None,
                as_json: bool) -> None:
    """Serve this Pilot over HTTP until SIGTERM or SIGINT.

    Once listening it prints {url, pilot_id, incarnation} (one JSON line with
    --json). SIGTERM stops taking requests, lets running executions finish
    and records their outcomes, then exits.
    """
    import uvicorn

    from marque.pilot import PilotHome, open_pilot
    from marque.pilot.http import PilotService
    from marque.pilot.reach import check_reachable

    host, port = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("--tls-cert and --tls-key go together")
    sock = _bind(host, port)
    pilot_home = PilotHome(home)
    try:
        config = pilot_home.load()
        dsns = {name: pilot_home.resolve(dsn) for name, dsn in config.targets.items()}
        running = open_pilot(home, background=True)
    except BaseException:
        sock.close()
        raise

    def reachable(name: str) -> bool:
        check_reachable(name, dsns[name])
        return True

    service = PilotService(running, reachable=reachable, previews=config.previews)
    scheme = "https" if tls_cert else "http"
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown_host}:{bound_port}"
    if not _is_loopback(host) and tls_cert is None:
        err.say(f"[bold yellow]warning[/]: listening on {literal(host)} without TLS: marques, "
                "proofs and outcomes cross the network in clear text (use --tls-cert/--tls-key)")
    server_config = uvicorn.Config(
        service.app, log_level="warning", lifespan="off", access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
    )
    server = _server_class()(server_config)
    ready = {"url": url, "pilot_id": running.pilot_id, "incarnation": running.incarnation}
    if as_json:
        emit_json(ready)
    else:
        err.say(f"Pilot {literal(running.pilot_id)} ({literal(running.incarnation)}) "
                f"serving on {literal(url)}")
    try:
        server.run(sockets=[sock])
    finally:
        service.close()  # running executions finish and record their outcomes
        running.close()
        sock.close()
