"""Every closed preimage of an Effect Set, written once (DESIGN §8, seed 002).

``cid(obj) = "sha256:" + hex(sha256(JCS(obj)))`` over RFC 8785 canonical JSON
(:mod:`marque.cid`). The seed fixes the order in which the identities of one
preview are established, and this module follows it:

1. **row preview CIDs** — Marque's own preimage (the seed names the row CID but
   spells out its preimage elsewhere), versioned ``marque-effect-row-preview/0.1``::

       CID({version: "marque-effect-row-preview/0.1", effect_id, kind, table,
            row_or_item_key, before, after, intended_changes, target_version})

2. **member CIDs** — ``CID({version: "actql-effect-member-preview/0.1", member})``
   where ``member`` is the complete member object without its
   ``effect_member_preview_cid`` and without every ``changes[].row_idempotency_key``;
3. **the set** ``effect_preview_cid`` — the CID of the complete preview body
   without ``effect_preview_cid``, ``run_identity_cid``, ``authoring_context``
   and every ``changes[].row_idempotency_key`` (member CIDs stay in it);
4. only then the **row idempotency keys**
   ``CID({version: "actql-row-idempotency-key/0.1", logical_request_scope_cid,
   effect_preview_cid, row_or_item_key})`` and the **Effect apply keys**
   ``CID({version: "actql-effect-apply-idempotency-key/0.1",
   logical_request_scope_cid, effect_preview_cid, effect_id,
   effect_member_preview_cid})``.

Row identities (``row_or_item_key``): for update, upsert and delete the
target primary-key value ``{column: value}``; for create ``{content_cid,
occurrence}`` with ``content_cid = CID({version: "actql-effect-content-row/0.1",
value: after})`` (``after`` being the row the create writes); for command
``{command, target, payload_cid}`` with Marque's payload preimage
``CID({version: "marque-effect-command-payload/0.1", value: payload})``.

Row states are closed objects: ``{state: "present", value: {…}}`` (a present
empty row is ``{state: "present", value: {}}``), ``{state: "absent"}``,
``{state: "unavailable"}``, ``{state: "not_applicable"}`` — never ``null``, an
omission or ``{}``. A row's target version guard is ``{kind: "row_content",
cid}`` with ``cid = CID({version: "marque-effect-row-version/0.1", row:
<before state>})``, or ``{kind: "not_applicable"}`` where nothing is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marque.cid import cid, is_cid
from marque.effects._frozen import thaw
from marque.errors import EffectPreviewInvalid

__all__ = [
    "ROW_PREVIEW_VERSION", "MEMBER_PREVIEW_VERSION", "PREVIEW_VERSION", "ROW_KEY_VERSION",
    "APPLY_KEY_VERSION", "CONTENT_ROW_VERSION", "ROW_VERSION_VERSION",
    "COMMAND_PAYLOAD_VERSION", "INPUT_VERSION", "INPUT_INTENT_VERSION", "ROW_STATES",
    "present", "ABSENT", "UNAVAILABLE", "NOT_APPLICABLE", "check_row_state",
    "row_content_guard", "NOT_APPLICABLE_GUARD", "check_guard",
    "content_cid", "command_payload_cid", "row_version_cid", "row_preview_cid",
    "member_semantic_body", "effect_member_preview_cid", "preview_semantic_body",
    "effect_preview_cid", "row_idempotency_key", "effect_apply_key", "input_cid",
    "caller_input_intent_cid",
]

ROW_PREVIEW_VERSION = "marque-effect-row-preview/0.1"
MEMBER_PREVIEW_VERSION = "actql-effect-member-preview/0.1"
PREVIEW_VERSION = "actql-effect-preview/0.1"
ROW_KEY_VERSION = "actql-row-idempotency-key/0.1"
APPLY_KEY_VERSION = "actql-effect-apply-idempotency-key/0.1"
CONTENT_ROW_VERSION = "actql-effect-content-row/0.1"
ROW_VERSION_VERSION = "marque-effect-row-version/0.1"
COMMAND_PAYLOAD_VERSION = "marque-effect-command-payload/0.1"
INPUT_VERSION = "marque-effect-input/0.1"
INPUT_INTENT_VERSION = "marque-caller-input-intent/0.1"

#: The closed set of row states (seed 002, "Effect preview, approval, and application").
ROW_STATES = frozenset({"present", "absent", "unavailable", "not_applicable"})

#: The fields the set preimage leaves out (seed 002); nothing else is excluded.
PREVIEW_EXCLUDED = ("effect_preview_cid", "run_identity_cid", "authoring_context")


# -- row states and guards ----------------------------------------------------------


def present(value: Mapping[str, Any]) -> dict[str, Any]:
    """``{state: "present", value}``: an observed before row or a proposed complete after row."""
    return {"state": "present", "value": thaw(value)}


ABSENT: Mapping[str, str] = {"state": "absent"}
UNAVAILABLE: Mapping[str, str] = {"state": "unavailable"}
NOT_APPLICABLE: Mapping[str, str] = {"state": "not_applicable"}


def check_row_state(value: object, where: str = "state") -> dict[str, Any]:
    """``value`` as a row state if it is exactly one of the four closed encodings, else raise.

    ``present`` needs a ``value`` object (``{}`` for a present empty row); the
    other three carry nothing else. ``None``, ``{}`` or an omitted field is no
    state at all. Raises :class:`EffectPreviewInvalid`.
    """
    value = thaw(value)
    if not isinstance(value, dict) or value.get("state") not in ROW_STATES:
        raise EffectPreviewInvalid(
            f"{where} must be a row state object with state one of "
            f"{', '.join(sorted(ROW_STATES))}; got {value!r}", detail={"rule": "row_state"})
    expected = {"state", "value"} if value["state"] == "present" else {"state"}
    if set(value) != expected:
        raise EffectPreviewInvalid(
            f"{where}: a {value['state']} row state has exactly the fields "
            f"{', '.join(sorted(expected))}", detail={"rule": "row_state"})
    if value["state"] == "present" and not isinstance(value["value"], dict):
        raise EffectPreviewInvalid(f"{where}: a present row's value must be an object",
                                   detail={"rule": "row_state"})
    return value


def row_version_cid(before: Mapping[str, Any]) -> str:
    """``CID({version: "marque-effect-row-version/0.1", row: before})``: a row's content version.

    For PostgreSQL and SQLite targets the version of a row is the CID of its
    current state (``present`` with its complete value, or ``absent``).
    """
    return cid({"version": ROW_VERSION_VERSION, "row": check_row_state(before, "row")})


def row_content_guard(before: Mapping[str, Any]) -> dict[str, str]:
    """The target version guard ``{kind: "row_content", cid}`` of a row read as ``before``."""
    return {"kind": "row_content", "cid": row_version_cid(before)}


NOT_APPLICABLE_GUARD: Mapping[str, str] = {"kind": "not_applicable"}


def check_guard(value: object) -> dict[str, str]:
    """``value`` if it is a closed guard object, else raise :class:`EffectPreviewInvalid`."""
    value = thaw(value)
    if value == {"kind": "not_applicable"}:
        return value
    if (isinstance(value, dict) and set(value) == {"kind", "cid"}
            and value["kind"] == "row_content" and is_cid(value["cid"])):
        return value
    raise EffectPreviewInvalid(f"target_version must be a closed guard object, got {value!r}",
                               detail={"rule": "guard"})


# -- row identities -------------------------------------------------------------------


def content_cid(after: Mapping[str, Any]) -> str:
    """``CID({version: "actql-effect-content-row/0.1", value: after})`` for a create row."""
    return cid({"version": CONTENT_ROW_VERSION, "value": thaw(after)})


def command_payload_cid(payload: Mapping[str, Any]) -> str:
    """``CID({version: "marque-effect-command-payload/0.1", value: payload})``."""
    return cid({"version": COMMAND_PAYLOAD_VERSION, "value": thaw(payload)})


# -- the preview, in the seed's order ------------------------------------------------


def row_preview_cid(
    *,
    effect_id: str,
    kind: str,
    table: str,
    row_or_item_key: Mapping[str, Any],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    intended_changes: Mapping[str, Any],
    target_version: Mapping[str, Any],
) -> str:
    """Step 1: a row's ``row_preview_cid`` (Marque's ``marque-effect-row-preview/0.1``).

    The member's ``effect_id``, ``kind`` and ``table`` are part of it, so that
    row CIDs are distinct across the whole set (apply admission keys its
    ``current_target_versions`` by them).
    """
    return cid({
        "version": ROW_PREVIEW_VERSION,
        "effect_id": effect_id,
        "kind": kind,
        "table": table,
        "row_or_item_key": thaw(row_or_item_key),
        "before": check_row_state(before, "before"),
        "after": check_row_state(after, "after"),
        "intended_changes": thaw(intended_changes),
        "target_version": check_guard(target_version),
    })


def member_semantic_body(member: Mapping[str, Any]) -> dict[str, Any]:
    """The member without ``effect_member_preview_cid`` and every change's row key."""
    body = {k: thaw(v) for k, v in member.items() if k != "effect_member_preview_cid"}
    body["changes"] = [
        {k: v for k, v in change.items() if k != "row_idempotency_key"}
        for change in body.get("changes", [])
    ]
    return body


def effect_member_preview_cid(member: Mapping[str, Any]) -> str:
    """Step 2: ``CID({version: "actql-effect-member-preview/0.1", member: MemberSemanticBody})``."""
    return cid({"version": MEMBER_PREVIEW_VERSION, "member": member_semantic_body(member)})


def preview_semantic_body(preview: Mapping[str, Any]) -> dict[str, Any]:
    """The preview without ``effect_preview_cid``, ``run_identity_cid``,
    ``authoring_context`` and every ``changes[].row_idempotency_key``; member CIDs stay."""
    body = {k: thaw(v) for k, v in preview.items() if k not in PREVIEW_EXCLUDED}
    members = []
    for member in body.get("members", []):
        member = dict(member)
        member["changes"] = [
            {k: v for k, v in change.items() if k != "row_idempotency_key"}
            for change in member.get("changes", [])
        ]
        members.append(member)
    body["members"] = members
    return body


def effect_preview_cid(preview: Mapping[str, Any]) -> str:
    """Step 3: the set's ``effect_preview_cid``."""
    return cid(preview_semantic_body(preview))


def row_idempotency_key(
    logical_request_scope_cid: str, effect_preview_cid: str, row_or_item_key: Mapping[str, Any]
) -> str:
    """Step 4: ``CID({version: "actql-row-idempotency-key/0.1", logical_request_scope_cid,
    effect_preview_cid, row_or_item_key})`` — the seed's DispatchKey."""
    return cid({
        "version": ROW_KEY_VERSION,
        "logical_request_scope_cid": logical_request_scope_cid,
        "effect_preview_cid": effect_preview_cid,
        "row_or_item_key": thaw(row_or_item_key),
    })


def effect_apply_key(
    logical_request_scope_cid: str,
    effect_preview_cid: str,
    effect_id: str,
    effect_member_preview_cid: str,
) -> str:
    """``CID({version: "actql-effect-apply-idempotency-key/0.1", logical_request_scope_cid,
    effect_preview_cid, effect_id, effect_member_preview_cid})``."""
    return cid({
        "version": APPLY_KEY_VERSION,
        "logical_request_scope_cid": logical_request_scope_cid,
        "effect_preview_cid": effect_preview_cid,
        "effect_id": effect_id,
        "effect_member_preview_cid": effect_member_preview_cid,
    })


# -- the caller's input ---------------------------------------------------------------


def input_cid(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """``CID({version: "marque-effect-input/0.1", columns, rows})`` of a captured relation.

    ``columns`` sorted by UTF-16 code units; ``rows`` the row objects sorted by
    their canonical JSON bytes, so that the identity is the relation's (a
    multiset of rows), not the file's byte order, line endings or key order.
    """
    return cid({"version": INPUT_VERSION, "columns": list(columns),
                "rows": [thaw(row) for row in rows]})


def caller_input_intent_cid(inputs: Mapping[str, str]) -> str:
    """``CID({version: "marque-caller-input-intent/0.1", selection: "effect_inputs",
    inputs: {effect_id: input_cid}})`` — an Effect Set request's ``caller_input_intent_cid``.

    An explicitly selected input — even an empty relation — is not absence, so
    it never equals §11.1's ``NoInputIntent``.
    """
    return cid({"version": INPUT_INTENT_VERSION, "selection": "effect_inputs",
                "inputs": dict(inputs)})
