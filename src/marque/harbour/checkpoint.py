"""Checkpoints, Resolutions, the tally and revalidation (DESIGN §11.4).

A delegated request does not wait on a mutable row: it waits on a *sealed*
Checkpoint, a body naming exactly what approvers are asked about — the logical
request, its intent, the change, the stored preview, the routing decision that
deferred it and the environment it will run in — and identified by its CID.
Each Resolution names that CID, so an approval can never drift onto another
change, preview, config or Pilot: a changed anything is a new Checkpoint and
needs new approvals.

Representation decisions (kept here so every reader of a stored body agrees):

* ``expires_at`` (Checkpoint) and ``at`` (Resolution) are RFC 3339 UTC text to
  the second, ``2026-12-01T08:18:10Z`` — the form :func:`marque.timefmt.iso_time`
  gives and the preview object's ``at`` uses. Text rather than an epoch number
  keeps floats out of the sealed preimages; sub-second instants are floored, so
  a Checkpoint expires at most a second early, never late.
* A Checkpoint's ``routing.outcome`` is always ``"delegate"``: only a deferred
  decision is sealed, and a body that says otherwise is refused.
* ``reason`` is required, non-blank text for a reject (whoever is refused is
  owed the why); for an approve it is optional and then ``null``, never ``""``.
* The requester may *reject* their own request (it can only stop it); only
  their approval is ``self_approval``.
* A Resolution's ``at`` is to the second, so the same approver approving the
  same Checkpoint twice in one second with the same reason seals the same CID:
  a retried submission is one Resolution, not two.

Errors: a malformed body, or one whose recomputed CID is not the stored one, is
:class:`~marque.errors.InvalidInput` (``detail`` has both CIDs); a Resolution
for another Checkpoint is :class:`~marque.errors.Conflict` at submission (the
approver resolved a superseded Checkpoint) and ``InvalidInput`` inside
:func:`tally` (the caller mixed Checkpoints; it is never silently dropped).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from marque.change import is_json_int
from marque.cid import MAX_SAFE_INT, cid, is_cid
from marque.errors import (
    Conflict,
    InvalidInput,
    RequestExpired,
    RevalidationFailed,
    SelfApproval,
)
from marque.timefmt import iso_time

__all__ = [
    "CHECKPOINT_VERSION",
    "CHECKPOINT_VERSION_0_1",
    "RESOLUTION_VERSION",
    "CONFIG_CHANGED",
    "INCARNATION_CHANGED",
    "PILOT_CHANGED",
    "TARGET_CHANGED",
    "TARGET_NOT_SERVED",
    "CHECKPOINT_EXPIRED",
    "Decision",
    "TallyState",
    "Checkpoint",
    "Resolution",
    "Tally",
    "seal_checkpoint",
    "seal_resolution",
    "check_resolution",
    "refuse_shared_key",
    "tally",
    "revalidate",
    "require_revalidated",
    "parse_time",
]

#: The version of a Checkpoint that names its preview's diff (``diff_cid``).
CHECKPOINT_VERSION: Final = "marque-checkpoint/0.2"
#: The version of a Checkpoint over a preview without row images: still read, still
#: sealed when the preview names no diff, so every body sealed before keeps its CID.
CHECKPOINT_VERSION_0_1: Final = "marque-checkpoint/0.1"
RESOLUTION_VERSION: Final = "marque-resolution/0.1"

#: What :func:`revalidate` names when the adopted routing config is not the Checkpoint's.
CONFIG_CHANGED: Final = "config_changed"
#: ... when the Pilot's registered ledger incarnation is not the Checkpoint's.
INCARNATION_CHANGED: Final = "incarnation_changed"
#: ... when the marque would go to another Pilot than the Checkpoint's.
PILOT_CHANGED: Final = "pilot_changed"
#: ... when the marque would name another target than the Checkpoint's.
TARGET_CHANGED: Final = "target_changed"
#: ... when the Pilot no longer registers the Checkpoint's target.
TARGET_NOT_SERVED: Final = "target_not_served"
#: ... when the Checkpoint's ``expires_at`` has passed.
CHECKPOINT_EXPIRED: Final = "checkpoint_expired"

_DELEGATE: Final = "delegate"
_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
_CHECKPOINT_KEYS = frozenset({
    "version", "logical_request_scope", "intent_fingerprint", "change_cid", "preview_cid",
    "routing", "environment", "expires_at",
})
_CHECKPOINT_KEYS_0_2 = _CHECKPOINT_KEYS | {"diff_cid"}
_ROUTING_KEYS = frozenset({"config_cid", "outcome", "approvals"})
_ENVIRONMENT_KEYS = frozenset({"pilot_id", "incarnation", "target"})
_RESOLUTION_KEYS = frozenset({"version", "checkpoint_cid", "decision", "approver", "reason", "at"})


class Decision(StrEnum):
    """What a Resolution says about its Checkpoint."""

    APPROVE = "approve"
    REJECT = "reject"


class TallyState(StrEnum):
    """Where a Checkpoint's Resolutions leave it."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


# -- shape checks -------------------------------------------------------------------


def parse_time(value: Any, name: str = "time") -> int:
    """The epoch second of RFC 3339 UTC text in exactly the form ``iso_time`` writes.

    Anything else (offsets, fractions, lower-case ``z``, an impossible date) is
    :class:`InvalidInput`: a sealed body has one spelling of each instant.
    """
    if not isinstance(value, str) or _TIME_RE.fullmatch(value) is None:
        raise InvalidInput(f"{name} must be UTC time text like 2026-12-01T08:18:10Z")
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise InvalidInput(f"{name} {value!r} is not a real instant") from exc
    return int(moment.timestamp())


def _time_text(value: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be an epoch time in seconds")
    if not 0 <= value <= MAX_SAFE_INT:
        raise InvalidInput(f"{name} is out of range")
    return iso_time(math.floor(value))


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a non-empty string")
    return value


def _cid_field(value: Any, name: str) -> str:
    if not isinstance(value, str) or not is_cid(value):
        raise InvalidInput(f"{name} must be a CID (sha256: and 64 lower-case hex digits)")
    return value


def _members(data: Any, keys: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be a JSON object")
    missing = sorted(keys - data.keys())
    unknown = sorted(str(k) for k in data.keys() - keys)
    if missing:
        raise InvalidInput(f"{where} lacks member(s) {', '.join(missing)}")
    if unknown:
        raise InvalidInput(f"{where} has unknown member(s) {', '.join(unknown)}")
    return data


def _check_stored_cid(kind: str, computed: str, stored: str) -> None:
    if stored != computed:
        raise InvalidInput(
            f"the stored {kind} does not hash to its CID {stored[:80]!r} (it hashes to "
            f"{computed}): it was altered after it was sealed and is not used",
            detail={"stored_cid": stored, "computed_cid": computed},
        )


# -- the Checkpoint ----------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A sealed Checkpoint: what approvers are asked about, identified by ``cid``.

    Build it with :func:`seal_checkpoint`, or read a stored one with
    :meth:`from_body`; constructing one directly checks every field the same way.
    """

    logical_request_scope: str
    intent_fingerprint: str
    change_cid: str
    preview_cid: str
    config_cid: str
    approvals: int
    pilot_id: str
    incarnation: str
    target: str
    expires_at: str
    #: The CID of the preview's row images (``marque-row-diff/0.1`` or ``/0.2``), None when the
    #: preview has none: a body with it is version 0.2, one without it 0.1.
    diff_cid: str | None = None
    cid: str = field(init=False)

    def __post_init__(self) -> None:
        for name in ("logical_request_scope", "intent_fingerprint", "change_cid",
                     "preview_cid", "config_cid"):
            _cid_field(getattr(self, name), name)
        if self.diff_cid is not None:
            _cid_field(self.diff_cid, "diff_cid")
        if not is_json_int(self.approvals) or not 1 <= self.approvals <= MAX_SAFE_INT:
            raise InvalidInput("routing.approvals must be an integer of at least 1")
        for name in ("pilot_id", "incarnation", "target"):
            _text(getattr(self, name), name)
        parse_time(self.expires_at, "expires_at")
        object.__setattr__(self, "cid", cid(self.body))

    @property
    def body(self) -> dict[str, Any]:
        """The sealed body of DESIGN §11.4, exactly; ``cid`` is its CID. Version 0.2
        (with ``diff_cid``) when the preview names its diff, else the 0.1 body."""
        body: dict[str, Any] = {
            "version": CHECKPOINT_VERSION_0_1 if self.diff_cid is None else CHECKPOINT_VERSION,
            "logical_request_scope": self.logical_request_scope,
            "intent_fingerprint": self.intent_fingerprint,
            "change_cid": self.change_cid,
            "preview_cid": self.preview_cid,
            "routing": {"config_cid": self.config_cid, "outcome": _DELEGATE,
                        "approvals": self.approvals},
            "environment": {"pilot_id": self.pilot_id, "incarnation": self.incarnation,
                            "target": self.target},
            "expires_at": self.expires_at,
        }
        if self.diff_cid is not None:
            body["diff_cid"] = self.diff_cid
        return body

    @property
    def expires_at_epoch(self) -> int:
        """``expires_at`` as epoch seconds."""
        return parse_time(self.expires_at, "expires_at")

    @classmethod
    def from_body(cls, body: Any, stored_cid: str) -> Checkpoint:
        """Read a stored Checkpoint body, refusing it unless it hashes to ``stored_cid``.

        Every member is checked (no missing, no unknown, outcome ``delegate``);
        any deviation, or a body that no longer hashes to its stored CID, is
        :class:`InvalidInput`.
        """
        version = body.get("version") if isinstance(body, Mapping) else None
        if version not in (CHECKPOINT_VERSION, CHECKPOINT_VERSION_0_1):
            raise InvalidInput(f"checkpoint version must be {CHECKPOINT_VERSION} (or "
                               f"{CHECKPOINT_VERSION_0_1})")
        data = _members(body, _CHECKPOINT_KEYS_0_2 if version == CHECKPOINT_VERSION
                        else _CHECKPOINT_KEYS, "checkpoint")
        routing = _members(data["routing"], _ROUTING_KEYS, "checkpoint.routing")
        if routing["outcome"] != _DELEGATE:
            raise InvalidInput("checkpoint.routing.outcome must be delegate: only a deferred "
                               "decision is sealed in a Checkpoint")
        environment = _members(data["environment"], _ENVIRONMENT_KEYS, "checkpoint.environment")
        checkpoint = cls(
            logical_request_scope=data["logical_request_scope"],
            intent_fingerprint=data["intent_fingerprint"],
            change_cid=data["change_cid"],
            preview_cid=data["preview_cid"],
            config_cid=routing["config_cid"],
            approvals=routing["approvals"],
            pilot_id=environment["pilot_id"],
            incarnation=environment["incarnation"],
            target=environment["target"],
            expires_at=data["expires_at"],
            diff_cid=data.get("diff_cid") if version == CHECKPOINT_VERSION else None,
        )
        if version == CHECKPOINT_VERSION and checkpoint.diff_cid is None:
            raise InvalidInput("a marque-checkpoint/0.2 body names its diff_cid")
        # The rebuilt body must hash like the stored one byte for byte: a member
        # changed in place (or a CID that never matched) is refused here.
        _check_stored_cid("checkpoint", cid(dict(data)), stored_cid)
        _check_stored_cid("checkpoint", checkpoint.cid, stored_cid)
        return checkpoint


def seal_checkpoint(
    *,
    logical_request_scope: str,
    intent_fingerprint: str,
    change_cid: str,
    preview_cid: str,
    config_cid: str,
    approvals: int,
    pilot_id: str,
    incarnation: str,
    target: str,
    expires_at: float,
    diff_cid: str | None = None,
) -> Checkpoint:
    """Seal the Checkpoint of a delegated request; ``expires_at`` is epoch seconds (floored).

    ``diff_cid`` is the preview's (its row images' CID); a preview without one seals
    a version 0.1 body.

    ``approvals`` is the routing decision's count of distinct approvers. Raises
    :class:`InvalidInput` for a malformed CID, an empty name or a bad time.
    """
    return Checkpoint(
        logical_request_scope=logical_request_scope,
        intent_fingerprint=intent_fingerprint,
        change_cid=change_cid,
        preview_cid=preview_cid,
        config_cid=config_cid,
        approvals=approvals,
        pilot_id=pilot_id,
        incarnation=incarnation,
        target=target,
        expires_at=_time_text(expires_at, "expires_at"),
        diff_cid=diff_cid,
    )


# -- Resolutions -----------------------------------------------------------------------


def _decision(value: Any) -> Decision:
    if isinstance(value, str):
        try:
            return Decision(value)
        except ValueError:
            pass
    raise InvalidInput("decision must be approve or reject")


@dataclass(frozen=True)
class Resolution:
    """One approver's sealed decision on one Checkpoint, identified by ``cid``."""

    checkpoint_cid: str
    decision: Decision
    approver: str
    reason: str | None
    at: str
    cid: str = field(init=False)

    def __post_init__(self) -> None:
        _cid_field(self.checkpoint_cid, "checkpoint_cid")
        decision = _decision(self.decision)
        object.__setattr__(self, "decision", decision)
        _text(self.approver, "approver")
        if self.reason is not None and not isinstance(self.reason, str):
            raise InvalidInput("reason must be text or null")
        if decision is Decision.REJECT and (self.reason is None or not self.reason.strip()):
            raise InvalidInput("a reject needs a reason: say why, so the requester can act on it")
        if self.reason is not None and not self.reason.strip():
            raise InvalidInput("an approval's reason is either omitted or says something")
        parse_time(self.at, "at")
        object.__setattr__(self, "cid", cid(self.body))

    @property
    def body(self) -> dict[str, Any]:
        """The sealed body of DESIGN §11.4, exactly; ``cid`` is its CID."""
        return {
            "version": RESOLUTION_VERSION,
            "checkpoint_cid": self.checkpoint_cid,
            "decision": self.decision.value,
            "approver": self.approver,
            "reason": self.reason,
            "at": self.at,
        }

    @classmethod
    def from_body(cls, body: Any, stored_cid: str) -> Resolution:
        """Read a stored Resolution body, refusing it unless it hashes to ``stored_cid``."""
        data = _members(body, _RESOLUTION_KEYS, "resolution")
        if data["version"] != RESOLUTION_VERSION:
            raise InvalidInput(f"resolution version must be {RESOLUTION_VERSION}")
        resolution = cls(
            checkpoint_cid=data["checkpoint_cid"],
            decision=data["decision"],
            approver=data["approver"],
            reason=data["reason"],
            at=data["at"],
        )
        _check_stored_cid("resolution", cid(dict(data)), stored_cid)
        _check_stored_cid("resolution", resolution.cid, stored_cid)
        return resolution


def seal_resolution(
    checkpoint: Checkpoint,
    *,
    decision: Decision | str,
    approver: str,
    reason: str | None = None,
    at: float,
) -> Resolution:
    """Seal ``approver``'s ``decision`` on ``checkpoint`` at epoch time ``at`` (floored).

    Only the shape is checked here; whether this approver may resolve this
    Checkpoint now is :func:`check_resolution`'s question.
    """
    return Resolution(
        checkpoint_cid=checkpoint.cid,
        decision=_decision(decision),
        approver=approver,
        reason=reason,
        at=_time_text(at, "at"),
    )


# -- the tally --------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """Where a Checkpoint's Resolutions leave it, and who put it there.

    ``approvers`` are the distinct approvers in the order they first approved;
    ``approval_cids`` the Resolution that counted for each (a repeated approval
    by the same approver is not counted again). A reject names who and why.
    """

    checkpoint_cid: str
    state: TallyState
    approvals_required: int
    approvers: tuple[str, ...]
    approval_cids: tuple[str, ...]
    rejected_by: str | None = None
    reject_reason: str | None = None
    rejection_cid: str | None = None

    @property
    def remaining(self) -> int:
        """Distinct approvals still needed (0 once approved)."""
        return max(0, self.approvals_required - len(self.approvers))

    def to_json(self) -> dict[str, Any]:
        """The tally as a JSON object (for the request object and the console)."""
        return {
            "checkpoint_cid": self.checkpoint_cid,
            "state": self.state.value,
            "approvals_required": self.approvals_required,
            "approvers": list(self.approvers),
            "approval_cids": list(self.approval_cids),
            "rejected_by": self.rejected_by,
            "reject_reason": self.reject_reason,
            "rejection_cid": self.rejection_cid,
        }


def _refuse_self_approval(resolution: Resolution, requester: str, allowed: bool) -> None:
    if resolution.decision is Decision.APPROVE and resolution.approver == requester and not allowed:
        raise SelfApproval(
            f"{requester} asked for this change and cannot also approve it: the routing entry "
            "that delegated it does not allow self-approval; another approver must resolve it",
            detail={"approver": requester, "checkpoint_cid": resolution.checkpoint_cid},
        )


def refuse_shared_key(approver_jkt: str | None, requester: str,
                      requester_jkts: Iterable[str | None], checkpoint_cid: str) -> None:
    """Refuse an approval by whoever holds the requester's key, whatever their name.

    ``requester_jkts`` are the thumbprints of the requester's key now and when
    they asked: a key rotated since cannot make an approval by the old key look
    like another person's. Only called where routing does not allow
    self-approval — where it does, a second name for the requester is allowed
    exactly as the requester's own name is.
    """
    if approver_jkt is not None and approver_jkt in {j for j in requester_jkts if j}:
        raise SelfApproval(
            f"this approver holds the key of {requester}, who asked for this change: an "
            "approval by the requester's key is self-approval under any name, and the routing "
            "entry that delegated it does not allow self-approval",
            detail={"requester": requester, "key_thumbprint": approver_jkt,
                    "checkpoint_cid": checkpoint_cid, "reason": "same_key"})


def tally(
    checkpoint: Checkpoint,
    resolutions: Iterable[Resolution],
    *,
    requester: str,
    self_approval_allowed: bool,
    approvals_required: int | None = None,
) -> Tally:
    """Count ``resolutions`` of ``checkpoint``.

    One reject rejects, whatever approvals came before or after it. Otherwise
    the Checkpoint is approved once ``approvals_required`` *distinct* approvers
    approved (default, and minimum: the count sealed in the Checkpoint), and
    pending until then. Resolutions are counted in ``(at, cid)`` order, so the
    result does not depend on the order a store returns them in.

    Raises :class:`SelfApproval` for a counted approval by ``requester`` when
    self-approval is not allowed (it should never have been stored), and
    :class:`InvalidInput` for a Resolution of another Checkpoint or an
    ``approvals_required`` below the sealed count.
    """
    required = checkpoint.approvals if approvals_required is None else approvals_required
    if not is_json_int(required) or required < checkpoint.approvals:
        raise InvalidInput(
            f"approvals_required must be an integer of at least {checkpoint.approvals}, the "
            "count sealed in the Checkpoint")
    ordered = sorted(resolutions, key=lambda r: (r.at, r.cid))
    approvers: dict[str, str] = {}
    rejection: Resolution | None = None
    for resolution in ordered:
        if resolution.checkpoint_cid != checkpoint.cid:
            raise InvalidInput(
                f"resolution {resolution.cid} is for checkpoint {resolution.checkpoint_cid}, "
                f"not {checkpoint.cid}: resolutions of different Checkpoints are never counted "
                "together",
                detail={"resolution_cid": resolution.cid,
                        "checkpoint_cid": resolution.checkpoint_cid})
        _refuse_self_approval(resolution, requester, self_approval_allowed)
        if resolution.decision is Decision.REJECT:
            rejection = rejection or resolution
        else:
            approvers.setdefault(resolution.approver, resolution.cid)
    if rejection is not None:
        state = TallyState.REJECTED
    elif len(approvers) >= required:
        state = TallyState.APPROVED
    else:
        state = TallyState.PENDING
    return Tally(
        checkpoint_cid=checkpoint.cid,
        state=state,
        approvals_required=required,
        approvers=tuple(approvers),
        approval_cids=tuple(approvers.values()),
        rejected_by=None if rejection is None else rejection.approver,
        reject_reason=None if rejection is None else rejection.reason,
        rejection_cid=None if rejection is None else rejection.cid,
    )


def check_resolution(
    checkpoint: Checkpoint,
    resolution: Resolution,
    *,
    requester: str,
    self_approval_allowed: bool,
    existing: Iterable[Resolution] = (),
) -> None:
    """Refuse ``resolution`` before it is stored, unless it may be counted now.

    :class:`Conflict` when it names another (superseded) Checkpoint or the
    Checkpoint is already decided by ``existing``; :class:`SelfApproval` for the
    requester's own approval unless allowed; :class:`RequestExpired` when it
    was made at or after the Checkpoint expired. The store's constraints still
    decide races between concurrent submissions.
    """
    if resolution.checkpoint_cid != checkpoint.cid:
        raise Conflict(
            f"this resolution is for checkpoint {resolution.checkpoint_cid}, but the request now "
            f"waits on {checkpoint.cid}: review the current Checkpoint and resolve that one",
            detail={"resolution_checkpoint_cid": resolution.checkpoint_cid,
                    "checkpoint_cid": checkpoint.cid})
    _refuse_self_approval(resolution, requester, self_approval_allowed)
    if parse_time(resolution.at, "at") >= checkpoint.expires_at_epoch:
        raise RequestExpired(
            f"checkpoint {checkpoint.cid} expired at {checkpoint.expires_at}; a resolution at "
            f"{resolution.at} cannot count: ask for the change again",
            detail={"checkpoint_cid": checkpoint.cid, "expires_at": checkpoint.expires_at})
    current = tally(checkpoint, existing, requester=requester,
                    self_approval_allowed=self_approval_allowed)
    if current.state is not TallyState.PENDING:
        raise Conflict(
            f"checkpoint {checkpoint.cid} is already {current.state.value}; no further "
            "resolution changes it",
            detail={"checkpoint_cid": checkpoint.cid, "state": current.state.value})


# -- revalidation -----------------------------------------------------------------------


def revalidate(
    checkpoint: Checkpoint,
    *,
    adopted_config_cid: str | None,
    pilot_id: str,
    pilot_incarnation: str | None,
    target: str,
    now: float,
    pilot_targets: Collection[str] | None = None,
) -> list[str]:
    """What no longer holds of ``checkpoint`` just before its marque is issued ([] = all holds).

    Compares the Checkpoint's routing config with the one adopted now, its
    environment with the Pilot's registered incarnation (``None``: the Pilot is
    not registered) and the Pilot and target the marque would name, and its
    ``expires_at`` with ``now`` (expired at that second). With ``pilot_targets``
    (the targets the Pilot registers), a target it no longer serves fails too.
    Each failure is one of the ``*_CHANGED`` / ``TARGET_NOT_SERVED`` /
    ``CHECKPOINT_EXPIRED`` names, in that order.
    """
    failed: list[str] = []
    if adopted_config_cid != checkpoint.config_cid:
        failed.append(CONFIG_CHANGED)
    if pilot_id != checkpoint.pilot_id:
        failed.append(PILOT_CHANGED)
    if pilot_incarnation != checkpoint.incarnation:
        failed.append(INCARNATION_CHANGED)
    if target != checkpoint.target:
        failed.append(TARGET_CHANGED)
    if pilot_targets is not None and checkpoint.target not in pilot_targets:
        failed.append(TARGET_NOT_SERVED)
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise InvalidInput("now must be an epoch time in seconds")
    if now >= checkpoint.expires_at_epoch:
        failed.append(CHECKPOINT_EXPIRED)
    return failed


_EXPLAINED = {
    CONFIG_CHANGED: "the adopted routing config is no longer the one the decision was made under",
    PILOT_CHANGED: "the marque would go to another Pilot",
    INCARNATION_CHANGED: "the Pilot's ledger incarnation changed (or it is not registered)",
    TARGET_CHANGED: "the marque would name another target",
    TARGET_NOT_SERVED: "the Pilot no longer registers the target",
    CHECKPOINT_EXPIRED: "the Checkpoint expired",
}


def require_revalidated(
    checkpoint: Checkpoint,
    *,
    adopted_config_cid: str | None,
    pilot_id: str,
    pilot_incarnation: str | None,
    target: str,
    now: float,
    pilot_targets: Collection[str] | None = None,
) -> None:
    """:func:`revalidate`, raising :class:`RevalidationFailed` that names every failure.

    ``detail["failed"]`` lists the names. The request then moves to ``failed``
    (DESIGN §11.4) — or to ``expired`` when expiry is the only failure — and
    no marque is issued.
    """
    failed = revalidate(checkpoint, adopted_config_cid=adopted_config_cid, pilot_id=pilot_id,
                        pilot_incarnation=pilot_incarnation, target=target, now=now,
                        pilot_targets=pilot_targets)
    if failed:
        reasons = "; ".join(f"{name}: {_EXPLAINED[name]}" for name in failed)
        raise RevalidationFailed(
            f"checkpoint {checkpoint.cid} no longer holds ({reasons}); no marque is issued — "
            "ask for the change again to get a new Checkpoint",
            detail={"failed": failed, "checkpoint_cid": checkpoint.cid,
                    "checkpoint": checkpoint.body, "adopted_config_cid": adopted_config_cid,
                    "pilot_id": pilot_id, "pilot_incarnation": pilot_incarnation,
                    "target": target, "now": now},
        )
