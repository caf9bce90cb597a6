"""The logbook as the console shows it: pages, a request's entries, and the chain's verdict.

Everything is read through the core: the whole logbook and its head through
:meth:`~marque.harbour.service.Harbourmaster.logbook` and
:meth:`~marque.harbour.service.Harbourmaster.logbook_head`, which only auditors
and admins may read (DESIGN §11.7), and one request's own entries through
:meth:`~marque.harbour.service.Harbourmaster.request_logbook`, which everyone
who may see the request may read. Anyone else gets
:class:`~marque.errors.Forbidden` from the core and the page says so.

The page opens at the newest entries and goes back from there (``before``),
filtered by kind prefix, actor and subject (a request's id). The filters and
the page are gathered during the verifying walk, which reads every entry
anyway, so any filter works over the whole chain with the store's one paging.

Verification is the same walk ``marque logbook verify`` makes
(:func:`marque.logbook.chain.verify_entries`), over every entry, page by page,
followed by the check that the chain reaches the store's head row (a cut-off
tail otherwise verifies by itself). Its answer names the first broken ``seq``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from marque.errors import Forbidden
from marque.harbour.principals import Principal
from marque.logbook.chain import GENESIS, verify_entries

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


def chain_status(hm: Harbourmaster, principal: Principal,
                 observe: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """``{verified: True, entries, head}`` or ``{verified: False, seq, kind, reason}``.

    ``observe`` is shown every entry of the walk, in ``seq`` order — past a
    break too — so a page can be gathered from the same single read.
    """
    head = hm.logbook_head(principal)
    walked: dict[str, Any] = {"seq": 0, "hash": GENESIS}

    def entries() -> Iterator[dict[str, Any]]:
        for entry in _walk(hm, principal):
            walked.update(seq=entry["seq"], hash=entry["hash"])
            if observe is not None:
                observe(entry)
            yield entry

    walk = entries()
    found = verify_entries(walk)
    for _ in walk:  # the rest is still shown, marked untrusted
        pass
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


def logbook_page(hm: Harbourmaster, principal: Principal, *, before: int | None = None,
                 kind: str = "", actor: str = "", subject: str = "") -> dict[str, Any]:
    """The newest :data:`PAGE` entries before ``before`` (all, without it) that match the
    filters, newest first, and the chain's verdict — both from one walk of the chain.

    ``kind`` is a prefix; ``actor`` and ``subject`` (a request's ``rq_`` id, a
    Pilot's id…) match exactly; an empty filter matches everything.
    ``older`` is the ``before`` of the next page back (None on the last one).
    """
    kept: deque[dict[str, Any]] = deque(maxlen=PAGE + 1)

    def observe(entry: dict[str, Any]) -> None:
        if ((before is None or entry["seq"] < before)
                and str(entry.get("kind", "")).startswith(kind)
                and (not actor or entry.get("actor") == actor)
                and (not subject or entry.get("subject") == subject)):
            kept.append(entry)

    chain = chain_status(hm, principal, observe)
    newest = list(reversed(kept))
    entries = newest[:PAGE]
    return {"entries": entries, "before": before, "kind": kind, "actor": actor,
            "subject": subject, "filtered": bool(kind or actor or subject),
            "older": entries[-1]["seq"] if len(newest) > PAGE else None,
            "chain": chain}


def request_entries(hm: Harbourmaster, principal: Principal, id: str
                    ) -> tuple[list[dict[str, Any]] | None, bool]:
    """The first page of logbook entries about one request, oldest first (for anyone who may
    see the request), and whether more follow (the page says so and links to the logbook
    filtered by the request: nothing is dropped silently); None if the core refuses them."""
    try:
        page = hm.request_logbook(principal, id)
    except Forbidden:
        return None, False
    entries: list[dict[str, Any]] = page["entries"]
    return entries, page["next_after"] is not None
