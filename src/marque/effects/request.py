"""What a preview of an Effect Set is asked for with: the declaration, its captured inputs and
the bindings its keys derive from (pure; no I/O).

A preview token (DESIGN §10) carries a statement change or, for an Effect Set,
``change: {effect_set: <request>}`` with the request's closed shape::

    {version: "marque-effect-preview-request/0.1",
     declaration: <the parsed declaration, as EffectSetDeclaration.to_json()>,
     inputs: {effect_id: {version: "marque-effect-input/0.1", columns, rows}},
     logical_request_scope: CID, run_identity_cid: CID,
     strength: {effect_id: "full_diff" | "targeted"}}

Inputs travel as captured relations (their content, not the source file's
bytes), so the Pilot re-captures them to the same ``input_cid`` — a CSV input
and the JSON rows it was captured as are one relation. Every refusal is the
caller's ``error`` (``marque_invalid`` for a token), naming the rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marque.cid import canonicalize, cid, is_cid
from marque.effects import cids
from marque.effects.declare import (
    BoundEffectSet,
    EffectSetDeclaration,
    InputRelation,
    bind,
    capture_input,
    parse_declaration,
)
from marque.effects.preview import Strength
from marque.errors import EffectInputInvalid, MarqueError, MarqueInvalid

__all__ = ["REQUEST_VERSION", "RUN_IDENTITY_VERSION", "EffectPreviewRequest",
           "EffectSetSubmission", "relation_from_json", "run_identity_cid"]

REQUEST_VERSION = "marque-effect-preview-request/0.1"
#: Marque's Run identity for an Effect-only Run (the seed leaves its preimage to the Host).
RUN_IDENTITY_VERSION = "marque-effect-run/0.1"
_FIELDS = {"version", "declaration", "inputs", "logical_request_scope", "run_identity_cid",
           "strength"}
_SUBMISSION_FIELDS = frozenset({"declaration", "inputs", "strength"})


def run_identity_cid(logical_request_scope: str, bound: BoundEffectSet, run: str = "1") -> str:
    """``CID({version: "marque-effect-run/0.1", logical_request_scope, declaration_cid,
    caller_input_intent_cid, run})``: the Run a local preview belongs to (``run`` tells
    physical Runs of one logical request apart; ``"1"`` for the first)."""
    return cid({"version": RUN_IDENTITY_VERSION, "logical_request_scope": logical_request_scope,
                "declaration_cid": bound.declaration.declaration_cid,
                "caller_input_intent_cid": bound.caller_input_intent_cid, "run": run})


def relation_from_json(value: object) -> InputRelation:
    """An :class:`InputRelation` from its content ``{version, columns, rows}`` (as
    :meth:`InputRelation.to_json` gives it); re-captured, so its ``input_cid`` is
    recomputed, never believed. Raises :class:`EffectInputInvalid`."""
    if (not isinstance(value, dict) or set(value) != {"version", "columns", "rows"}
            or value["version"] != cids.INPUT_VERSION or not isinstance(value["rows"], list)
            or not isinstance(value["columns"], list)
            or not all(isinstance(c, str) for c in value["columns"])):
        raise EffectInputInvalid(
            f"an input relation is {{version: {cids.INPUT_VERSION!r}, columns, rows}}",
            detail={"rule": "shape"})
    data = json.dumps(value["rows"]).encode("utf-8")
    relation = capture_input(data, "json")
    columns = sorted(value["columns"], key=lambda c: c.encode("utf-16-be"))
    if relation.rows and list(relation.columns) != columns:
        raise EffectInputInvalid("an input relation's columns are its rows' columns",
                                 detail={"rule": "columns_differ"})
    if not relation.rows:  # an empty relation keeps its declared columns
        relation = InputRelation(tuple(columns), (), cids.input_cid(columns, []), "json",
                                 hashlib.sha256(canonicalize(value)).hexdigest(),
                                 len(canonicalize(value)))
    return relation


@dataclass(frozen=True)
class EffectPreviewRequest:
    """A request to preview one Effect Set: declaration, inputs and bindings (immutable)."""

    declaration: EffectSetDeclaration
    inputs: Mapping[str, InputRelation]
    logical_request_scope: str
    run_identity_cid: str
    strength: Mapping[str, Strength]

    def bound(self) -> BoundEffectSet:
        """Every member bound to its relation (:func:`marque.effects.declare.bind`)."""
        return bind(self.declaration, self.inputs)

    def to_json(self) -> dict[str, Any]:
        """The request's closed JSON shape (see the module docstring)."""
        return {"version": REQUEST_VERSION, "declaration": self.declaration.to_json(),
                "inputs": {eid: rel.to_json() for eid, rel in sorted(self.inputs.items())},
                "logical_request_scope": self.logical_request_scope,
                "run_identity_cid": self.run_identity_cid,
                "strength": {eid: Strength(s).value for eid, s in sorted(self.strength.items())}}

    def to_claim(self) -> dict[str, Any]:
        """The preview token's ``change`` claim: ``{effect_set: <request>}``."""
        return {"effect_set": self.to_json()}

    @classmethod
    def from_json(cls, value: object,
                  error: type[MarqueError] = MarqueInvalid) -> EffectPreviewRequest:
        """Read a request strictly; any deviation is ``error`` (the cause's message kept)."""
        if not isinstance(value, dict) or set(value) != _FIELDS:
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise error(f"an Effect Set preview request has exactly the fields "
                        f"{sorted(_FIELDS)}; got {got}")
        if value["version"] != REQUEST_VERSION:
            raise error(f"an Effect Set preview request's version is {REQUEST_VERSION!r}")
        for name in ("logical_request_scope", "run_identity_cid"):
            if not isinstance(value[name], str) or not is_cid(value[name]):
                raise error(f"{name} must be a CID")
        if not isinstance(value["inputs"], dict) or not isinstance(value["strength"], dict):
            raise error("inputs and strength are objects keyed by effect_id")
        try:
            declaration = parse_declaration(value["declaration"])
            inputs = {str(eid): relation_from_json(rel) for eid, rel in value["inputs"].items()}
            strength = {str(eid): Strength(s) for eid, s in value["strength"].items()}
        except ValueError as exc:
            raise error(f"strength: {exc}") from None
        except MarqueError as exc:
            if isinstance(exc, error):
                raise
            raise error(f"Effect Set preview request: {exc.message}",
                        detail={"cause": exc.code, **exc.detail}) from exc
        unknown = sorted(set(strength) - {m.effect_id for m in declaration.members})
        if unknown:
            raise error(f"strength names no member {unknown[0]!r}")
        return cls(declaration, inputs, value["logical_request_scope"],
                   value["run_identity_cid"], strength)

    @classmethod
    def from_claim(cls, data: object) -> EffectPreviewRequest:
        """Read a preview token's ``change: {effect_set: …}`` claim (:class:`MarqueInvalid`)."""
        if not isinstance(data, dict) or set(data) != {"effect_set"}:
            raise MarqueInvalid("an Effect Set preview's change is {effect_set: <request>}")
        return cls.from_json(data["effect_set"])


@dataclass(frozen=True)
class EffectSetSubmission:
    """What a caller asks a Harbourmaster for (``change: {effect_set: …}`` of ``POST
    /v1/requests``): a declaration, its captured inputs and the strength per member.

    The JSON shape is ``{declaration, inputs: {effect_id: {version, columns, rows}},
    strength?: {effect_id: full_diff | targeted}}``; inputs are captured relations (the
    CLI reads each member's ``input`` file and sends its content). Reading it binds
    every member to its relation, so every declaration, input and binding rule is
    checked before anything is stored. The bindings (request scope, Run) are the
    Harbourmaster's, added by :meth:`preview_request`.
    """

    declaration: EffectSetDeclaration
    inputs: Mapping[str, InputRelation]
    strength: Mapping[str, Strength]

    def bound(self) -> BoundEffectSet:
        """Every member bound to its relation (:func:`marque.effects.declare.bind`)."""
        return bind(self.declaration, self.inputs)

    @property
    def caller_input_intent_cid(self) -> str:
        """The captured inputs' ``caller_input_intent_cid`` (never ``NoInputIntent``)."""
        return self.bound().caller_input_intent_cid

    def to_json(self) -> dict[str, Any]:
        """``{declaration, inputs, strength}``, canonical: what the request stores."""
        return {"declaration": self.declaration.to_json(),
                "inputs": {eid: rel.to_json() for eid, rel in sorted(self.inputs.items())},
                "strength": {eid: Strength(s).value for eid, s in sorted(self.strength.items())}}

    def to_claim(self) -> dict[str, Any]:
        """The stored request change: ``{effect_set: <to_json>, change_cid}``, ``change_cid``
        being the CID of ``{effect_set}`` (DESIGN §8: the CID of the claim without it)."""
        body = {"effect_set": self.to_json()}
        return {**body, "change_cid": cid(body)}

    @property
    def change_cid(self) -> str:
        """``CID({effect_set: <to_json>})``: the request's change, before any preview."""
        return cid({"effect_set": self.to_json()})

    def preview_request(self, logical_request_scope: str) -> EffectPreviewRequest:
        """The Pilot's preview request for this submission under ``logical_request_scope``
        (its Run: :func:`run_identity_cid` of that scope, run ``"1"``)."""
        return EffectPreviewRequest(self.declaration, dict(self.inputs), logical_request_scope,
                                    run_identity_cid(logical_request_scope, self.bound()),
                                    dict(self.strength))

    @classmethod
    def from_json(cls, value: object,
                  error: type[MarqueError] = MarqueInvalid) -> EffectSetSubmission:
        """Read a submission strictly and bind it. Declaration, input and binding refusals
        keep their own codes (``effect_declaration_invalid``, ``effect_input_invalid``,
        ``effect_duplicate_identity``, ``effect_max_items_exceeded``); a wrong shape is
        ``error``."""
        if not isinstance(value, dict) or not {"declaration", "inputs"} <= set(value) \
                or set(value) - _SUBMISSION_FIELDS:
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise error("change.effect_set is {declaration, inputs, strength?}; got "
                        f"{got}")
        inputs_raw = value["inputs"]
        strength_raw = value.get("strength") or {}
        if not isinstance(inputs_raw, dict) or not isinstance(strength_raw, dict):
            raise error("change.effect_set.inputs and .strength are objects keyed by effect_id")
        declaration = parse_declaration(value["declaration"])
        inputs = {str(eid): relation_from_json(rel) for eid, rel in inputs_raw.items()}
        try:
            strength = {str(eid): Strength(s) for eid, s in strength_raw.items()}
        except ValueError as exc:
            raise error(f"change.effect_set.strength: {exc}") from None
        unknown = sorted(set(strength) - {m.effect_id for m in declaration.members})
        if unknown:
            raise error(f"change.effect_set.strength names no member {unknown[0]!r}")
        made = cls(declaration, inputs, strength)
        made.bound()  # every binding rule, before anything is stored
        return made

    @classmethod
    def from_claim(cls, data: object) -> EffectSetSubmission:
        """Read a stored request change ``{effect_set, change_cid}`` back, checking its CID."""
        if not isinstance(data, dict) or set(data) != {"effect_set", "change_cid"}:
            raise MarqueInvalid("an Effect Set request's change is {effect_set, change_cid}")
        made = cls.from_json(data["effect_set"])
        if made.change_cid != data["change_cid"]:
            raise MarqueInvalid("change_cid does not match the Effect Set it names")
        return made
