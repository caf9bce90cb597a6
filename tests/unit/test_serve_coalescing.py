"""`pilot serve`'s connection transport: writes of one loop turn leave together, in order.

A real event loop and a real connected socket pair; the peer reads what the
transport sent.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from marque.cli.serve import _CoalescingTransport


def _run(scenario: Any) -> Any:
    # In a thread of its own: a test before this one may have left this thread inside a
    # running event loop (Playwright's sync API does), where asyncio.run refuses to start.
    ran: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: ran.update(result=asyncio.run(scenario())))
    runner.start()
    runner.join()
    return ran["result"]


def _read_all(peer: socket.socket) -> bytes:
    peer.settimeout(5)
    got = b""
    while chunk := peer.recv(65536):
        got += chunk
    return got


def test_writes_in_one_turn_arrive_whole_and_in_order_and_close_sends_them_first() -> None:
    """Headers, chunks and a last write made just before close all reach the peer, in
    the order written, then the connection ends; a later turn's write still goes out."""

    async def scenario() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        ours, peer = socket.socketpair()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        wrapped = _CoalescingTransport(transport, loop)  # type: ignore[arg-type]
        wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")
        wrapped.write(b"first,")
        await asyncio.sleep(0)  # a turn of the loop: what was written leaves
        await asyncio.sleep(0)
        peer.settimeout(5)
        early = peer.recv(65536)
        wrapped.write(b"second,")
        wrapped.write(b"last")
        wrapped.close()  # in the same turn: nothing written before it is lost
        assert wrapped.is_closing()  # the rest is the real transport's
        rest = await loop.run_in_executor(None, _read_all, peer)
        peer.close()
        return early, rest

    early, rest = _run(scenario)
    assert early == b"HTTP/1.1 200 OK\r\n\r\nfirst,"
    assert rest == b"second,last"
