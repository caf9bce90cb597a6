"""Checkpoints, Resolutions, the tally and revalidation (DESIGN §11.4).

CIDs are checked against an encoder written here, not :mod:`marque.cid`: for
objects of ASCII strings, small integers and null, RFC 8785 is sorted keys, no
whitespace, and JSON's own escapes, which ``json.dumps`` gives directly.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from marque.errors import (
    Conflict,
    InvalidInput,
    RequestExpired,
    RevalidationFailed,
    SelfApproval,
)
from marque.harbour.checkpoint import (
    CHECKPOINT_EXPIRED,
    CONFIG_CHANGED,
    INCARNATION_CHANGED,
    PILOT_CHANGED,
    TARGET_CHANGED,
    TARGET_NOT_SERVED,
    Checkpoint,
    Decision,
    Resolution,
    TallyState,
    check_resolution,
    parse_time,
    require_revalidated,
    revalidate,
    seal_checkpoint,
    seal_resolution,
    tally,
)


def jcs_cid(obj: Any) -> str:
    """A second, minimal JCS encoder: enough for the ASCII bodies of these tests."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert text.isascii()
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


SCOPE = "sha256:" + "1" * 64
FINGERPRINT = "sha256:" + "2" * 64
CHANGE = "sha256:" + "3" * 64
PREVIEW = "sha256:" + "4" * 64
CONFIG = "sha256:" + "5" * 64
OTHER_CONFIG = "sha256:" + "6" * 64
# 2026-12-01T08:00:00Z
EXPIRES = 1796112000
REQUESTER = "alice"


def sealed(approvals: int = 1, **overrides: Any) -> Checkpoint:
    args: dict[str, Any] = dict(
        logical_request_scope=SCOPE, intent_fingerprint=FINGERPRINT, change_cid=CHANGE,
        preview_cid=PREVIEW, config_cid=CONFIG, approvals=approvals, pilot_id="pilot-a",
        incarnation="inc-1", target="shop", expires_at=EXPIRES)
    args.update(overrides)
    return seal_checkpoint(**args)


def resolve(checkpoint: Checkpoint, approver: str, decision: str = "approve",
            reason: str | None = None, at: float = EXPIRES - 600) -> Resolution:
    return seal_resolution(checkpoint, decision=decision, approver=approver, reason=reason,
                           at=at)


LITERAL_CHECKPOINT = {
    "version": "marque-checkpoint/0.1",
    "logical_request_scope": SCOPE,
    "intent_fingerprint": FINGERPRINT,
    "change_cid": CHANGE,
    "preview_cid": PREVIEW,
    "routing": {"config_cid": CONFIG, "outcome": "delegate", "approvals": 1},
    "environment": {"pilot_id": "pilot-a", "incarnation": "inc-1", "target": "shop"},
    "expires_at": "2026-12-01T08:00:00Z",
}


# -- sealing ------------------------------------------------------------------------------


def test_checkpoint_body_and_cid_are_the_literal_ones() -> None:
    """The sealed body is §11.4's, member for member, and its CID is that body's JCS hash."""
    checkpoint = sealed()
    assert checkpoint.body == LITERAL_CHECKPOINT
    assert checkpoint.cid == jcs_cid(LITERAL_CHECKPOINT)
    assert sealed().cid == checkpoint.cid
    assert sealed(target="other").cid != checkpoint.cid


def test_expires_at_is_utc_text_floored_to_the_second() -> None:
    """A fractional expiry is floored (expires early, never late) and reads as RFC 3339 UTC."""
    checkpoint = sealed(expires_at=EXPIRES + 0.999)
    assert checkpoint.expires_at == "2026-12-01T08:00:00Z"
    assert checkpoint.expires_at_epoch == EXPIRES
    assert parse_time("2026-12-01T08:00:00Z") == EXPIRES


@pytest.mark.parametrize("text", ["2026-12-01T08:00:00+00:00", "2026-12-01T08:00:00.5Z",
                                  "2026-12-01t08:00:00z", "2026-02-30T08:00:00Z", 1796112000])
def test_other_spellings_of_a_time_are_refused(text: Any) -> None:
    """A sealed body has one spelling of each instant; offsets, fractions, bad dates refused."""
    with pytest.raises(InvalidInput):
        parse_time(text)


def test_stored_checkpoint_round_trips_and_an_edit_is_refused() -> None:
    """from_body re-derives the CID: the stored body reads back; an edited one is refused."""
    checkpoint = sealed()
    stored = json.loads(json.dumps(checkpoint.body))
    assert Checkpoint.from_body(stored, checkpoint.cid) == checkpoint
    edited = json.loads(json.dumps(stored))
    edited["environment"]["target"] = "elsewhere"
    with pytest.raises(InvalidInput) as caught:
        Checkpoint.from_body(edited, checkpoint.cid)
    assert caught.value.detail["stored_cid"] == checkpoint.cid
    assert caught.value.detail["computed_cid"] == jcs_cid(edited)
    with pytest.raises(InvalidInput):
        Checkpoint.from_body(stored, "sha256:" + "0" * 64)


@pytest.mark.parametrize("edit", [
    lambda b: b.update(extra=1),
    lambda b: b.pop("preview_cid"),
    lambda b: b["routing"].update(outcome="allow"),
    lambda b: b["routing"].update(approvals=0),
    lambda b: b["environment"].update(pilot_id=""),
    lambda b: b.update(change_cid="sha256:XYZ"),
    lambda b: b.update(version="marque-checkpoint/0.2"),
])
def test_malformed_checkpoint_bodies_are_refused(edit: Any) -> None:
    """Unknown or missing members, a non-delegate outcome, bad counts, CIDs or names: refused."""
    body = json.loads(json.dumps(LITERAL_CHECKPOINT))
    edit(body)
    with pytest.raises(InvalidInput):
        Checkpoint.from_body(body, jcs_cid(body))


def test_resolution_body_and_cid_are_the_literal_ones() -> None:
    """A Resolution names the Checkpoint's CID; an approval without a reason says null."""
    checkpoint = sealed()
    resolution = resolve(checkpoint, "bob", at=EXPIRES - 60)
    literal = {"version": "marque-resolution/0.1", "checkpoint_cid": jcs_cid(LITERAL_CHECKPOINT),
               "decision": "approve", "approver": "bob", "reason": None,
               "at": "2026-12-01T07:59:00Z"}
    assert resolution.body == literal
    assert resolution.cid == jcs_cid(literal)
    assert Resolution.from_body(json.loads(json.dumps(literal)), resolution.cid) == resolution
    literal["approver"] = "mallory"
    with pytest.raises(InvalidInput):
        Resolution.from_body(literal, resolution.cid)


def test_a_reject_needs_a_reason_and_an_approval_reason_is_never_blank() -> None:
    """Reject without (or with a blank) reason refused; an approval's reason is null or text."""
    checkpoint = sealed()
    for reason in (None, "", "   "):
        with pytest.raises(InvalidInput):
            resolve(checkpoint, "bob", "reject", reason)
    with pytest.raises(InvalidInput):
        resolve(checkpoint, "bob", "approve", "")
    with pytest.raises(InvalidInput):
        resolve(checkpoint, "bob", "maybe")
    assert resolve(checkpoint, "bob", "reject", "too wide").decision is Decision.REJECT
    assert resolve(checkpoint, "bob", "approve", "checked the sample").reason == (
        "checked the sample")


def test_a_retried_resolution_in_the_same_second_is_the_same_resolution() -> None:
    """Same approver, decision, reason and second: one CID, so a store keyed by it dedupes."""
    checkpoint = sealed()
    assert resolve(checkpoint, "bob", at=EXPIRES - 60.2).cid == resolve(
        checkpoint, "bob", at=EXPIRES - 60.9).cid


# -- the tally ----------------------------------------------------------------------------


def test_self_approval_is_refused_at_submission_and_in_the_tally() -> None:
    """The requester's own approval is self_approval, before storing and when counting."""
    checkpoint = sealed()
    own = resolve(checkpoint, REQUESTER)
    with pytest.raises(SelfApproval):
        check_resolution(checkpoint, own, requester=REQUESTER, self_approval_allowed=False)
    with pytest.raises(SelfApproval):
        tally(checkpoint, [own], requester=REQUESTER, self_approval_allowed=False)


def test_self_approval_counts_when_the_entry_allows_it() -> None:
    """With self_approval = true the requester's approval is an approval like any other."""
    checkpoint = sealed()
    own = resolve(checkpoint, REQUESTER)
    check_resolution(checkpoint, own, requester=REQUESTER, self_approval_allowed=True)
    result = tally(checkpoint, [own], requester=REQUESTER, self_approval_allowed=True)
    assert result.state is TallyState.APPROVED
    assert result.approvers == (REQUESTER,)
    assert result.approval_cids == (own.cid,)


def test_the_requester_may_reject_their_own_request() -> None:
    """Only approval is self_approval: a requester's reject stops their own request."""
    checkpoint = sealed()
    withdrawn = resolve(checkpoint, REQUESTER, "reject", "asked by mistake")
    check_resolution(checkpoint, withdrawn, requester=REQUESTER, self_approval_allowed=False)
    result = tally(checkpoint, [withdrawn], requester=REQUESTER, self_approval_allowed=False)
    assert result.state is TallyState.REJECTED
    assert result.rejected_by == REQUESTER


def test_two_approvals_by_one_approver_count_once() -> None:
    """Bob approving twice is one distinct approver: two required, still pending."""
    checkpoint = sealed(approvals=2)
    first = resolve(checkpoint, "bob", at=EXPIRES - 600)
    again = resolve(checkpoint, "bob", reason="really", at=EXPIRES - 500)
    assert first.cid != again.cid
    result = tally(checkpoint, [first, again], requester=REQUESTER, self_approval_allowed=False)
    assert result.state is TallyState.PENDING
    assert result.approvers == ("bob",)
    assert result.approval_cids == (first.cid,)
    assert result.remaining == 1


def test_two_required_approvals_need_two_distinct_approvers() -> None:
    """approvals = 2: one approver leaves it pending; a second, distinct one approves it."""
    checkpoint = sealed(approvals=2)
    bob = resolve(checkpoint, "bob", at=EXPIRES - 600)
    carol = resolve(checkpoint, "carol", at=EXPIRES - 300)
    pending = tally(checkpoint, [bob], requester=REQUESTER, self_approval_allowed=False)
    assert pending.state is TallyState.PENDING
    done = tally(checkpoint, [carol, bob], requester=REQUESTER, self_approval_allowed=False)
    assert done.state is TallyState.APPROVED
    assert done.approvers == ("bob", "carol")
    assert done.approval_cids == (bob.cid, carol.cid)
    assert done.remaining == 0


def test_one_reject_rejects_even_after_enough_approvals() -> None:
    """Two approvals of two required, then one reject: rejected, naming who and why."""
    checkpoint = sealed(approvals=2)
    approvals = [resolve(checkpoint, "bob", at=EXPIRES - 600),
                 resolve(checkpoint, "carol", at=EXPIRES - 500)]
    reject = resolve(checkpoint, "dave", "reject", "touches every row", at=EXPIRES - 400)
    result = tally(checkpoint, [*approvals, reject], requester=REQUESTER,
                   self_approval_allowed=False)
    assert result.state is TallyState.REJECTED
    assert (result.rejected_by, result.reject_reason, result.rejection_cid) == (
        "dave", "touches every row", reject.cid)
    assert result.to_json()["state"] == "rejected"


def test_the_tally_does_not_depend_on_the_order_resolutions_come_in() -> None:
    """Counted in (at, cid) order: any permutation gives the same tally."""
    checkpoint = sealed(approvals=3)
    resolutions = [resolve(checkpoint, name, at=EXPIRES - 900 + 60 * i)
                   for i, name in enumerate(["bob", "carol", "bob", "dave", "erin"])]
    expected = tally(checkpoint, resolutions, requester=REQUESTER, self_approval_allowed=False)
    shuffled = list(resolutions)
    random.Random(7).shuffle(shuffled)
    assert tally(checkpoint, shuffled, requester=REQUESTER,
                 self_approval_allowed=False) == expected
    assert expected.approvers == ("bob", "carol", "dave", "erin")


def test_resolutions_of_another_checkpoint_are_never_counted() -> None:
    """At submission a superseded Checkpoint's Resolution is a conflict; in a tally, refused."""
    current, old = sealed(), sealed(config_cid=OTHER_CONFIG)
    stale = resolve(old, "bob")
    with pytest.raises(Conflict):
        check_resolution(current, stale, requester=REQUESTER, self_approval_allowed=False)
    with pytest.raises(InvalidInput):
        tally(current, [stale], requester=REQUESTER, self_approval_allowed=False)


def test_approvals_required_cannot_go_below_the_sealed_count() -> None:
    """A caller may not lower the bar the Checkpoint sealed."""
    checkpoint = sealed(approvals=2)
    bob = resolve(checkpoint, "bob")
    with pytest.raises(InvalidInput):
        tally(checkpoint, [bob], requester=REQUESTER, self_approval_allowed=False,
              approvals_required=1)


def test_no_resolution_counts_on_a_decided_or_expired_checkpoint() -> None:
    """After approval or rejection a further Resolution conflicts; after expiry it is expired."""
    checkpoint = sealed()
    bob = resolve(checkpoint, "bob")
    late = resolve(checkpoint, "carol", "reject", "second thoughts")
    with pytest.raises(Conflict):
        check_resolution(checkpoint, late, requester=REQUESTER, self_approval_allowed=False,
                         existing=[bob])
    check_resolution(checkpoint, late, requester=REQUESTER, self_approval_allowed=False,
                     existing=[])
    expired = resolve(checkpoint, "carol", at=EXPIRES)
    with pytest.raises(RequestExpired):
        check_resolution(checkpoint, expired, requester=REQUESTER, self_approval_allowed=False)


# -- revalidation -------------------------------------------------------------------------


def current(**overrides: Any) -> dict[str, Any]:
    state: dict[str, Any] = dict(adopted_config_cid=CONFIG, pilot_id="pilot-a",
                                 pilot_incarnation="inc-1", target="shop", now=EXPIRES - 1,
                                 pilot_targets=("shop", "crm"))
    state.update(overrides)
    return state


def test_revalidation_passes_when_nothing_changed() -> None:
    """Same config, Pilot, incarnation and target, one second before expiry: nothing fails."""
    checkpoint = sealed()
    assert revalidate(checkpoint, **current()) == []
    require_revalidated(checkpoint, **current())


@pytest.mark.parametrize(("overrides", "failed"), [
    ({"adopted_config_cid": OTHER_CONFIG}, [CONFIG_CHANGED]),
    ({"adopted_config_cid": None}, [CONFIG_CHANGED]),
    ({"pilot_incarnation": "inc-2"}, [INCARNATION_CHANGED]),
    ({"pilot_incarnation": None}, [INCARNATION_CHANGED]),
    ({"now": EXPIRES}, [CHECKPOINT_EXPIRED]),
    ({"now": EXPIRES + 86400}, [CHECKPOINT_EXPIRED]),
    ({"pilot_id": "pilot-b"}, [PILOT_CHANGED]),
    ({"target": "crm"}, [TARGET_CHANGED]),
    ({"pilot_targets": ("crm",)}, [TARGET_NOT_SERVED]),
    ({"adopted_config_cid": OTHER_CONFIG, "pilot_incarnation": "inc-2", "now": EXPIRES},
     [CONFIG_CHANGED, INCARNATION_CHANGED, CHECKPOINT_EXPIRED]),
])
def test_revalidation_names_what_changed(overrides: dict[str, Any], failed: list[str]) -> None:
    """Each change is named; the raising helper refuses with revalidation_failed naming them."""
    checkpoint = sealed()
    assert revalidate(checkpoint, **current(**overrides)) == failed
    with pytest.raises(RevalidationFailed) as caught:
        require_revalidated(checkpoint, **current(**overrides))
    assert caught.value.code == "revalidation_failed"
    assert caught.value.detail["failed"] == failed
    assert all(name in caught.value.message for name in failed)
