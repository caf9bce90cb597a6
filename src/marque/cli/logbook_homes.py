"""A home's logbook, whichever kind of home it is: ``marque logbook verify`` and ``logbook head``.

A Harbourmaster's home keeps its logbook in its store, and signs its head with
its issuer key, so a saved head cannot itself be forged by whoever can edit the
store; a Pilot's home keeps its embedded logbook in ``logbook.sqlite3``. This
module tells the two apart and hands the store or the file to
:mod:`marque.logbook.audit`; it sits above both wings, as the command does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from marque.errors import InvalidInput, NotFound
from marque.harbour.home import HarbourHome, open_home_store
from marque.logbook.audit import embedded_head, verify_embedded, verify_store
from marque.logbook.chain import check_head
from marque.pilot.config import CONFIG_FILE
from marque.pilot.home import PilotHome


def _kind_of_home(home: str | os.PathLike[str]) -> str:
    path = Path(home)
    if HarbourHome(path).exists():
        return "harbour"
    if (path / CONFIG_FILE).is_file():
        return "pilot"
    raise NotFound(f"{home} is neither a Harbourmaster's nor a Pilot's home")


def head_of(home: str | os.PathLike[str]) -> dict[str, Any]:
    """The logbook's head ``{seq, hash, at}``; a Harbourmaster's also ``signed`` (a JWS)."""
    if _kind_of_home(home) == "pilot":
        return {**embedded_head(str(PilotHome(home).logbook_path)), "signed": None}
    from marque.logbook.heads import sign_head

    harbour_home = HarbourHome(home)
    store = open_home_store(harbour_home)
    try:
        head = dict(store.logbook_head())
    finally:
        store.close()
    return {**head, "signed": sign_head(head, harbour_home.issuer_key())}


def saved_head(home: str | os.PathLike[str], saved: dict[str, Any]) -> dict[str, Any]:
    """A head read from a file ``logbook head`` wrote, checked; a signed one must verify.

    On a Harbourmaster's home the signature is required and checked against
    the home's issuer key, and the signed claims are what counts.
    """
    if _kind_of_home(home) == "pilot":
        return check_head({k: saved.get(k) for k in ("seq", "hash", "at")})
    signed = saved.get("signed")
    if not isinstance(signed, str):
        raise InvalidInput("a Harbourmaster's saved head must carry its signature (`signed`), "
                           "as `marque logbook head` writes it")
    from marque.logbook.heads import verify_head
    from marque.token import TrustedKeys, public_jwk

    trusted = TrustedKeys([public_jwk(HarbourHome(home).issuer_key())])
    return check_head(verify_head(signed, trusted))


def verify_home(home: str | os.PathLike[str],
                head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify a home's logbook; ``{entries, head}`` (a Harbourmaster's also
    ``signed_reports``) if it holds, else :class:`~marque.errors.LogbookBroken`."""
    if _kind_of_home(home) == "pilot":
        return verify_embedded(str(PilotHome(home).logbook_path), head)
    store = open_home_store(HarbourHome(home))
    try:
        return verify_store(store, head)
    finally:
        store.close()
