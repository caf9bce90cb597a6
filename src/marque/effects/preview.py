"""The Effect Set preview: every row's before and after, sealed by one CID (seed 002).

:func:`build_preview` is pure: it takes the bound set (:mod:`marque.effects.declare`)
and the rows' current state as the target returned them (``reads``), and
returns the preview object exactly in the seed's order — row preview CIDs,
then member CIDs, then the set ``effect_preview_cid``, and only then the row
idempotency keys. Reading the target is the Pilot's job; nothing here connects.

Per row, by kind (``full_diff``; under ``targeted`` ``before`` is
``unavailable`` and so is ``after`` unless deleting — the intended change and
the guard are recorded either way):

=========  ======================  ===============================  ==============
kind       before                  after                            target guard
=========  ======================  ===============================  ==============
create     ``absent``              ``present`` (the input row)      row content if
                                                                    the member has
                                                                    a key, else
                                                                    not_applicable
update     the read row (present)  read row with the new values     row content
upsert     the read row or absent  read row with the values, or     row content
                                   key + values when absent
delete     the read row (present)  ``absent``                       row content
command    ``not_applicable``      ``not_applicable``               not_applicable
=========  ======================  ===============================  ==============

A read that contradicts the kind (an update or delete of a missing row, a
create of a present one, a column the row does not have) is
:class:`~marque.errors.PreviewFailed`; it is not previewed around.

:func:`verify_preview` re-establishes every CID and key of a transported
preview in the same order; :func:`check_fresh` is apply admission's guard
check (any difference, or missing evidence, is ``stale_preview``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from marque.cid import is_cid
from marque.effects import cids
from marque.effects._frozen import FrozenJSON, freeze, thaw
from marque.effects.declare import BoundEffectSet, BoundMember, FailurePolicy, Kind
from marque.effects.fence import fenced_states
from marque.errors import EffectPreviewInvalid, PreviewFailed, StalePreview

__all__ = [
    "Strength", "RowPreview", "MemberPreview", "EffectPreview", "build_preview",
    "verify_preview", "check_fresh",
]


class Strength(enum.StrEnum):
    """How much a preview knows about its rows (seed 002, "Preview strength…")."""

    FULL_DIFF = "full_diff"
    TARGETED = "targeted"


@dataclass(frozen=True)
class RowPreview:
    """One row of a member's preview (one ``changes[]`` entry)."""

    row_preview_cid: str
    row_or_item_key: FrozenJSON
    before: FrozenJSON
    after: FrozenJSON
    intended_changes: FrozenJSON
    target_version: FrozenJSON
    row_idempotency_key: str

    def to_json(self) -> dict[str, Any]:
        """The ``changes[]`` entry."""
        return {"row_preview_cid": self.row_preview_cid,
                "row_or_item_key": thaw(self.row_or_item_key), "before": thaw(self.before),
                "after": thaw(self.after), "intended_changes": thaw(self.intended_changes),
                "target_version": thaw(self.target_version),
                "row_idempotency_key": self.row_idempotency_key}


@dataclass(frozen=True)
class MemberPreview:
    """One member's preview: its declaration, strength, count and rows in canonical order."""

    effect_id: str
    kind: Kind
    table: str
    key: tuple[str, ...]
    command: str | None
    failure_policy: FailurePolicy
    max_items: int
    strength: Strength
    changes: tuple[RowPreview, ...]
    effect_member_preview_cid: str
    #: Derived after the set CID; not part of the member object.
    effect_apply_key: str
    #: The declared fence of its one row (:mod:`marque.effects.fence`), or None.
    fence: FrozenJSON | None = None

    @property
    def item_count(self) -> int:
        """The member's items (one per row)."""
        return len(self.changes)

    def to_json(self) -> dict[str, Any]:
        """The member object of the preview (its apply key is not part of it)."""
        return {"effect_id": self.effect_id, "kind": self.kind.value, "table": self.table,
                "key": list(self.key), "command": self.command,
                "failure_policy": self.failure_policy.value, "max_items": self.max_items,
                "strength": self.strength.value, "item_count": self.item_count,
                "changes": [change.to_json() for change in self.changes],
                "effect_member_preview_cid": self.effect_member_preview_cid,
                **({} if self.fence is None else {"fence": thaw(self.fence)})}


@dataclass(frozen=True)
class EffectPreview:
    """A complete Effect Set preview, immutable, named by ``effect_preview_cid``.

    ``run_identity_cid`` and ``authoring_context`` (which carries the
    ``logical_request_scope`` the keys were derived under) travel with the
    preview but are outside its semantic CID. ``executed`` is always false.
    """

    pilot_id: str
    target: str
    caller_input_intent_cid: str
    members: tuple[MemberPreview, ...]
    effect_preview_cid: str
    run_identity_cid: str
    authoring_context: FrozenJSON

    @property
    def logical_request_scope(self) -> str:
        """The §11.1 scope the row and apply keys bind."""
        return str(self.authoring_context["logical_request_scope"])

    def member(self, effect_id: str) -> MemberPreview:
        """The member called ``effect_id``; ``KeyError`` if there is none."""
        for member in self.members:
            if member.effect_id == effect_id:
                return member
        raise KeyError(effect_id)

    def rows(self) -> Iterator[tuple[MemberPreview, RowPreview]]:
        """Every ``(member, row)`` in dispatch order: members as declared, rows canonical."""
        for member in self.members:
            for row in member.changes:
                yield member, row

    def to_json(self) -> dict[str, Any]:
        """The transported preview object."""
        return {"version": cids.PREVIEW_VERSION, "pilot_id": self.pilot_id,
                "target": self.target, "caller_input_intent_cid": self.caller_input_intent_cid,
                "members": [member.to_json() for member in self.members], "executed": False,
                "effect_preview_cid": self.effect_preview_cid,
                "run_identity_cid": self.run_identity_cid,
                "authoring_context": thaw(self.authoring_context)}


# -- building ------------------------------------------------------------------------


def _failed(message: str, rule: str, **detail: Any) -> PreviewFailed:
    return PreviewFailed(message, detail={"rule": rule, **detail})


def _read(reads: Mapping[str, Any], member: BoundMember, key: str) -> dict[str, Any]:
    eid = member.declaration.effect_id
    if key not in reads:
        raise _failed(f"{eid}: no read of row {key}", "missing_read", effect_id=eid, row=key)
    try:
        state = cids.check_row_state(reads[key], f"{eid} read of {key}")
    except EffectPreviewInvalid as exc:
        raise _failed(exc.message, "read_state", effect_id=eid, row=key) from None
    if state["state"] not in ("present", "absent"):
        raise _failed(f"{eid}: a read row is present or absent, not {state['state']}",
                      "read_state", effect_id=eid, row=key)
    return state


def _merge(member: BoundMember, before: dict[str, Any], values: Mapping[str, Any],
           key: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(before["value"]))
    if unknown:
        eid = member.declaration.effect_id
        raise _failed(f"{eid}: row {key} has no column(s) {', '.join(unknown)}",
                      "unknown_column", effect_id=eid, row=key, columns=unknown)
    return {**before["value"], **values}


def _row_states(member: BoundMember, reads: Mapping[str, Any], identity: dict[str, Any],
                values: dict[str, Any], read_key: str | None
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(before, after, target_version)`` of one row under ``full_diff``."""
    decl = member.declaration
    if decl.fence is not None and read_key is not None:
        read = _read(reads, member, read_key)
        return fenced_states(read, decl.fence, lambda: _row_states(
            replace(member, declaration=replace(decl, fence=None)), reads, identity, values,
            read_key))
    eid = decl.effect_id
    if decl.kind is Kind.COMMAND:
        return dict(cids.NOT_APPLICABLE), dict(cids.NOT_APPLICABLE), dict(
            cids.NOT_APPLICABLE_GUARD)
    if decl.kind is Kind.CREATE:
        if read_key is None:
            return dict(cids.ABSENT), cids.present(values), dict(cids.NOT_APPLICABLE_GUARD)
        read = _read(reads, member, read_key)
        if read["state"] != "absent":
            raise _failed(f"{eid}: row {read_key} to create already exists",
                          "create_target_present", effect_id=eid, row=read_key)
        return dict(cids.ABSENT), cids.present(values), cids.row_content_guard(read)
    assert read_key is not None
    read = _read(reads, member, read_key)
    guard = cids.row_content_guard(read)
    if decl.kind is Kind.UPSERT:
        if read["state"] == "absent":
            return read, cids.present({**identity, **values}), guard
        return read, cids.present(_merge(member, read, values, read_key)), guard
    if read["state"] == "absent":
        rule = "update_target_absent" if decl.kind is Kind.UPDATE else "delete_target_absent"
        raise _failed(f"{eid}: row {read_key} to {decl.kind} does not exist", rule,
                      effect_id=eid, row=read_key)
    if decl.kind is Kind.UPDATE:
        return read, cids.present(_merge(member, read, values, read_key)), guard
    return read, dict(cids.ABSENT), guard


def _strength_of(strength: Strength | Mapping[str, Strength], effect_id: str) -> Strength:
    if isinstance(strength, Mapping):
        return Strength(strength.get(effect_id, Strength.FULL_DIFF))
    return Strength(strength)


def build_preview(
    bound: BoundEffectSet,
    reads: Mapping[str, Mapping[str, Any]],
    *,
    pilot_id: str,
    target: str,
    logical_request_scope: str,
    run_identity_cid: str,
    strength: Strength | Mapping[str, Strength] = Strength.FULL_DIFF,
    previewed_at: str | None = None,
) -> EffectPreview:
    """Build the preview of ``bound`` from the target's ``reads``.

    ``reads[effect_id][read_key]`` is the row state (``present`` with the
    complete row, or ``absent``) the target returned for each row the member
    reads (:attr:`BoundItem.read_key`: update, upsert, delete, and create with a
    key); a member that reads nothing needs no entry. A missing read, a read
    nobody asked for, or a read that contradicts the kind is
    :class:`PreviewFailed` (rules ``missing_read``, ``unexpected_read``,
    ``read_state``, ``create_target_present``, ``update_target_absent``,
    ``delete_target_absent``, ``unknown_column``). ``strength`` is one for all
    members or one per ``effect_id`` (default ``full_diff``).
    """
    for name, value in (("logical_request_scope", logical_request_scope),
                        ("run_identity_cid", run_identity_cid)):
        if not is_cid(value):
            raise EffectPreviewInvalid(f"{name} must be a CID, got {value!r}",
                                       detail={"rule": "binding"})
    member_objects = [_member_preview(member, reads.get(member.declaration.effect_id, {}),
                                      strength) for member in bound.members]
    body = {"version": cids.PREVIEW_VERSION, "pilot_id": pilot_id, "target": target,
            "caller_input_intent_cid": bound.caller_input_intent_cid,
            "members": member_objects, "executed": False}
    set_cid = cids.effect_preview_cid(body)
    context = {"logical_request_scope": logical_request_scope, "previewed_at": previewed_at}
    return _assemble(body, set_cid, run_identity_cid, context)


def _member_preview(member: BoundMember, member_reads: Mapping[str, Any],
                    strength: Strength | Mapping[str, Strength]) -> dict[str, Any]:
    """One member's preview object: every item's before, after and guard, and its CID."""
    decl = member.declaration
    wanted = {item.read_key for item in member.items if item.read_key is not None}
    unexpected = sorted(set(member_reads) - wanted)
    if unexpected:
        raise _failed(f"{decl.effect_id}: a read of row {unexpected[0]} that the member "
                      "does not change", "unexpected_read", effect_id=decl.effect_id,
                      row=unexpected[0])
    how = _strength_of(strength, decl.effect_id)
    changes = []
    for item in member.items:
        identity, values = thaw(item.row_or_item_key), thaw(item.values)
        before, after, guard = _row_states(member, member_reads, identity, values,
                                           item.read_key)
        if how is Strength.TARGETED and decl.kind is not Kind.COMMAND:
            before = dict(cids.UNAVAILABLE)
            after = dict(cids.ABSENT if decl.kind is Kind.DELETE else cids.UNAVAILABLE)
        change = {"row_or_item_key": identity, "before": before, "after": after,
                  "intended_changes": {"values": values}, "target_version": guard}
        change = {"row_preview_cid": cids.row_preview_cid(
            effect_id=decl.effect_id, kind=decl.kind.value, table=decl.table, **change),
            **change}
        changes.append(change)
    member_object = {**_declared(decl), "strength": how.value,
                     "item_count": member.item_count, "changes": changes}
    member_object["effect_member_preview_cid"] = cids.effect_member_preview_cid(member_object)
    return member_object


def _declared(decl: Any) -> dict[str, Any]:
    return decl.to_json()  # fence (only when declared) included


def _assemble(body: Mapping[str, Any], set_cid: str, run_identity_cid: str,
              context: Mapping[str, Any]) -> EffectPreview:
    """Step 4: derive the keys from the established set CID and freeze everything."""
    scope = context["logical_request_scope"]
    members = []
    for m in body["members"]:
        rows = tuple(
            RowPreview(
                row_preview_cid=c["row_preview_cid"], row_or_item_key=freeze(c["row_or_item_key"]),
                before=freeze(c["before"]), after=freeze(c["after"]),
                intended_changes=freeze(c["intended_changes"]),
                target_version=freeze(c["target_version"]),
                row_idempotency_key=cids.row_idempotency_key(scope, set_cid,
                                                             c["row_or_item_key"]))
            for c in m["changes"])
        members.append(MemberPreview(
            effect_id=m["effect_id"], kind=Kind(m["kind"]), table=m["table"],
            key=tuple(m["key"]), command=m["command"],
            failure_policy=FailurePolicy(m["failure_policy"]), max_items=m["max_items"],
            strength=Strength(m["strength"]), changes=rows,
            effect_member_preview_cid=m["effect_member_preview_cid"],
            effect_apply_key=cids.effect_apply_key(scope, set_cid, m["effect_id"],
                                                   m["effect_member_preview_cid"]),
            fence=freeze(m["fence"]) if m.get("fence") is not None else None))
    return EffectPreview(
        pilot_id=body["pilot_id"], target=body["target"],
        caller_input_intent_cid=body["caller_input_intent_cid"], members=tuple(members),
        effect_preview_cid=set_cid, run_identity_cid=run_identity_cid,
        authoring_context=freeze(dict(context)))


# -- verifying a transported preview -------------------------------------------------

_PREVIEW_FIELDS = {"version", "pilot_id", "target", "caller_input_intent_cid", "members",
                   "executed", "effect_preview_cid", "run_identity_cid", "authoring_context"}
_MEMBER_FIELDS = {"effect_id", "kind", "table", "key", "command", "failure_policy", "max_items",
                  "strength", "item_count", "changes", "effect_member_preview_cid"}
_CHANGE_FIELDS = {"row_preview_cid", "row_or_item_key", "before", "after", "intended_changes",
                  "target_version", "row_idempotency_key"}


def _invalid(message: str, rule: str, **detail: Any) -> EffectPreviewInvalid:
    return EffectPreviewInvalid(message, detail={"rule": rule, **detail})


def _fields(obj: object, fields: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, Mapping) or set(obj) != fields:
        got = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise _invalid(f"{where} must have exactly the fields {sorted(fields)}; got {got}",
                       "shape", where=where)
    return thaw(obj)


def verify_preview(obj: Mapping[str, Any]) -> EffectPreview:
    """Re-establish a transported preview: shape, then row CIDs, member CIDs, the set CID,
    and only then its row keys — every one must equal what it carries.

    Raises :class:`EffectPreviewInvalid` (rules ``shape``, ``version``,
    ``executed``, ``row_preview_cid``, ``effect_member_preview_cid``,
    ``item_count``, ``effect_preview_cid``, ``row_idempotency_key``).
    """
    body = _fields(obj, _PREVIEW_FIELDS, "preview")
    if body["version"] != cids.PREVIEW_VERSION:
        raise _invalid(f"version must be {cids.PREVIEW_VERSION}", "version")
    if body["executed"] is not False:
        raise _invalid("a preview reports executed: false", "executed")
    context = _fields(body["authoring_context"], {"logical_request_scope", "previewed_at"},
                      "authoring_context")
    if not isinstance(body["members"], list) or not body["members"]:
        raise _invalid("members must be a non-empty list", "shape")
    for m_index, member in enumerate(body["members"]):
        member = _fields(member, _MEMBER_FIELDS | ({"fence"} if isinstance(member, Mapping)
                                                   and "fence" in member else set()),
                         f"members[{m_index}]")
        for name, enum_type in (("kind", Kind), ("strength", Strength),
                                ("failure_policy", FailurePolicy)):
            if member[name] not in {e.value for e in enum_type}:
                raise _invalid(f"members[{m_index}].{name} {member[name]!r} is not one of "
                               f"{', '.join(e.value for e in enum_type)}", "shape")
        if not isinstance(member["changes"], list):
            raise _invalid(f"members[{m_index}].changes must be a list", "shape")
        for r_index, change in enumerate(member["changes"]):
            change = _fields(change, _CHANGE_FIELDS, f"members[{m_index}].changes[{r_index}]")
            parts = {k: change[k] for k in ("row_or_item_key", "before", "after",
                                            "intended_changes", "target_version")}
            if change["row_preview_cid"] != cids.row_preview_cid(
                    effect_id=member["effect_id"], kind=member["kind"], table=member["table"],
                    **parts):
                raise _invalid(f"members[{m_index}].changes[{r_index}]: row_preview_cid does "
                               "not match its row", "row_preview_cid")
        if member["item_count"] != len(member["changes"]):
            raise _invalid(f"members[{m_index}]: item_count is not its number of rows",
                           "item_count")
        if member["effect_member_preview_cid"] != cids.effect_member_preview_cid(member):
            raise _invalid(f"members[{m_index}]: effect_member_preview_cid does not match",
                           "effect_member_preview_cid")
    set_cid = cids.effect_preview_cid(body)
    if body["effect_preview_cid"] != set_cid:
        raise _invalid("effect_preview_cid does not match the preview", "effect_preview_cid")
    preview = _assemble(body, set_cid, body["run_identity_cid"], context)
    for (member, row), change in zip(
            preview.rows(), (c for m in body["members"] for c in m["changes"]), strict=True):
        if change["row_idempotency_key"] != row.row_idempotency_key:
            raise _invalid(f"{member.effect_id}: a row_idempotency_key is not the one its "
                           "scope, preview and row derive", "row_idempotency_key",
                           row_preview_cid=row.row_preview_cid)
    return preview


# -- apply admission's freshness check -------------------------------------------------


def check_fresh(
    preview: EffectPreview,
    current_target_versions: Mapping[str, str],
    *,
    bindings: Mapping[str, str] | None = None,
    current_bindings: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`StalePreview` unless every guarded row's current version is its guard.

    ``current_target_versions`` is keyed by ``row_preview_cid``; its value the
    target's current version CID of that row. A guarded row without an entry
    is a mismatch (missing evidence is not a waiver), and so is an entry for a
    row that has no guard or is not in the preview. ``bindings`` /
    ``current_bindings`` compare the other bound CIDs apply admission
    revalidates (authority scope, capability evidence, …): any difference is
    stale too. On a stale preview every row stays unattempted.
    """
    mismatched: list[str] = []
    missing: list[str] = []
    guarded: set[str] = set()
    for _, row in preview.rows():
        guard = row.target_version
        if guard["kind"] == "not_applicable":
            continue
        guarded.add(row.row_preview_cid)
        current = current_target_versions.get(row.row_preview_cid)
        if current is None:
            missing.append(row.row_preview_cid)
        elif current != guard["cid"]:
            mismatched.append(row.row_preview_cid)
    unexpected = sorted(set(current_target_versions) - guarded)
    changed = sorted(
        name for name in set(bindings or {}) | set(current_bindings or {})
        if (bindings or {}).get(name) != (current_bindings or {}).get(name))
    if mismatched or missing or unexpected or changed:
        raise StalePreview(
            f"the preview {preview.effect_preview_cid} is stale: {len(mismatched)} row(s) "
            f"changed, {len(missing)} without evidence, {len(unexpected)} unexpected, "
            f"binding(s) changed: {', '.join(changed) or 'none'}; nothing was applied, and "
            "no attempt can apply this preview: re-request, so a new preview is taken and "
            "approved",
            detail={"mismatched": mismatched, "missing": missing, "unexpected": unexpected,
                    "bindings": changed})
