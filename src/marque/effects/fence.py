"""A member's fence: the row state its one row must still hold for the member to apply.

An Effect Set member may declare ``fence``, a row state — ``{"state":
"present", "value": {…the whole row…}}`` or ``{"state": "absent"}`` — that its
single row must hold *exactly* (every column, by its canonical JSON) when it is
applied. It is what a per-row undo needs (docs/harbour.md "Per-row undo"): each
row is put back only while it still holds what the original execution wrote,
and a row changed since fails alone, as ``undo_conflict``, while the others
apply.

A fenced member differs from an unfenced one in three places, and only there:

* **preview** (:func:`fenced_states`): a read that does not hold the fence is
  not a failed preview but a row that will not change — its ``after`` is its
  ``before``, shown as it is now — so the approver sees which rows no longer
  hold what they are fenced on; the row's ``target_version`` is
  ``not_applicable``, because its guard is the declared fence, which the
  member's CID already binds;
* **apply admission**: with no ``row_content`` guard, the row is not read there
  (a changed row must fail alone, not make the whole set stale);
* **the row's transaction** (:func:`holds`, by :mod:`marque.target.rows`): under
  the write lock, the row is read and compared with the fence; a row that does
  not hold it is rolled back with :class:`~marque.errors.UndoConflict` (its
  outcome ``failed``, code ``undo_conflict``), so it is never overwritten.

A fenced member has ``max_items: 1`` (the fence is its one row's), a kind that
reads its row (``update``, ``delete``, or ``create`` with a key), and a fence of
the state that kind starts from: present for update and delete, absent for a
create.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from marque.effects import cids
from marque.effects._frozen import FrozenJSON, freeze, thaw

__all__ = ["parse_fence", "holds", "fenced_states"]

#: The state a fenced member's row starts from, by kind.
_STARTS = {"update": "present", "delete": "present", "create": "absent"}


def parse_fence(raw: object, kind: str, key: tuple[str, ...], max_items: int, path: str,
                bad: Callable[[str, str, str], Exception]) -> FrozenJSON | None:
    """The declared fence (None if there is none); ``bad(message, rule, path)`` makes the
    refusal (``effect_declaration_invalid``, rule ``fence``)."""
    if raw is None:
        return None
    where = f"{path}.fence"
    if kind not in _STARTS or (kind == "create" and not key):
        raise bad(f"{where}: only an update, a delete or a create with a key can be fenced",
                  "fence", where)
    if max_items != 1:
        raise bad(f"{where}: a fenced member changes one row (max_items 1)", "fence", where)
    try:
        state = cids.check_row_state(raw, where)
    except Exception as exc:  # EffectPreviewInvalid: the same closed encodings
        raise bad(f"{where} must be a row state: {exc}", "fence", where) from None
    if state["state"] != _STARTS[kind]:
        raise bad(f"{where}: a {kind} member's row is fenced {_STARTS[kind]}, not "
                  f"{state['state']}", "fence", where)
    values = state.get("value") or {}
    if not all(v is None or isinstance(v, str | int | bool) for v in values.values()):
        raise bad(f"{where}: fence values are strings, integers, booleans or null", "fence",
                  where)
    return freeze(state)


def holds(current: Mapping[str, Any], fence: FrozenJSON) -> bool:
    """Whether the row state ``current`` (as read) is exactly ``fence``: compared by their
    content CIDs, so ``1`` and ``true``, or ``"1"`` and ``1``, differ."""
    return cids.row_version_cid(dict(current)) == cids.row_version_cid(thaw(fence))


def fenced_states(read: dict[str, Any], fence: FrozenJSON,
                  normal: Callable[[], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(before, after, target_version)`` of a fenced member's row: as ``normal()`` makes
    them while ``read`` holds the fence, else the row as it is, unchanged; the guard is
    the declared fence, so the target version is ``not_applicable``."""
    guard = dict(cids.NOT_APPLICABLE_GUARD)
    if not holds(read, fence):
        return read, dict(read), guard
    before, after, _ = normal()
    return before, after, guard


def failed_rows(members: Any, rows: Any) -> list[dict[str, Any]]:
    """Every failed row of an attempt as its report carries it (``effect_set.failed_rows``):
    ``{effect_id, key, code}`` — the member, the row's key (its ``row_or_item_key``) and
    its outcome's error code, so a Harbourmaster names a row that failed (an
    ``undo_conflict`` of a fenced member, say) by key. ``members`` are the preview's,
    ``rows`` the dispatch ledger's (each with ``member_index``, ``row_index``,
    ``outcome``)."""
    failed: list[dict[str, Any]] = []
    for row in sorted(rows, key=lambda r: (r.member_index, r.row_index)):
        outcome = row.outcome or {}
        if outcome.get("state") != "failed":
            continue
        member = members[row.member_index]
        failed.append({"effect_id": member.effect_id,
                       "key": thaw(member.changes[row.row_index].row_or_item_key),
                       "code": (outcome.get("error") or {}).get("code")})
    return failed
