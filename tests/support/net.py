"""Loopback ports for the services the tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now (for a service told where to listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
