"""Auditing a logbook: the whole chain walked, its tail and its outcomes' signatures checked.

Both kinds of logbook are on the one chain format of :mod:`marque.logbook.chain`:
a Harbourmaster's in its store, a Pilot's embedded one in its file
(:mod:`marque.logbook.embedded`). Verification walks the whole chain and names
the first entry that breaks it; with a head saved earlier (``logbook head``), it
also proves the chain still reaches that head, which is what catches a truncated
or rewritten tail.

A Harbourmaster's logbook is also checked for its outcomes' signatures
(:class:`SignatureAudit`): every ``execution.*`` entry must carry its Pilot's
signature under a report key that Pilot registered before it, so an outcome
written by whoever can edit the store and recompute the chain, but does not hold
the Pilot's key, is found too.

This module knows logbooks, not homes: ``marque logbook verify`` finds which
home it is given and hands the store or the file here
(:mod:`marque.cli.logbook_homes`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from marque.errors import LogbookBroken, ReportSignatureInvalid
from marque.logbook.chain import GENESIS, ChainBreak, verify_against_head, verify_entries
from marque.logbook.embedded import Logbook
from marque.token.reports import verify_report

#: Entries read from a store per query while verifying.
PAGE = 1000


class StoredEntry(Protocol):
    """One entry as a store reads it back."""

    @property
    def seq(self) -> int: ...
    @property
    def hash(self) -> str: ...
    @property
    def at(self) -> float: ...
    def to_dict(self) -> dict[str, Any]: ...


class LogbookStore(Protocol):
    """What an audit reads from a store that keeps a logbook (a Harbourmaster's)."""

    def logbook_entries(self, after: int = 0, limit: int = 100) -> Sequence[StoredEntry]: ...
    def logbook_head(self) -> dict[str, Any]: ...


def embedded_head(path: str) -> dict[str, Any]:
    """The head ``{seq, hash, at}`` of the embedded logbook in the file ``path``."""
    logbook = Logbook(path)
    try:
        return logbook.head()
    finally:
        logbook.close()


def verify_embedded(path: str, head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify the embedded logbook in ``path``; ``{entries, head}`` if it holds, else
    :class:`LogbookBroken`."""
    logbook = Logbook(path)
    try:
        found = logbook.check(head=head)
        last = logbook.head()
    finally:
        logbook.close()
    raise_if_broken(found)
    return {"entries": last["seq"], "head": last}


def verify_store(store: LogbookStore, head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verify a store's logbook and its outcomes' signatures; ``{entries, head,
    signed_reports}`` if it holds, else :class:`LogbookBroken`."""
    walked: dict[str, Any] = {"seq": 0, "hash": GENESIS, "at": None}
    audit = SignatureAudit()

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
    raise_if_broken(found)
    _raise_if_short(walked, recorded)
    raise_if_unsigned(audit)
    return {"entries": walked["seq"], "head": walked, "signed_reports": audit.checked}


def _raise_if_short(walked: dict[str, Any], recorded: dict[str, Any]) -> None:
    """:class:`LogbookBroken` unless the walk ended at the store's own head row."""
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


def raise_if_broken(found: ChainBreak | None) -> None:
    """:class:`LogbookBroken` naming the entry where a walked chain broke, if it did."""
    if found is not None:
        raise LogbookBroken(f"the logbook's chain breaks at seq {found.seq}: {found.reason}",
                            detail=found.to_dict())


def raise_if_unsigned(audit: SignatureAudit) -> None:
    """:class:`LogbookBroken` for the first outcome a chain holds that its Pilot did not sign."""
    if audit.problem is not None:
        problem = audit.problem
        raise LogbookBroken(
            f"the logbook's entry at seq {problem['seq']} is an outcome its Pilot did not sign: "
            f"{problem['reason']}", detail=problem)


class SignatureAudit:
    """Checks, entry by entry in ``seq`` order, that a logbook's outcomes are their Pilots'.

    Fed every entry of a chain (:meth:`observe`), it learns each Pilot's report
    keys from its ``pilot.registered`` entries and checks every
    ``execution.*`` entry against them: a ``signature`` must verify under a key
    that Pilot registered at or before that entry, with claims that are the
    entry's report; an entry without one, once its Pilot had registered a key,
    is unsigned where it should not be. :attr:`problem` is the first failure
    (``{seq, kind, reason}``, ``kind`` ``report_signature`` or
    ``report_unsigned``), :attr:`checked` how many signatures held. It needs
    nothing but the logbook: the keys are in it.
    """

    #: The members of an ``execution.*`` entry's body that its report signature covers.
    SIGNED_FIELDS = ("marque_id", "nonce", "attempt", "status", "rows_affected", "error",
                     "pilot", "cause")

    def __init__(self) -> None:
        self.keys: dict[str, list[dict[str, Any]]] = {}
        self.checked = 0
        self.problem: dict[str, Any] | None = None

    def observe(self, entry: dict[str, Any]) -> None:
        """Take the next entry of the chain."""
        body = entry.get("body")
        kind = str(entry.get("kind", ""))
        if not isinstance(body, dict):
            return
        if kind in ("pilot.registered", "pilot.report_key_accepted") \
                and isinstance(body.get("report_key"), dict):
            self.keys.setdefault(str(body.get("pilot_id")), []).append(body["report_key"])
            return
        if not kind.startswith("execution.") or self.problem is not None:
            return
        pilot = body.get("pilot")
        pilot_id = str(pilot.get("id")) if isinstance(pilot, dict) else ""
        keys = self.keys.get(pilot_id, [])
        signature = body.get("signature")
        if signature is None:
            if keys:
                self._fail(entry, "report_unsigned",
                           f"Pilot {pilot_id} had registered a report key, but this outcome "
                           "carries no signature of it")
            return
        report = {name: body.get(name) for name in self.SIGNED_FIELDS}
        if isinstance(body.get("effect_set"), dict):
            report["effect_set"] = body["effect_set"]
        reasons = []
        for key in reversed(keys):
            try:
                verify_report(signature, report, key)
            except ReportSignatureInvalid as exc:
                reasons.append(exc.message)
                continue
            self.checked += 1
            return
        self._fail(entry, "report_signature",
                   reasons[0] if reasons else f"Pilot {pilot_id} registered no report key "
                                              "before this signed outcome")

    def _fail(self, entry: dict[str, Any], kind: str, reason: str) -> None:
        self.problem = {"seq": entry.get("seq"), "kind": kind, "reason": reason}
