"""What an operator may configure as a webhook endpoint: its URL, format, events and secret.

Secrets follow the Standard Webhooks specification: ``whsec_`` and the base64 of
24 to 64 random bytes (32 when Marque makes one). A URL is ``https``, or plain
``http`` only to a loopback address (a receiver on this machine) unless the
operator says so with ``allow_http``: a signature proves who sent an event, but
only TLS keeps a request's SQL and reason from being read on the way.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import secrets
from urllib.parse import urlsplit

from marque.errors import InvalidInput
from marque.harbour.notifications.events import EVENT_TYPES

#: The formats a delivery can take: the generic event, or a Slack incoming-webhook message.
FORMATS = ("json", "slack")
SECRET_PREFIX = "whsec_"
#: Random bytes in a secret Marque makes, and the bounds of one an operator brings.
SECRET_BYTES = 32
SECRET_BOUNDS = (24, 64)
#: The longest endpoint URL accepted.
MAX_URL_CHARS = 2048


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def check_secret(text: str) -> str:
    """``text`` (surrounding whitespace dropped) if it is a Standard Webhooks secret;
    ``input_invalid`` otherwise (never echoing it)."""
    value = text.strip()
    lo, hi = SECRET_BOUNDS
    if not value.startswith(SECRET_PREFIX):
        raise InvalidInput(f"a webhook secret starts with {SECRET_PREFIX!r} followed by base64")
    try:
        raw = base64.b64decode(value[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("the webhook secret after 'whsec_' is not valid base64") from None
    if not lo <= len(raw) <= hi:
        raise InvalidInput(f"a webhook secret holds {lo} to {hi} random bytes; this one has "
                           f"{len(raw)}", detail={"bytes": len(raw)})
    return value


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost`` or a loopback address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, *, allow_http: bool = False) -> str:
    """``url`` if it can be an endpoint: absolute ``https`` (or ``http`` to loopback, or
    with ``allow_http``), with a host, no user name or password, no fragment, no spaces."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInput(f"an endpoint URL is 1 to {MAX_URL_CHARS} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise InvalidInput("an endpoint URL holds no spaces or control characters")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"the endpoint URL's port is not a port: {url[:200]!r}") from None
    del port
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidInput(f"an endpoint URL is absolute http(s) with a host, not {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("an endpoint URL carries no user name or password (the signature "
                           "authenticates Marque to the receiver)")
    if parts.fragment:
        raise InvalidInput("an endpoint URL has no #fragment (it is never sent)")
    if parts.scheme == "http" and not allow_http and not is_loopback_host(parts.hostname):
        raise InvalidInput(
            f"{parts.hostname} is not this machine: use https, so that requests' SQL and "
            "reasons are not readable on the way (or say --allow-http to accept that)",
            detail={"host": parts.hostname})
    return url


def check_format(name: str) -> str:
    """``name`` if it is one of :data:`FORMATS`."""
    if name not in FORMATS:
        raise InvalidInput(f"a webhook format is one of {', '.join(FORMATS)}, not {name[:40]!r}")
    return name


def check_events(names: list[str] | tuple[str, ...]) -> list[str]:
    """The event types asked for, each one of :data:`EVENT_TYPES` (none: every type)."""
    unknown = sorted(set(names) - set(EVENT_TYPES))
    if unknown:
        raise InvalidInput(f"unknown event type {unknown[0][:60]!r}: the types are "
                           f"{', '.join(EVENT_TYPES)}", detail={"events": list(EVENT_TYPES)})
    return sorted(set(names))
