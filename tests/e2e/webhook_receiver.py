"""A webhook receiver for tests: a real HTTP server on loopback that checks every delivery's
Standard Webhooks signature from the specification itself (the standard library's hmac,
not the package Marque signs with) and answers as its script says."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: How far a delivery's timestamp may be from now (the specification's suggestion).
TOLERANCE_SECONDS = 300


def verify_signature(secret: str, message_id: str, timestamp: str, signature: str,
                     body: bytes, *, now: float | None = None) -> bool:
    """Whether ``signature`` (a ``webhook-signature`` header: space-separated
    ``v1,<base64>``) is HMAC-SHA256, keyed with the base64 secret after ``whsec_``, over
    ``id.timestamp.body``, with ``timestamp`` within the tolerance of ``now``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = message_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    fresh = abs((time.time() if now is None else now) - int(timestamp)) <= TOLERANCE_SECONDS
    offered = [part.split(",", 1) for part in signature.split(" ") if "," in part]
    return fresh and any(version == "v1" and hmac.compare_digest(value, expected)
                         for version, value in offered)


@dataclass(frozen=True)
class Received:
    """One delivery attempt as the receiver saw it, and how it answered."""

    path: str
    message_id: str
    timestamp: str
    body: bytes
    signature: str
    valid: bool
    answered: int

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Listens on ``127.0.0.1:port`` once started; ``secrets`` maps a path to its endpoint's
    secret. The first ``fail_first`` deliveries are recorded and then answered 500 (a
    receiver that took the event but failed to say so: Marque must send it again), every
    later one 200. Each answer waits ``hold_seconds`` first; ``overlaps`` counts the
    deliveries that arrived while another copy of the same event was still being held."""

    def __init__(self, port: int, secrets: dict[str, str], *, fail_first: int = 0,
                 hold_seconds: float = 0.0) -> None:
        self.port = port
        self.secrets = dict(secrets)
        self.fail_first = fail_first
        self.hold_seconds = hold_seconds
        self.overlaps = 0
        self._holding: dict[str, int] = {}
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                receiver._take(self.path, dict(self.headers.items()), body, self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, path: str, headers: dict[str, str], body: bytes,
              handler: BaseHTTPRequestHandler) -> None:
        lower = {k.lower(): v for k, v in headers.items()}
        message_id = lower.get("webhook-id", "")
        timestamp = lower.get("webhook-timestamp", "0")
        secret = self.secrets.get(path)
        valid = secret is not None and verify_signature(
            secret, message_id, timestamp, lower.get("webhook-signature", ""), body)
        with self._lock:
            status = 500 if len(self.received) < self.fail_first else 200
            if not valid:
                status = 400
            self.received.append(Received(path, message_id, timestamp, body,
                                          lower.get("webhook-signature", ""), valid, status))
            if self._holding.get(message_id):
                self.overlaps += 1
            self._holding[message_id] = self._holding.get(message_id, 0) + 1
        time.sleep(self.hold_seconds)
        with self._lock:
            self._holding[message_id] -= 1
        handler.send_response(status)
        handler.send_header("content-length", "0")
        handler.end_headers()

    def accepted(self, path: str) -> list[Received]:
        """The deliveries to ``path`` answered 200."""
        with self._lock:
            return [r for r in self.received if r.path == path and r.answered == 200]

    def all(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
