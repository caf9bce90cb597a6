"""The logbook as the console shows it: pages, a request's entries, and the chain's verdict.

Everything is read through the core: the whole logbook and its head through
:meth:`~marque.harbour.service.Harbourmaster.logbook` and
:meth:`~marque.harbour.service.Harbourmaster.logbook_head`, which only auditors
and admins may read (DESIGN §11.7), and one request's own entries through
:meth:`~marque.harbour.service.Harbourmaster.request_logbook`, which everyone
who may see the request may read. Anyone else gets
:class:`~marque.errors.Forbidden` from the core and the page says so.

Verification is the same walk ``marque logbook verify`` makes
(:func:`marque.harbour.chain.verify_entries`), over every entry, page by page,
followed by the check that the chain reaches the store's head row (a cut-off
tail otherwise verifies by itself). Its answer names the first broken ``seq``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from marque.errors import Forbidden
from marque.harbour.chain import GENESIS, verify_entries
from marque.harbour.principals import Principal

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["chain_status", "logbook_page", "request_entries"]

#: Entries asked of the core per call while walking the whole chain.
WALK_PAGE = 1000
#: Entries on one page of the logbook page.
PAGE = 50


def _walk(hm: Harbourmaster, principal: Principal, kind: str = "") -> Iterator[dict[str, Any]]:
    after = 0
    while True:
        batch = hm.logbook(principal, after, WALK_PAGE, kind)["entries"]
        yield from batch
        if len(batch) < WALK_PAGE:
            return
        after = batch[-1]["seq"]


def chain_status(hm: Harbourmaster, principal: Principal) -> dict[str, Any]:
    """``{verified: True, entries, head}`` or ``{verified: False, seq, kind, reason}``."""
    head = hm.logbook_head(principal)
    walked: dict[str, Any] = {"seq": 0, "hash": GENESIS}

    def entries() -> Iterator[dict[str, Any]]:
        for entry in _walk(hm, principal):
            walked.update(seq=entry["seq"], hash=entry["hash"])
            yield entry

    found = verify_entries(entries())
    if found is not None:
        return {"verified": False, **found.to_dict()}
    if walked["seq"] < head["seq"]:
        return {"verified": False, "seq": walked["seq"] + 1, "kind": "truncated",
                "reason": f"the chain ends at seq {walked['seq']} but the head row records "
                          f"seq {head['seq']}: the entries after it were removed"}
    if walked["hash"] != head["hash"]:
        return {"verified": False, "seq": head["seq"], "kind": "rewritten",
                "reason": "the last entry is not the one the head row records: the tail "
                          "was rewritten"}
    return {"verified": True, "entries": walked["seq"], "head": head}


def logbook_page(hm: Harbourmaster, principal: Principal, *, after: int, kind: str
                 ) -> dict[str, Any]:
    """One page of entries after ``after``, of kinds starting with ``kind``, and the verdict."""
    page = hm.logbook(principal, after, PAGE + 1, kind)
    entries = page["entries"]
    more = len(entries) > PAGE
    entries = entries[:PAGE]
    return {"entries": entries, "after": after, "kind": kind,
            "next_after": entries[-1]["seq"] if more and entries else None,
            "chain": chain_status(hm, principal)}


def request_entries(hm: Harbourmaster, principal: Principal, request_id: str
                    ) -> list[dict[str, Any]] | None:
    """The logbook entries about one request, oldest first (for anyone who may see the
    request); None if the core refuses them."""
    try:
        entries: list[dict[str, Any]] = hm.request_logbook(principal, request_id)["entries"]
    except Forbidden:
        return None
    return entries
