"""Reaching the Harbourmaster from a command: the client its options name, the ids it sends.

Every control-plane command (``marque request``, ``requests``, ``approve``,
``undo``, ``exec --request``, ``logbook … --harbour``) talks to a Harbourmaster
through :class:`marque.clients.harbour.HarbourClient`; this module makes that
client from ``--harbour`` and ``--token`` (or ``MARQUE_HARBOUR``,
``MARQUE_TOKEN``, or the token ``marque login`` stored) and checks a request id
before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from marque.cli.common import fail
from marque.errors import InvalidInput, MarqueError, Unauthenticated

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient

__all__ = ["ask_harbour", "checked_id", "connect"]

T = TypeVar("T")


def connect(harbour_url: str | None, token: str | None) -> HarbourClient:
    """A client for the Harbourmaster the options name; refuses locally when one is missing.

    The token is ``--token``, else ``MARQUE_TOKEN`` (click reads both into ``token``),
    else the one ``marque login`` stored for that URL.
    """
    from marque.clients.harbour import HarbourClient

    if not harbour_url:
        raise InvalidInput("no Harbourmaster: give --harbour URL or set MARQUE_HARBOUR")
    if not token:
        from marque.cli.login import stored_token

        token = stored_token(harbour_url)
    if not token:
        raise Unauthenticated("no token: run `marque login --harbour URL`, set MARQUE_TOKEN "
                              "or give --token (the token `marque harbour principal add` "
                              "printed)")
    return HarbourClient(harbour_url, token)


def checked_id(value: str) -> str:
    """A request id (``rq_…`` or a caller request id) checked before anything is sent."""
    from marque.request_ids import check_request_id

    return check_request_id(value)


def ask_harbour(harbour_url: str | None, token: str | None,
                call: Callable[[HarbourClient], T], as_json: bool,
                detail: dict[str, Any]) -> T:
    """What ``call`` answers on a client for the Harbourmaster the options name (closed
    after); a Marque error it raises ends the command, ``detail`` beside the error in its
    JSON (the id the caller named, so a script knows which request failed)."""
    with connect(harbour_url, token) as client:
        try:
            return call(client)
        except MarqueError as exc:
            fail(exc, as_json, detail)
