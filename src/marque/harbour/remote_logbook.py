"""A Harbourmaster's logbook checked from outside, over its HTTP API.

The entries are fetched page by page from ``GET /v1/logbook`` and verified
here, by the chain rules of :mod:`marque.harbour.chain`: the service is not
trusted to say its own logbook holds. A saved signed head's signature is
checked against the service's JWKS. ``marque logbook verify --harbour`` and
the demo both use this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from marque.errors import InvalidInput, LogbookBroken

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient
    from marque.token import TrustedKeys

__all__ = ["PAGE", "pages", "saved_head_over_http", "trusted_keys", "verify_over_http"]

#: Entries fetched per ``GET /v1/logbook`` (the API's maximum).
PAGE = 1000


def trusted_keys(client: HarbourClient) -> TrustedKeys:
    """The Harbourmaster's issuer keys, from its JWKS."""
    from marque.token import TrustedKeys

    keys = client.jwks().get("keys")
    if not isinstance(keys, list) or not keys:
        raise InvalidInput(f"the Harbourmaster at {client.url} publishes no issuer key")
    return TrustedKeys(keys)


def saved_head_over_http(client: HarbourClient, saved: dict[str, Any]) -> dict[str, Any]:
    """A saved head's signed claims, the signature checked against the Harbourmaster's JWKS."""
    from marque.harbour.chain import check_head
    from marque.harbour.heads import verify_head

    signed = saved.get("signed")
    if not isinstance(signed, str):
        raise InvalidInput("a Harbourmaster's saved head must carry its signature (`signed`), "
                           "as `marque logbook head` writes it")
    return check_head(verify_head(signed, trusted_keys(client)))


def pages(client: HarbourClient, walked: dict[str, Any], kind: str | None = None,
          after: int = 0) -> Iterator[dict[str, Any]]:
    """Every entry after ``after``, page by page; ``walked`` tracks the last one seen."""
    while True:
        page = client.logbook(after=after, limit=PAGE, kind=kind)
        entries = page.get("entries") or []
        for entry in entries:
            if isinstance(entry, dict):
                walked.update(seq=entry.get("seq"), hash=entry.get("hash"), at=entry.get("at"))
            yield entry
        next_after = page.get("next_after")
        if not entries or not isinstance(next_after, int) or next_after <= after:
            return
        after = next_after


def verify_over_http(client: HarbourClient, head: dict[str, Any] | None) -> dict[str, Any]:
    """Fetch and verify the whole chain, which must also reach the head the service holds now
    (and ``head``, a saved one, when given); returns ``{entries, head}``.

    Raises :class:`~marque.errors.LogbookBroken` naming the first bad ``seq``.
    """
    from marque.harbour.audit import raise_if_unsigned
    from marque.harbour.chain import GENESIS, verify_against_head, verify_entries
    from marque.harbour.reports import SignatureAudit

    # Taken first: entries appended while we read lie beyond it, and still verify.
    current = client.logbook_head()
    at_current: dict[str, Any] = {}
    walked: dict[str, Any] = {"seq": 0, "hash": GENESIS, "at": None}
    audit = SignatureAudit()

    def entries() -> Iterator[dict[str, Any]]:
        for entry in pages(client, walked):
            if isinstance(entry, dict):
                audit.observe(entry)
                if entry.get("seq") == current.get("seq"):
                    at_current["hash"] = entry.get("hash")
            yield entry

    found = verify_entries(entries()) if head is None else verify_against_head(entries(), head)
    if found is not None:
        raise LogbookBroken(f"the logbook's chain breaks at seq {found.seq}: {found.reason}",
                            detail=found.to_dict())
    # The service's own head row is a head saved by every append: a chain that stops short
    # of it lost its tail, even when no head was saved elsewhere.
    seq = current.get("seq")
    if isinstance(seq, int) and walked["seq"] < seq:
        missing = walked["seq"] + 1
        raise LogbookBroken(
            f"the logbook's chain ends at seq {walked['seq']} but the Harbourmaster's head is "
            f"at seq {seq}: the entries from seq {missing} on were removed",
            detail={"seq": missing, "kind": "truncated",
                    "reason": f"the Harbourmaster's head records seq {seq}"})
    if isinstance(seq, int) and seq > 0 and at_current.get("hash") != current.get("hash"):
        raise LogbookBroken(
            f"entry {seq} is not the one the Harbourmaster's head records: its tail was "
            "rewritten", detail={"seq": seq, "kind": "rewritten",
                                 "reason": "the head records another hash"})
    raise_if_unsigned(audit)
    return {"entries": walked["seq"], "head": dict(walked), "signed_reports": audit.checked}
