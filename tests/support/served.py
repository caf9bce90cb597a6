"""An ASGI app served by uvicorn in a thread of the test process, on a loopback port."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn

from support.wait import wait_until


class Served:
    """``app`` on uvicorn in a daemon thread, listening on a port bound here (so no other
    process can take it between choosing and serving); :attr:`url` is its address."""

    def __init__(self, app: Any) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started or not self._thread.is_alive(), timeout=10,
                   step=0.01)
        assert self._server.started, "the app's server did not start"

    def stop(self) -> None:
        """Ask the server to finish and wait (up to 10 s) for its thread."""
        self._server.should_exit = True
        self._thread.join(10)
