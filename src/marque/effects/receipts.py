"""Receipts: every preview row accounted for, including the ones nobody can settle yet.

Three content-addressed, immutable kinds (each carries its own CID, left out
of its own preimage — DESIGN §8):

* a **row outcome receipt** (``marque-effect-row-outcome-receipt/0.1``) for each
  row with a terminal typed outcome: the preview, member and row it answers,
  the dispatch and attempt, the closed :data:`EffectOutcome` and its CID;
* a **member receipt** (``marque-effect-member-receipt/0.1``): one ordered
  entry per preview row — terminal rows reference their dispatch, attempt and
  outcome receipt, an unknown row the ledger head instead (never an invented
  outcome), an unattempted row nothing;
* the **set apply receipt** (``marque-effect-set-receipt/0.1``): the preview,
  the authorization evidence, every member receipt exactly once with its
  entry state, and the set status.

Aggregation (seed 002), from the rows' receipt states ``applied | accepted |
failed | unknown | unattempted | rolled_back``:

* a member entry: any unknown → ``unknown``; any failed, or unattempted /
  rolled-back mixed with success → ``failed``; only unattempted →
  ``unattempted``; only rolled back → ``rolled_back``; else any accepted →
  ``accepted``; else ``applied``;
* the set: any unknown → ``unknown_outcome``; success mixed with failed /
  unattempted / rolled-back → ``partial_failure``; only those → ``failed``;
  any accepted → ``accepted``; else ``applied``;
* the Run: any unknown → ``needs_reconciliation``; else any failed,
  unattempted or rolled back → ``failed``; else ``succeeded``.

**Reconciliation receipts** (``actql-effect-reconciliation-receipt/0.1``, the
seed's closed fields) form one :class:`ReconciliationChain` per unknown row.
Each receipt extends the latest with ``attempt_sequence + 1``; an unknown
outcome leaves the chain open, ``applied``/``accepted``/``failed`` close it.
Exact redelivery is idempotent; a different receipt after a terminal one is
``conflict``. Reconciliation observes the old dispatch; it never resends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from marque.cid import cid, is_cid
from marque.effects._frozen import FrozenJSON, freeze, thaw
from marque.effects.declare import Kind
from marque.effects.dispatch import DispatchRecord, DispatchState
from marque.effects.preview import EffectPreview, MemberPreview, RowPreview
from marque.errors import Conflict, EffectReceiptInvalid, ReconciliationInvalid

__all__ = [
    "ROW_OUTCOME_VERSION", "MEMBER_RECEIPT_VERSION", "SET_RECEIPT_VERSION",
    "RECONCILIATION_VERSION", "OUTCOME_VERSION", "ROW_RECEIPT_STATES", "check_outcome",
    "outcome_cid", "row_outcome_receipt", "member_entry_state", "set_status", "run_outcome",
    "MemberReceipt", "member_receipt", "entry_from_ledger", "SetReceipt", "set_receipt",
    "check_authorization", "ReconciliationConflict", "ReconciliationChain", "effective_states",
]

OUTCOME_VERSION = "marque-effect-outcome/0.1"
ROW_OUTCOME_VERSION = "marque-effect-row-outcome-receipt/0.1"
MEMBER_RECEIPT_VERSION = "marque-effect-member-receipt/0.1"
SET_RECEIPT_VERSION = "marque-effect-set-receipt/0.1"
RECONCILIATION_VERSION = "actql-effect-reconciliation-receipt/0.1"

#: A row's state in a member receipt.
ROW_RECEIPT_STATES = frozenset({"applied", "accepted", "failed", "unknown", "unattempted",
                                "rolled_back"})
_SUCCESS = frozenset({"applied", "accepted"})
_NOT_DONE = frozenset({"failed", "unattempted", "rolled_back"})
_TERMINAL_OUTCOMES = frozenset({"applied", "accepted", "failed"})

#: An EffectOutcome: a closed object, one of the four shapes :func:`check_outcome` accepts.
EffectOutcome = Mapping[str, Any]


def _receipt_error(message: str, rule: str, **detail: Any) -> EffectReceiptInvalid:
    return EffectReceiptInvalid(message, detail={"rule": rule, **detail})


# -- typed outcomes --------------------------------------------------------------------

_OUTCOME_FIELDS = {
    "applied": ({"state", "rows_affected"}, {"action"}),
    "accepted": ({"state", "operation_ref"}, set()),
    "failed": ({"state", "error"}, set()),
    "unknown": ({"state", "reason", "idempotency_key"}, set()),
}


def check_outcome(value: object, *, kind: Kind | None = None) -> dict[str, Any]:
    """``value`` if it is one closed EffectOutcome, else :class:`EffectReceiptInvalid`.

    * ``{state: "applied", rows_affected, action?}`` — ``action`` is
      ``created`` or ``updated``, the database's own answer, required for an
      upsert row and refused for any other kind (when ``kind`` is given);
    * ``{state: "accepted", operation_ref}``;
    * ``{state: "failed", error: {code, message}}``;
    * ``{state: "unknown", reason, idempotency_key}``.
    """
    value = thaw(value)
    if not isinstance(value, dict):
        raise _receipt_error(f"an outcome is an object; got {value!r}", "outcome")
    state = value.get("state")
    if state not in _OUTCOME_FIELDS:
        raise _receipt_error(f"an outcome's state is one of {sorted(_OUTCOME_FIELDS)}; got "
                             f"{value!r}", "outcome")
    required, optional = _OUTCOME_FIELDS[state]
    if not required <= set(value) <= required | optional:
        raise _receipt_error(f"a {state} outcome has the fields {sorted(required)}"
                             f"{' and optionally ' + str(sorted(optional)) if optional else ''}",
                             "outcome")
    ok = True
    if state == "applied":
        rows = value["rows_affected"]
        ok = isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0
        if "action" in value and value["action"] not in ("created", "updated"):
            ok = False
        if kind is not None and (kind is Kind.UPSERT) != ("action" in value):
            raise _receipt_error("an applied upsert row carries action created|updated (the "
                                 "database's answer); no other kind does", "outcome_action")
    elif state == "accepted":
        ok = isinstance(value["operation_ref"], str) and bool(value["operation_ref"])
    elif state == "failed":
        error = value["error"]
        ok = (isinstance(error, dict) and set(error) == {"code", "message"}
              and all(isinstance(error[k], str) and error[k] for k in ("code",))
              and isinstance(error["message"], str))
    else:
        ok = (isinstance(value["reason"], str) and bool(value["reason"])
              and is_cid(value["idempotency_key"]))
    if not ok:
        raise _receipt_error(f"a {state} outcome has a malformed field: {value!r}", "outcome")
    return value


def outcome_cid(outcome: EffectOutcome) -> str:
    """``CID({version: "marque-effect-outcome/0.1", outcome})``, computed independently."""
    return cid({"version": OUTCOME_VERSION, "outcome": check_outcome(outcome)})


def _self_cid(body: dict[str, Any], field: str) -> dict[str, Any]:
    body[field] = cid(body, exclude=field)
    return body


def row_outcome_receipt(preview: EffectPreview, member: MemberPreview, row: RowPreview, *,
                        dispatch_entry_cid: str, attempt: int,
                        outcome: EffectOutcome) -> FrozenJSON:
    """The typed outcome receipt of one row's terminal outcome (frozen, with ``receipt_cid``)."""
    checked = check_outcome(outcome, kind=member.kind)
    if checked["state"] not in _TERMINAL_OUTCOMES:
        raise _receipt_error("an unknown row has no outcome receipt: its member receipt "
                             "references the ledger head instead", "not_terminal")
    if not is_cid(dispatch_entry_cid) or not isinstance(attempt, int) or attempt < 1:
        raise _receipt_error("a row outcome receipt names its dispatch and attempt (>= 1)",
                             "dispatch")
    return freeze(_self_cid({
        "version": ROW_OUTCOME_VERSION, "effect_preview_cid": preview.effect_preview_cid,
        "effect_member_preview_cid": member.effect_member_preview_cid,
        "row_preview_cid": row.row_preview_cid, "dispatch_entry_cid": dispatch_entry_cid,
        "attempt": attempt, "outcome": checked, "outcome_cid": outcome_cid(checked)},
        "receipt_cid"))


# -- aggregation ----------------------------------------------------------------------


def _states(states: Iterable[str]) -> set[str]:
    seen = set(states)
    unknown = seen - ROW_RECEIPT_STATES
    if unknown:
        raise _receipt_error(f"not a row receipt state: {sorted(unknown)}", "state")
    return seen


def member_entry_state(states: Iterable[str]) -> str:
    """A member's entry state in the set receipt, from its rows' states (seed 002).

    A member with no rows is ``applied`` (a typed empty result keeps its
    successful zero-item meaning).
    """
    seen = _states(states)
    if "unknown" in seen:
        return "unknown"
    if "failed" in seen or (seen & {"unattempted", "rolled_back"} and seen & _SUCCESS):
        return "failed"
    if seen == {"unattempted"}:
        return "unattempted"
    if seen == {"rolled_back"}:
        return "rolled_back"
    if seen == {"unattempted", "rolled_back"}:
        return "failed"
    return "accepted" if "accepted" in seen else "applied"


def set_status(states: Iterable[str]) -> str:
    """The set apply receipt's status from every row of every member (seed 002)."""
    seen = _states(states)
    if "unknown" in seen:
        return "unknown_outcome"
    if seen & _SUCCESS and seen & _NOT_DONE:
        return "partial_failure"
    if seen & _NOT_DONE:
        return "failed"
    return "accepted" if "accepted" in seen else "applied"


def run_outcome(states: Iterable[str]) -> str:
    """The Run's state from every row's latest outcome, the seed's table top to bottom."""
    seen = _states(states)
    if "unknown" in seen:
        return "needs_reconciliation"
    if seen & _NOT_DONE:
        return "failed"
    return "succeeded"


# -- member receipts ------------------------------------------------------------------

_ENTRY_FIELDS = {
    "applied": {"dispatch_entry_cid", "attempt", "outcome_receipt_cid"},
    "accepted": {"dispatch_entry_cid", "attempt", "outcome_receipt_cid"},
    "failed": {"dispatch_entry_cid", "attempt", "outcome_receipt_cid"},
    "unknown": {"dispatch_entry_cid", "attempt", "ledger_head_cid"},
    "unattempted": set(),
    "rolled_back": {"dispatch_entry_cid", "attempt", "outcome_receipt_cid", "batch_result_cid"},
}


def entry_from_ledger(record: DispatchRecord | None,
                      outcome_receipt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A member receipt entry (without ``index`` and ``row_preview_cid``) from a row's
    dispatch record and, for a terminal row, its outcome receipt."""
    if record is None or record.state is DispatchState.PREPARED:
        return {"state": "unattempted"}
    if record.state is DispatchState.DISPATCHING:
        raise _receipt_error(f"row {record.row_preview_cid} is still dispatching",
                             "in_flight", row_preview_cid=record.row_preview_cid)
    refs = {"dispatch_entry_cid": record.dispatch_entry_cid, "attempt": record.attempt}
    if record.state is DispatchState.UNKNOWN:
        return {"state": "unknown", **refs, "ledger_head_cid": record.ledger_head_cid}
    if (outcome_receipt is None
            or outcome_receipt["row_preview_cid"] != record.row_preview_cid
            or outcome_receipt["dispatch_entry_cid"] != record.dispatch_entry_cid
            or outcome_receipt["attempt"] != record.attempt
            or outcome_receipt["outcome"]["state"] != record.state.value):
        raise _receipt_error(f"row {record.row_preview_cid} is {record.state}: it needs the "
                             "outcome receipt of that exact dispatch", "outcome_receipt",
                             row_preview_cid=record.row_preview_cid)
    return {"state": record.state.value, **refs,
            "outcome_receipt_cid": outcome_receipt["receipt_cid"]}


@dataclass(frozen=True)
class MemberReceipt:
    """A member receipt: frozen body, named by ``receipt_cid``."""

    body: FrozenJSON

    @property
    def receipt_cid(self) -> str:
        """The receipt's CID."""
        return str(self.body["receipt_cid"])

    @property
    def effect_id(self) -> str:
        """The member it accounts for."""
        return str(self.body["effect_id"])

    @property
    def states(self) -> tuple[str, ...]:
        """Each row's state, in preview order."""
        return tuple(entry["state"] for entry in self.body["rows"])

    def entry(self, row_preview_cid: str) -> Mapping[str, Any]:
        """The entry of one row; ``KeyError`` if the member has no such row."""
        for entry in self.body["rows"]:
            if entry["row_preview_cid"] == row_preview_cid:
                return entry
        raise KeyError(row_preview_cid)

    def to_json(self) -> dict[str, Any]:
        """A fresh copy of the body."""
        return thaw(self.body)


def member_receipt(preview: EffectPreview, effect_id: str,
                   entries: Sequence[Mapping[str, Any]]) -> MemberReceipt:
    """The member receipt of ``effect_id``: ``entries`` one per preview row, in order.

    Each entry is ``{state, …references}`` as :func:`entry_from_ledger` makes
    it; ``index`` and ``row_preview_cid`` are filled in here. Each state takes
    exactly its references (terminal: dispatch, attempt, outcome receipt;
    unknown: dispatch, attempt, ledger head; unattempted: none; rolled back:
    also the batch result). Raises :class:`EffectReceiptInvalid`.
    """
    member = preview.member(effect_id)
    if len(entries) != len(member.changes):
        raise _receipt_error(f"{effect_id}: {len(entries)} entries for "
                             f"{len(member.changes)} preview rows", "row_count")
    rows = []
    for index, (entry, row) in enumerate(zip(entries, member.changes, strict=True)):
        entry = thaw(entry)
        state = entry.get("state")
        if state not in _ENTRY_FIELDS:
            raise _receipt_error(f"{effect_id} row {index}: state {state!r}", "state")
        refs = {k: v for k, v in entry.items() if k not in ("state", "index",
                                                             "row_preview_cid")}
        if set(refs) != _ENTRY_FIELDS[state]:
            raise _receipt_error(f"{effect_id} row {index}: a {state} entry references exactly "
                                 f"{sorted(_ENTRY_FIELDS[state])}", "entry_fields")
        if entry.get("row_preview_cid", row.row_preview_cid) != row.row_preview_cid:
            raise _receipt_error(f"{effect_id} row {index} is not preview row {index}",
                                 "row_order")
        for name, value in refs.items():
            if name == "attempt":
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise _receipt_error(f"{effect_id} row {index}: attempt >= 1", "entry_fields")
            elif not is_cid(value):
                raise _receipt_error(f"{effect_id} row {index}: {name} is not a CID",
                                     "entry_fields")
        rows.append({"index": index, "row_preview_cid": row.row_preview_cid, "state": state,
                     **refs})
    return MemberReceipt(freeze(_self_cid({
        "version": MEMBER_RECEIPT_VERSION, "run_identity_cid": preview.run_identity_cid,
        "effect_preview_cid": preview.effect_preview_cid, "effect_id": effect_id,
        "effect_member_preview_cid": member.effect_member_preview_cid,
        "effect_apply_key": member.effect_apply_key, "rows": rows}, "receipt_cid")))


# -- set receipts -----------------------------------------------------------------------


def check_authorization(value: object) -> dict[str, Any]:
    """The set receipt's authorization evidence, closed: an approval
    ``{kind: "approval", checkpoint_cid, resolution_cids: [CID…]}`` or an account allow
    ``{kind: "allow", config_cid, approval_required: false, risk_claim_required: false}``."""
    value = thaw(value)
    if isinstance(value, dict) and value.get("kind") == "approval":
        if (set(value) == {"kind", "checkpoint_cid", "resolution_cids"}
                and is_cid(value["checkpoint_cid"])
                and isinstance(value["resolution_cids"], list) and value["resolution_cids"]
                and all(is_cid(c) for c in value["resolution_cids"])):
            return value
    elif isinstance(value, dict) and value.get("kind") == "allow":
        if (set(value) == {"kind", "config_cid", "approval_required", "risk_claim_required"}
                and is_cid(value["config_cid"]) and value["approval_required"] is False
                and value["risk_claim_required"] is False):
            return value
    raise _receipt_error(f"authorization must be an approval or an allow object; got {value!r}",
                         "authorization")


@dataclass(frozen=True)
class SetReceipt:
    """The set apply receipt: frozen body, named by ``receipt_cid``; ``run_outcome`` is the
    Run state the initial application determined."""

    body: FrozenJSON
    run_outcome: str

    @property
    def receipt_cid(self) -> str:
        """The receipt's CID."""
        return str(self.body["receipt_cid"])

    @property
    def status(self) -> str:
        """``unknown_outcome | partial_failure | failed | accepted | applied``."""
        return str(self.body["status"])

    def to_json(self) -> dict[str, Any]:
        """A fresh copy of the body."""
        return thaw(self.body)


def set_receipt(preview: EffectPreview, members: Sequence[MemberReceipt],
                authorization: Mapping[str, Any]) -> SetReceipt:
    """The set apply receipt over every member receipt, exactly once and in member order.

    Each member receipt must belong to this preview and Run and be the one of
    the member at its place. Raises :class:`EffectReceiptInvalid`.
    """
    auth = check_authorization(authorization)
    if [m.effect_id for m in members] != [m.effect_id for m in preview.members]:
        raise _receipt_error("the set receipt references every member receipt exactly once, "
                             "in member order", "members")
    entries = []
    every_row: list[str] = []
    for receipt, member in zip(members, preview.members, strict=True):
        body = receipt.body
        if (body["effect_preview_cid"] != preview.effect_preview_cid
                or body["run_identity_cid"] != preview.run_identity_cid
                or body["effect_member_preview_cid"] != member.effect_member_preview_cid
                or receipt.receipt_cid != cid(thaw(body), exclude="receipt_cid")):
            raise _receipt_error(f"{member.effect_id}: member receipt is not this preview's",
                                 "binding", effect_id=member.effect_id)
        entries.append({"effect_id": member.effect_id,
                        "effect_member_preview_cid": member.effect_member_preview_cid,
                        "member_receipt_cid": receipt.receipt_cid,
                        "state": member_entry_state(receipt.states)})
        every_row.extend(receipt.states)
    body = _self_cid({"version": SET_RECEIPT_VERSION, "run_identity_cid": preview.run_identity_cid,
                      "effect_preview_cid": preview.effect_preview_cid, "authorization": auth,
                      "status": set_status(every_row), "members": entries}, "receipt_cid")
    return SetReceipt(freeze(body), run_outcome(every_row))


# -- reconciliation ---------------------------------------------------------------------

_RECON_ALWAYS = {"version", "effect_id", "run_identity_cid", "effect_preview_cid",
                 "effect_member_preview_cid", "row_preview_cid", "dispatch_entry_cid",
                 "dispatch_attempt_sequence", "prior_ledger_head_cid", "effect_set_receipt_cid",
                 "prior_receipt_cid", "attempt_sequence", "terminal", "outcome",
                 "reconciliation_receipt_cid"}
_BINDINGS = ("effect_id", "run_identity_cid", "effect_preview_cid", "effect_member_preview_cid",
             "row_preview_cid", "dispatch_entry_cid", "dispatch_attempt_sequence",
             "prior_ledger_head_cid", "effect_set_receipt_cid", "prior_receipt_cid")


class ReconciliationConflict(Conflict):
    """A different receipt for a row whose chain is closed by a terminal one, or for an
    attempt that already has another receipt (code ``conflict``)."""


def _recon_error(message: str, rule: str) -> ReconciliationInvalid:
    return ReconciliationInvalid(message, detail={"rule": rule})


@dataclass(frozen=True)
class ReconciliationChain:
    """The reconciliation receipts of one unknown row, in order (immutable).

    Open one with :meth:`open`; :meth:`next_receipt` builds the receipt that
    would extend it; :meth:`accept` returns the chain with a receipt added (or
    the same chain for an exact redelivery).
    """

    bindings: FrozenJSON
    kind: Kind
    command_id: str
    idempotency_key: str
    receipts: tuple[FrozenJSON, ...] = ()

    @classmethod
    def open(cls, preview: EffectPreview, set_receipt: SetReceipt, member: MemberReceipt,
             row_preview_cid: str) -> ReconciliationChain:
        """The (empty) chain of ``row_preview_cid``, which must be unknown in ``member``,
        a member receipt the set receipt references. A known terminal row is not eligible."""
        refs = {m["effect_id"]: m["member_receipt_cid"] for m in set_receipt.body["members"]}
        if refs.get(member.effect_id) != member.receipt_cid:
            raise _recon_error("the member receipt is not the set receipt's", "binding")
        try:
            entry = member.entry(row_preview_cid)
        except KeyError:
            raise _recon_error(f"{member.effect_id} has no row {row_preview_cid}",
                               "binding") from None
        if entry["state"] != "unknown":
            raise _recon_error(f"row {row_preview_cid} is {entry['state']}, not unknown: it "
                               "is not eligible for reconciliation", "not_unknown")
        effect = preview.member(member.effect_id)
        row = next(r for r in effect.changes if r.row_preview_cid == row_preview_cid)
        bindings = {
            "effect_id": member.effect_id, "run_identity_cid": preview.run_identity_cid,
            "effect_preview_cid": preview.effect_preview_cid,
            "effect_member_preview_cid": effect.effect_member_preview_cid,
            "row_preview_cid": row_preview_cid, "dispatch_entry_cid": entry["dispatch_entry_cid"],
            "dispatch_attempt_sequence": entry["attempt"],
            "prior_ledger_head_cid": entry["ledger_head_cid"],
            "effect_set_receipt_cid": set_receipt.receipt_cid,
            "prior_receipt_cid": member.receipt_cid}
        return cls(freeze(bindings), effect.kind, effect.effect_apply_key,
                   row.row_idempotency_key)

    @property
    def closed(self) -> bool:
        """Whether a terminal receipt ended the chain."""
        return bool(self.receipts) and bool(self.receipts[-1]["terminal"])

    @property
    def latest_state(self) -> str:
        """The row's latest validated outcome state (``unknown`` until a terminal one)."""
        return str(self.receipts[-1]["outcome"]["state"]) if self.receipts else "unknown"

    def next_receipt(self, outcome: EffectOutcome, *,
                     outcome_receipt_cid: str | None = None) -> dict[str, Any]:
        """The receipt that would extend this chain with ``outcome`` (not yet accepted)."""
        checked = check_outcome(outcome, kind=self.kind)
        body: dict[str, Any] = {"version": RECONCILIATION_VERSION, **thaw(self.bindings),
                                "attempt_sequence": len(self.receipts) + 1,
                                "terminal": checked["state"] != "unknown", "outcome": checked,
                                "command_id": self.command_id,
                                "idempotency_key": self.idempotency_key}
        if self.receipts:
            body["previous_reconciliation_receipt_cid"] = (
                self.receipts[-1]["reconciliation_receipt_cid"])
        if outcome_receipt_cid is not None:
            body["outcome_receipt_cid"] = outcome_receipt_cid
        return _self_cid(body, "reconciliation_receipt_cid")

    def _validate(self, receipt: dict[str, Any]) -> None:
        fields = set(receipt)
        optional = fields - _RECON_ALWAYS
        if not _RECON_ALWAYS <= fields or optional - {
                "previous_reconciliation_receipt_cid", "operation_ref", "command_id",
                "idempotency_key", "outcome_receipt_cid"}:
            raise _recon_error("a reconciliation receipt has exactly the seed's closed fields",
                               "fields")
        if receipt["version"] != RECONCILIATION_VERSION:
            raise _recon_error(f"version must be {RECONCILIATION_VERSION}", "fields")
        if receipt["reconciliation_receipt_cid"] != cid(receipt,
                                                         exclude="reconciliation_receipt_cid"):
            raise _recon_error("reconciliation_receipt_cid does not match the receipt",
                               "self_cid")
        for name in _BINDINGS:
            if receipt[name] != self.bindings[name]:
                raise _recon_error(f"{name} is not the unknown row's", "binding")
        has_op = "operation_ref" in receipt
        has_cmd = {"command_id", "idempotency_key"} & set(receipt)
        if has_op == bool(has_cmd) or (has_cmd and len(has_cmd) != 2):
            raise _recon_error("exactly one correlation: operation_ref, or command_id with "
                               "idempotency_key", "correlation")
        if has_cmd and (receipt["command_id"] != self.command_id
                        or receipt["idempotency_key"] != self.idempotency_key):
            raise _recon_error("command_id / idempotency_key are not the row's", "correlation")
        try:
            outcome = check_outcome(receipt["outcome"], kind=self.kind)
        except EffectReceiptInvalid as exc:
            raise _recon_error(exc.message, "outcome") from None
        if receipt["terminal"] is not (outcome["state"] != "unknown"):
            raise _recon_error("terminal is false exactly when the outcome is unknown",
                               "terminal")
        if outcome["state"] == "unknown" and outcome["idempotency_key"] != self.idempotency_key:
            raise _recon_error("an unknown outcome binds the row's idempotency key", "outcome")
        if receipt["terminal"] != ("outcome_receipt_cid" in receipt):
            raise _recon_error("outcome_receipt_cid is required for a terminal outcome and "
                               "absent while it is unknown", "outcome_receipt_cid")
        if "outcome_receipt_cid" in receipt and not is_cid(receipt["outcome_receipt_cid"]):
            raise _recon_error("outcome_receipt_cid is not a CID", "outcome_receipt_cid")

    def accept(self, receipt: Mapping[str, Any]) -> tuple[ReconciliationChain, bool]:
        """``(chain, added)``: the chain with ``receipt`` appended (``added`` true), or this
        chain unchanged for an exact redelivery (``added`` false).

        Raises :class:`ReconciliationConflict` for a different receipt after a
        terminal one or for an attempt already taken, and
        :class:`ReconciliationInvalid` for a receipt that breaks the closed
        fields or does not extend the latest receipt.
        """
        body = thaw(receipt)
        if not isinstance(body, dict):
            raise _recon_error("a reconciliation receipt is an object", "fields")
        self._validate(body)
        for existing in self.receipts:
            if existing["reconciliation_receipt_cid"] == body["reconciliation_receipt_cid"]:
                return self, False
        if self.closed:
            raise ReconciliationConflict(
                f"row {self.bindings['row_preview_cid']} was settled "
                f"{self.latest_state} by a terminal receipt; a different one is a conflict",
                detail={"row_preview_cid": self.bindings["row_preview_cid"]})
        sequence = body["attempt_sequence"]
        if isinstance(sequence, int) and 1 <= sequence <= len(self.receipts):
            raise ReconciliationConflict(
                f"attempt {sequence} of row {self.bindings['row_preview_cid']} already has "
                "another receipt", detail={"attempt_sequence": sequence})
        if sequence != len(self.receipts) + 1 or isinstance(sequence, bool):
            raise _recon_error(f"attempt_sequence must be {len(self.receipts) + 1}", "sequence")
        previous = (self.receipts[-1]["reconciliation_receipt_cid"] if self.receipts else None)
        if body.get("previous_reconciliation_receipt_cid") != previous:
            raise _recon_error("previous_reconciliation_receipt_cid must be the latest "
                               "receipt's CID (absent on attempt 1)", "sequence")
        return replace(self, receipts=(*self.receipts, freeze(body))), True


def effective_states(members: Sequence[MemberReceipt],
                     chains: Mapping[str, ReconciliationChain]) -> list[str]:
    """Every row's latest validated state: the member receipts' states, with each unknown
    row's chain (keyed by ``row_preview_cid``) standing in for it. Feed to
    :func:`run_outcome` after each reconciliation."""
    states = []
    for member in members:
        for entry in member.body["rows"]:
            chain = chains.get(entry["row_preview_cid"])
            states.append(chain.latest_state if chain is not None and entry["state"] == "unknown"
                          else entry["state"])
    return states
