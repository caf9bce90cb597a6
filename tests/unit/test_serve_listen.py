"""`pilot serve --listen`: HOST:PORT parsing, and which hosts count as loopback (no TLS warning)."""

from __future__ import annotations

import pytest

from marque.cli.serve import _is_loopback, parse_listen
from marque.errors import InvalidInput


@pytest.mark.parametrize(("text", "parsed"), [
    ("127.0.0.1:8750", ("127.0.0.1", 8750)), ("[::1]:0", ("::1", 0)),
    ("localhost:1", ("localhost", 1)), ("0.0.0.0:65535", ("0.0.0.0", 65535)),
])
def test_listen_addresses_parse(text: str, parsed: tuple[str, int]) -> None:
    """HOST:PORT and [IPv6]:PORT give the host and the port."""
    assert parse_listen(text) == parsed


@pytest.mark.parametrize("text", ["8750", "127.0.0.1", ":8750", "host:port", "h:65536"])
def test_bad_listen_addresses_are_input_invalid(text: str) -> None:
    """Anything else is input_invalid, never a guess."""
    with pytest.raises(InvalidInput):
        parse_listen(text)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("example.org", False),
])
def test_only_loopback_hosts_skip_the_tls_warning(host: str, loopback: bool) -> None:
    """The warning is printed for every host that is not loopback."""
    assert _is_loopback(host) is loopback
