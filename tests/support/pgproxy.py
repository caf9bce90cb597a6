"""A TCP proxy in front of PostgreSQL that can lose a COMMIT, for real.

It forwards bytes both ways and reads the frontend protocol just enough to
recognise, on a connection that has inserted a Marque stamp — a nonce's
(``marque.stamps``) or an Effect Set row's (``marque.row_stamps``), sent as
text or through a prepared statement whose Parse carried it — the
simple-query message that ends with ``COMMIT``. When armed it then either

* ``drop_before_commit``: closes both sides without forwarding COMMIT — the
  server sees the client vanish mid-transaction and rolls back; or
* ``drop_after_commit``: forwards COMMIT, lets the server answer, swallows the
  answer and closes the client side — the commit happened, the client never
  hears of it; or
* ``drop_during_reply``: forwards COMMIT and then only the first ``reply_bytes``
  bytes of the server's answer (cut inside a message or between two), then
  closes the client side — the client hears part of the answer, never all of it.

Each arming fires once, at the first stamped COMMIT after the ``skip`` it was
armed with (an Effect Set commits once per row: ``skip=1`` cuts the second
row's). Connect with ``sslmode=disable&gssencmode=disable`` so
the first packet is the plain startup message.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

STAMP_INSERT = b"INSERT INTO marque.stamps"
ROW_STAMP_INSERT = b"INSERT INTO marque.row_stamps"
STAMP_INSERTS = (STAMP_INSERT, ROW_STAMP_INSERT)
MODES = ("drop_before_commit", "drop_after_commit", "drop_during_reply")


class PgProxy:
    """A loopback proxy to one PostgreSQL server."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._armed: str | None = None
        self._reply_bytes = 1
        self._skip = 0
        self._lock = threading.Lock()
        self.fired = threading.Event()
        self._stopping = False
        #: While set, every connection is cut and new ones are closed at once.
        self._severed = threading.Event()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @classmethod
    def for_dsn(cls, dsn: str) -> tuple[PgProxy, str]:
        """A proxy for the server of ``dsn`` and the DSN that goes through it."""
        parts = urlsplit(dsn)
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        netloc = parts.netloc.rsplit("@", 1)
        user = (netloc[0] + "@") if len(netloc) == 2 else ""
        return proxy, urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))

    def arm(self, mode: str, *, reply_bytes: int = 1, skip: int = 0) -> None:
        """Make the next stamped COMMIT go wrong the way ``mode`` says (``reply_bytes``:
        how much of the answer ``drop_during_reply`` lets through, at least 1; ``skip``:
        how many stamped COMMITs to let through untouched first)."""
        assert mode in MODES, mode
        assert reply_bytes >= 1 and skip >= 0
        with self._lock:
            self._armed = mode
            self._reply_bytes = reply_bytes
            self._skip = skip
            self.fired.clear()

    def disarm(self) -> None:
        """Forget an arming that has not fired (the COMMIT it waited for never came)."""
        with self._lock:
            self._armed = None

    def _take(self) -> tuple[str | None, int]:
        with self._lock:
            if self._armed is not None and self._skip > 0:
                self._skip -= 1
                return None, self._reply_bytes
            mode, self._armed = self._armed, None
            return mode, self._reply_bytes

    def sever(self) -> None:
        """Cut every connection through the proxy now, and refuse new ones until restored:
        the network between a client and its server is gone, the server is not."""
        self._severed.set()
        self.cut()

    def cut(self) -> None:
        """Cut every connection through the proxy now (both sides), and let new ones through:
        a client loses its connection while its server goes on with what it was sent."""
        with self._lock:
            doomed = list(self._open)
        for sock in doomed:
            close_socket(sock)

    def restore(self) -> None:
        """Let connections through again."""
        self._severed.clear()

    def close(self) -> None:
        self._stopping = True
        self._listener.close()

    # -- plumbing -----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._severed.is_set():
                close_socket(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            threading.Thread(target=self._serve, args=(client, server), daemon=True).start()

    def _serve(self, client: socket.socket, server: socket.socket) -> None:
        muted = threading.Event()
        swallowed = threading.Event()
        done = threading.Event()
        #: While not None: how many more bytes of the answer reach the client (then cut).
        allowance: list[int | None] = [None]

        def downstream() -> None:
            try:
                while not done.is_set():
                    data = server.recv(65536)
                    if not data:
                        break
                    left = allowance[0]
                    if left is not None:
                        client.sendall(data[:left])
                        allowance[0] = left - min(left, len(data))
                        if allowance[0] == 0:
                            swallowed.set()
                            break  # the rest of the answer never arrives
                    elif muted.is_set():
                        swallowed.set()
                    else:
                        client.sendall(data)
            except OSError:
                pass
            finally:
                done.set()
                close_socket(client)

        threading.Thread(target=downstream, daemon=True).start()
        try:
            self._upstream(client, server, muted, swallowed, done, allowance)
        except (OSError, ValueError):  # ValueError: the other side closed it mid-select
            pass
        finally:
            done.set()
            close_socket(client)
            close_socket(server)
            with self._lock:
                self._open.difference_update((client, server))

    def _upstream(self, client: socket.socket, server: socket.socket,
                  muted: threading.Event, swallowed: threading.Event,
                  done: threading.Event, allowance: list[int | None]) -> None:
        head = _recv_exact(client, 4)
        if head is None:
            return
        (length,) = struct.unpack("!I", head)
        body = _recv_exact(client, length - 4)
        if body is None:
            return
        server.sendall(head + body)  # the startup message has no type byte
        stamped = False
        #: Prepared statements (by name) whose Parse message inserted a stamp.
        stamp_statements: set[bytes] = set()
        while not done.is_set():
            ready, _, _ = select.select([client], [], [], 0.2)
            if not ready:
                continue
            header = _recv_exact(client, 5)
            if header is None:
                return
            kind = header[:1]
            (length,) = struct.unpack("!I", header[1:])
            payload = _recv_exact(client, length - 4)
            if payload is None:
                return
            if any(insert in payload for insert in STAMP_INSERTS):
                stamped = True
                if kind == b"P":  # Parse: statement name, then the query text
                    name = payload.split(b"\x00", 1)[0]
                    if name:
                        stamp_statements.add(name)
            elif kind == b"B" and stamp_statements:  # Bind: portal, then statement name
                fields = payload.split(b"\x00", 2)
                if len(fields) > 1 and fields[1] in stamp_statements:
                    stamped = True
            if stamped and kind == b"Q" and _ends_with_commit(payload):
                stamped = False
                mode, reply_bytes = self._take()
                if mode == "drop_before_commit":
                    self.fired.set()
                    return  # closes both sides; COMMIT never reaches the server
                if mode == "drop_after_commit":
                    muted.set()
                    server.sendall(header + payload)
                    # Let the server finish the commit and answer into the void.
                    swallowed.wait(5)
                    self.fired.set()
                    return
                if mode == "drop_during_reply":
                    allowance[0] = reply_bytes
                    server.sendall(header + payload)
                    swallowed.wait(5)
                    self.fired.set()
                    return
            server.sendall(header + payload)


def _ends_with_commit(payload: bytes) -> bool:
    """A simple query whose last statement is COMMIT (alone or after others)."""
    text = payload.rstrip(b"\x00").strip().rstrip(b";").strip().upper()
    return text == b"COMMIT" or text.endswith((b"; COMMIT", b";COMMIT"))


def _recv_exact(sock: socket.socket, count: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        data = sock.recv(count - len(chunks))
        if not data:
            return None
        chunks.extend(data)
    return bytes(chunks)


def close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


#: The ``pg_proxy`` fixture (tests/conftest.py): ``pg_proxy(dsn)`` → a proxy in front of
#: ``dsn``'s server and the DSN through it.
PgProxyFactory = Callable[[str], tuple[PgProxy, str]]
