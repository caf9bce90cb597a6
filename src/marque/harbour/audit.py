"""Checking a logbook offline, over a home: ``marque logbook verify`` and ``logbook head``.

Both kinds of home keep a logbook on the one chain format of
:mod:`marque.harbour.chain`: a Harbourmaster's in its store, a Pilot's embedded
one in its ``logbook.sqlite3``. Verification walks the whole chain and names
the first entry that breaks it; with a head saved earlier (``logbook head``),
it also proves the chain still reaches that head, which is what catches a
truncated or rewritten tail. A Harbourmaster's head is signed with its issuer
key, so a saved head cannot itself be forged by whoever can edit the store.

A Harbourmaster's logbook is also checked for its outcomes' signatures
(:class:`~marque.harbour.reports.SignatureAudit`): every ``execution.*``
entry must carry its Pilot's signature under a report key that Pilot
registered before it, so an outcome written by whoever can edit the store
and recompute the chain, but does not hold the Pilot's key, is found too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marque.errors import InvalidInput, LogbookBroken, NotFound
from marque.harbour.chain import (
    GENESIS,
    ChainBreak,
    check_head,
    verify_against_head,
    verify_entries,
)
from marque.harbour.home import HarbourHome, open_home_store
from marque.harbour.reports import SignatureAudit

#: Entries read from a store per query while verifying.
PAGE = 1000


def _kind_of_home(home: str | os.PathLike[str]) -> str:
    path = Path(home)
    if HarbourHome(path).exists():
        return "harbour"
    from marque.pilot.config import CONFIG_FILE

    if (path / CONFIG_FILE).is_file():
        return "pilot"
    raise NotFound(f"{home} is neither a Harbourmaster's nor a Pilot's home")


def head_of(home: str | os.PathLike[str]) -> dict[str, Any]:
    """The logbook's head ``{seq, hash, at}``; a Harbourmaster's also ``signed`` (a JWS)."""
    if _kind_of_home(home) == "pilot":
        from marque.harbour.logbook import Logbook
        from marque.pilot.home import PilotHome

        logbook = Logbook(str(PilotHome(home).logbook_path))
        try:
            return {**logbook.head(), "signed": None}
        finally:
            logbook.close()
    from marque.harbour.heads import sign_head

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
    from marque.harbour.heads import verify_head
    from marque.token import TrustedKeys, public_jwk

    trusted = TrustedKeys([public_jwk(HarbourHome(home).issuer_key())])
    return check_head(verify_head(signed, trusted))


def verify_home(home: str | os.PathLike[str],
                head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify a home's logbook; ``{entries, head}`` if it holds, else :class:`LogbookBroken`."""
    if _kind_of_home(home) == "pilot":
        from marque.harbour.logbook import Logbook
        from marque.pilot.home import PilotHome

        logbook = Logbook(str(PilotHome(home).logbook_path))
        try:
            found = logbook.check(head=head)
            last = logbook.head()
        finally:
            logbook.close()
        _raise_if_broken(found)
        return {"entries": last["seq"], "head": last}

    store = open_home_store(HarbourHome(home))
    walked: dict[str, Any] = {"seq": 0, "hash": GENESIS, "at": None}
    audit = SignatureAudit()
    try:
        def pages() -> Iterator[dict[str, Any]]:
            after = 0
            while True:
                batch = store.logbook_entries(after=after, limit=PAGE)
                for entry in batch:
                    walked.update(seq=entry.seq, hash=entry.hash, at=entry.at)
                    shown = entry.to_dict()
                    audit.observe(shown)
                    yield shown
                if len(batch) < PAGE:
                    return
                after = batch[-1].seq

        found = verify_entries(pages()) if head is None else verify_against_head(pages(), head)
        # The store's own head row is a head saved by every append: a chain that stops
        # short of it lost its tail, even when no head was saved elsewhere.
        recorded = dict(store.logbook_head())
    finally:
        store.close()
    _raise_if_broken(found)
    if walked["seq"] < recorded["seq"]:
        missing = walked["seq"] + 1
        raise LogbookBroken(
            f"the logbook's chain ends at seq {walked['seq']} but its head row records seq "
            f"{recorded['seq']}: the entries from seq {missing} on were removed",
            detail={"seq": missing, "kind": "truncated",
                    "reason": f"the head row records seq {recorded['seq']}"})
    if (walked["seq"], walked["hash"]) != (recorded["seq"], recorded["hash"]):
        raise LogbookBroken(
            f"the logbook's last entry (seq {walked['seq']}) is not the one its head row "
            "records: its tail was rewritten",
            detail={"seq": recorded["seq"], "kind": "rewritten",
                    "reason": "the head row records another hash"})
    raise_if_unsigned(audit)
    return {"entries": walked["seq"], "head": walked, "signed_reports": audit.checked}


def raise_if_unsigned(audit: SignatureAudit) -> None:
    """:class:`LogbookBroken` for the first outcome a chain holds that its Pilot did not sign."""
    if audit.problem is not None:
        problem = audit.problem
        raise LogbookBroken(
            f"the logbook's entry at seq {problem['seq']} is an outcome its Pilot did not sign: "
            f"{problem['reason']}", detail=problem)


def _raise_if_broken(found: ChainBreak | None) -> None:
    if found is not None:
        raise LogbookBroken(f"the logbook's chain breaks at seq {found.seq}: {found.reason}",
                            detail=found.to_dict())
