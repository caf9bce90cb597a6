"""The logbook's hash chain (DESIGN §11.6), independent of where entries are stored.

An entry is ``{seq, at, kind, actor, subject, body, prev_hash}`` plus its
``hash = sha256(prev_hash ‖ JCS(entry without hash))``. Every store that keeps a
logbook — the Harbourmaster's SQLite and PostgreSQL stores, the Pilot's
embedded file — computes and checks hashes here, so there is one chain format.

Verification walks entries in ``seq`` order, as a store reads them, and names
the first entry at which the chain stops holding (:class:`ChainBreak`):

* an entry edited in place is named itself (its content no longer hashes to
  its recorded ``hash``);
* an entry edited *and* re-hashed is named one entry later, whose
  ``prev_hash`` no longer matches;
* a removed entry is named by the ``seq`` it had (a gap, or — when the rest
  were renumbered — a ``prev_hash`` that does not follow);
* moved entries are named by the first ``seq`` that holds the wrong one;
* a first entry that does not chain onto :data:`GENESIS` is a forged genesis.

A chain cut short at its end, or rewritten from some entry on with every hash
recomputed, still holds by itself: only a head saved earlier (``{seq, hash,
at}``, signed by the Harbourmaster — see :mod:`marque.logbook.heads`) can tell.
:func:`verify_against_head` checks that the chain still reaches the saved
head's ``seq`` and that the entry there still has the head's ``hash``.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from marque.cid import canonicalize
from marque.errors import InvalidInput

__all__ = [
    "GENESIS",
    "ENTRY_FIELDS",
    "BreakKind",
    "ChainBreak",
    "entry_hash",
    "check_entry",
    "check_head",
    "verify_entries",
    "verify_against_head",
    "walk_chain",
]

#: The ``prev_hash`` of the first entry.
GENESIS = "0" * 64

#: The fields an entry's hash covers, besides ``hash`` itself.
ENTRY_FIELDS = ("seq", "at", "kind", "actor", "subject", "body", "prev_hash")

_HEX64 = re.compile(r"[0-9a-f]{64}")


def entry_hash(entry: dict[str, Any]) -> str:
    """The hash of ``entry``: SHA-256 of ``prev_hash`` (hex text), then the JCS of the entry's
    :data:`ENTRY_FIELDS` (everything but ``hash``)."""
    covered = {name: entry[name] for name in ENTRY_FIELDS}
    return hashlib.sha256(entry["prev_hash"].encode("ascii") + canonicalize(covered)).hexdigest()


class BreakKind(enum.StrEnum):
    """Why a chain stops holding at an entry: what a verifier can prove happened there."""

    #: The entry's content no longer hashes to its recorded hash.
    EDITED = "edited"
    #: An entry with this ``seq`` is absent: the next one present has a higher ``seq``.
    MISSING = "missing"
    #: The entry does not follow the one before it: removed, moved or rewritten here.
    UNLINKED = "unlinked"
    #: An entry with a ``seq`` already passed: duplicated or read out of order.
    OUT_OF_ORDER = "out_of_order"
    #: The first entry does not chain onto :data:`GENESIS`.
    GENESIS = "genesis"
    #: A field is missing or of the wrong type, so no hash can be recomputed.
    MALFORMED = "malformed"
    #: The chain ends before the saved head's ``seq``.
    TRUNCATED = "truncated"
    #: The entry at the saved head's ``seq`` no longer has the head's hash.
    REWRITTEN = "rewritten"


@dataclass(frozen=True)
class ChainBreak:
    """Where a logbook's chain stops holding: the first broken entry's ``seq``, and why."""

    seq: int
    reason: str
    kind: BreakKind = BreakKind.EDITED

    def to_dict(self) -> dict[str, Any]:
        """``{seq, kind, reason}``, for ``--json`` output and HTTP bodies."""
        return {"seq": self.seq, "kind": self.kind.value, "reason": self.reason}


def check_entry(entry: Any) -> dict[str, Any]:
    """Check an entry's shape before its hash is believed; returns it, or :class:`InvalidInput`.

    ``seq`` is a positive integer; ``at`` a number or a string; ``kind`` and
    ``actor`` non-empty strings; ``subject`` a string or null; ``body`` a JSON
    object; ``prev_hash`` and ``hash`` (when present) 64 lowercase hex digits.
    """
    if not isinstance(entry, dict):
        raise InvalidInput("a logbook entry must be a JSON object")
    missing = [name for name in ENTRY_FIELDS if name not in entry]
    if missing:
        raise InvalidInput(f"it lacks {', '.join(missing)}")
    seq = entry["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise InvalidInput("its seq is not a positive integer")
    at = entry["at"]
    if not isinstance(at, int | float | str) or isinstance(at, bool):
        raise InvalidInput("its at is neither a number nor a string")
    for name in ("kind", "actor"):
        if not isinstance(entry[name], str) or not entry[name]:
            raise InvalidInput(f"its {name} is not a non-empty string")
    if entry["subject"] is not None and not isinstance(entry["subject"], str):
        raise InvalidInput("its subject is neither a string nor null")
    if not isinstance(entry["body"], dict):
        raise InvalidInput("its body is not a JSON object")
    for name in ("prev_hash", "hash"):
        if name in entry and not _is_hex64(entry[name]):
            raise InvalidInput(f"its {name} is not 64 lowercase hex digits")
    return entry


def _checked_hash(entry: dict[str, Any]) -> str:
    return entry_hash(check_entry(entry))


def check_head(head: Any) -> dict[str, Any]:
    """A saved head ``{seq, hash, at}`` checked for shape; raises :class:`InvalidInput`.

    ``seq`` 0 stands for an empty chain, whose head hash is :data:`GENESIS`.
    Returns ``{seq, hash, at}`` alone (``at`` may be absent: it is not compared).
    """
    if not isinstance(head, dict):
        raise InvalidInput("a logbook head must be a JSON object {seq, hash, at}")
    seq = head.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise InvalidInput("the logbook head's seq must be a non-negative integer")
    if not _is_hex64(head.get("hash")):
        raise InvalidInput("the logbook head's hash must be 64 lowercase hex digits")
    if seq == 0 and head["hash"] != GENESIS:
        raise InvalidInput("a logbook head at seq 0 (an empty chain) must have the genesis hash")
    checked = {"seq": seq, "hash": head["hash"]}
    if "at" in head:
        at = head["at"]
        if not isinstance(at, int | float | str) or isinstance(at, bool):
            raise InvalidInput("the logbook head's at must be a number or a string")
        checked["at"] = at
    return checked


def verify_entries(
    entries: Iterable[dict[str, Any]], *, after: dict[str, Any] | None = None
) -> ChainBreak | None:
    """Walk ``entries`` in ``seq`` order; the first entry where the chain breaks, or None.

    ``entries`` are read as a store reads them (``ORDER BY seq``) and consumed
    once, so a store may pass a cursor. Without ``after`` the chain starts at
    ``seq`` 1 on :data:`GENESIS`; with ``after`` (a ``{seq, hash}`` already
    verified, such as a saved head) it continues from there, so a long logbook
    can be checked page by page. A chain cut short at its end still verifies:
    use :func:`verify_against_head` for that.
    """
    return walk_chain(entries, hash_of=_checked_hash, after=after)


def verify_against_head(
    entries: Iterable[dict[str, Any]], head: dict[str, Any]
) -> ChainBreak | None:
    """:func:`verify_entries`, and the chain must still reach the saved ``head``.

    Fewer entries than the head's ``seq`` is a truncation, named by the first
    missing ``seq``. An entry at the head's ``seq`` with another hash means
    the chain was rewritten at or before it; the head is the earliest point a
    head alone can prove that, so that ``seq`` is named (the first rewritten
    entry itself left no other trace). Entries after the head are checked too.
    Raises :class:`InvalidInput` for a malformed head.
    """
    # Checked here too: a missing head must not quietly mean "no head to check".
    return walk_chain(entries, hash_of=_checked_hash, head=check_head(head))


def walk_chain(
    entries: Iterable[dict[str, Any]],
    *,
    hash_of: Callable[[dict[str, Any]], str | None],
    head: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> ChainBreak | None:
    """The chain walk behind :func:`verify_entries`, with the entry hash supplied by the caller.

    For a store that still holds entries written under an older preimage (the
    Pilot's embedded logbook's schema-1 rows): ``hash_of(entry)`` returns the
    hash the entry should have, None when its stored content plainly is not
    what was hashed (an edit), or raises :class:`InvalidInput` (or
    ``KeyError``/``TypeError``/``ValueError``) saying why it cannot be
    recomputed. Every entry needs ``seq``, ``prev_hash`` and ``hash``; the
    linkage rules are the same for every format.
    """
    start: dict[str, Any] = {"seq": 0, "hash": GENESIS} if after is None else check_head(after)
    saved = None if head is None else check_head(head)
    if saved is not None and saved["seq"] < start["seq"]:
        raise InvalidInput("the saved head is older than the point verification starts from")
    if saved is not None and saved["seq"] == start["seq"] and saved["hash"] != start["hash"]:
        return ChainBreak(saved["seq"], f"entry {saved['seq']} does not have the saved head's "
                                        "hash: the chain was rewritten at or before it",
                          BreakKind.REWRITTEN)
    expected = start["seq"] + 1
    prev = start["hash"]
    for entry in entries:
        found = _check_one(entry, expected, prev, hash_of)
        if found is not None:
            return found
        if saved is not None and expected == saved["seq"] and entry["hash"] != saved["hash"]:
            return ChainBreak(expected, f"entry {expected} does not have the saved head's hash: "
                                        "the chain was rewritten at or before it",
                              BreakKind.REWRITTEN)
        prev = entry["hash"]
        expected += 1
    if saved is not None and expected <= saved["seq"]:
        return ChainBreak(expected, f"entry {expected} is missing: the chain ends at entry "
                                    f"{expected - 1} but the saved head vouches for entry "
                                    f"{saved['seq']}: the tail was cut off",
                          BreakKind.TRUNCATED)
    return None


def _check_one(
    entry: Any, expected: int, prev: str, hash_of: Callable[[dict[str, Any]], str | None]
) -> ChainBreak | None:
    """Whether ``entry`` is entry ``expected`` chained onto ``prev``; the break if not."""
    seq = entry.get("seq") if isinstance(entry, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        return ChainBreak(expected, f"entry {expected} is malformed: it has no integer seq",
                          BreakKind.MALFORMED)
    if seq > expected:
        return ChainBreak(expected, f"entry {expected} is missing: removed (the next entry "
                                    f"present is {seq})", BreakKind.MISSING)
    if seq < expected:
        return ChainBreak(expected, f"entry {expected} is out of order: found entry {seq} "
                                    "where it should be", BreakKind.OUT_OF_ORDER)
    if entry.get("prev_hash") != prev:
        if prev == GENESIS and seq == 1:
            return ChainBreak(seq, "entry 1 does not chain onto the genesis hash: the chain's "
                                   "start was forged", BreakKind.GENESIS)
        return ChainBreak(seq, f"entry {seq} does not follow entry {seq - 1}: an entry was "
                               "removed, moved or rewritten here", BreakKind.UNLINKED)
    try:
        recomputed = hash_of(entry)
    except (InvalidInput, KeyError, TypeError, ValueError) as exc:
        why = exc.message if isinstance(exc, InvalidInput) else "a field cannot be read"
        return ChainBreak(seq, f"entry {seq} is malformed: {why}", BreakKind.MALFORMED)
    if recomputed is None or recomputed != entry.get("hash"):
        return ChainBreak(seq, f"entry {seq} was edited: its content no longer hashes to its "
                               "recorded hash", BreakKind.EDITED)
    return None


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None
