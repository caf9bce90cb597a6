"""The ledger's continuity (DESIGN §5): the targets' stamps are the anchor outside it.

A ledger restored from an old copy keeps its incarnation but forgets
attempts. The stamps the targets hold for this incarnation remember them, so a
stamp the ledger does not know means the ledger went back in time.

A target that cannot be read at start cannot vouch either way, so it is not
taken on trust: it stays *unchecked* (:attr:`Continuity.unchecked`, with
the error that kept it so) and every execution on it first checks it again
(:meth:`Continuity.ensure`). While it still cannot be read, the execution
sends it nothing: the attempt is claimed and ends ``aborted_not_applied``
with that error (``target_unavailable``: the same nonce runs again as its
next attempt, as for a target that refuses the connection, DESIGN §9).
Otherwise a ledger restored while a target was down would spend, once the
target is back, budget the target's stamps say was already spent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import Any

from marque.errors import LedgerUnavailable, MarqueError, TargetReplaced, TargetUnavailable
from marque.pilot.context import PilotContext

#: How often a refused target's binding is looked at again (a rebinding, a name pointed
#: back): a flood of calls on a replaced target asks its database at most this often.
RECHECK_SECONDS = 1.0


class Continuity:
    """The continuity check of a Pilot's targets, and what it found: targets unchecked
    (their stamps unread since start, and why) and targets replaced (their name points at
    another database than the ledger bound it to)."""

    def __init__(self, context: PilotContext) -> None:
        self._ctx = context
        #: Targets whose stamps the continuity check could not read yet (DESIGN §5), and why.
        self.unchecked: set[str] = set()
        self.errors: dict[str, MarqueError] = {}
        self.lock = threading.Lock()
        #: The names found pointing at another database (:meth:`replaced` refuses them).
        self.replaced_targets: dict[str, dict[str, Any]] = {}
        self.replaced_checked_at: dict[str, float] = {}

    def check(self, only: Collection[str] | None = None) -> dict[str, Any] | None:
        """DESIGN §5: the targets' stamps are the anchor outside the ledger.

        A stamp of this incarnation, for a marque still live, that the ledger
        does not know means the ledger went back in time (restored from an
        old copy). Its budgets cannot be trusted, so the Pilot rotates to a
        new incarnation — refusing every outstanding marque — and records
        the finding. Returns the finding, or None.

        ``only``: check just these targets (a target unchecked at start, now
        asked again). Targets that cannot be read are left in
        :attr:`unchecked`; a rotation empties it, as the new
        incarnation has no stamps anywhere yet.
        """
        ctx = self._ctx
        live_after = ctx.clock() - ctx.options.skew_seconds
        unknown: list[dict[str, Any]] = []
        unchecked: list[str] = []
        checked: list[str] = []
        for name, target in ctx.targets.items():
            if only is not None and name not in only:
                continue
            try:
                # One read of the target: its identity and its stamps, on one connection.
                live = target.live_stamps(ctx.incarnation, live_after)
                if not self._holds_binding(name, live.target_id):
                    # Read, and not ours: its stamps say nothing of this ledger.
                    checked.append(name)
                    continue
            except LedgerUnavailable:
                raise
            except Exception as exc:  # an unreachable target cannot vouch either way: asked again
                unchecked.append(name)
                self.errors[name] = exc if isinstance(exc, MarqueError) else \
                    TargetUnavailable(f"target {name}'s stamps could not be read: {exc}")
                continue
            checked.append(name)
            self.errors.pop(name, None)
            unknown.extend({"target": name, **stamp} for stamp in live.stamps
                           if not self._knows(stamp))
            unknown.extend({"target": name, "row": True, **stamp} for stamp in live.row_stamps
                           if not self._knows_nonce(stamp))
        self.unchecked = (self.unchecked - set(checked)) | set(unchecked)
        if not unknown:
            return None
        return self._rotate(unknown, unchecked)

    def _rotate(self, unknown: list[dict[str, Any]], unchecked: list[str]) -> dict[str, Any]:
        """The ledger went back in time: a new incarnation, and the finding logged."""
        ctx = self._ctx
        old = ctx.incarnation
        new = ctx.ledger.rotate_incarnation(ctx.clock())
        self.unchecked = set()
        self.errors.clear()
        finding = {"finding": "ledger_regressed", "old_incarnation": old,
                   "new_incarnation": new, "pilot_id": ctx.pilot_id,
                   "unknown_stamps": unknown, "unchecked_targets": unchecked}
        if ctx.logbook is not None:
            ctx.logbook.append("finding.ledger_regressed", f"finding/rotate/{old}", finding)
        return finding

    def _holds_binding(self, name: str, target_id: str) -> bool:
        """Bind ``name`` to the identity found there if the ledger has none; whether the
        database it points at now is the one the ledger bound it to.

        A name bound to another identity is *replaced*: executions and previews on it are
        refused (:meth:`replaced`) and reconciliation writes no tombstone in it, until the
        operator points it back or rebinds it (``marque pilot target rebind``). The first
        time it is found so, the finding goes to the logbook.
        """
        # A read, on every start and recheck; the write (and its commit) only for a name the
        # ledger never bound. The ledger is read again, not this process's copy: a rebinding
        # by another process must be seen.
        binding = self._ctx.ledger.target_binding(name) or self._ctx.ledger.bind_target(
            name, target_id, self._ctx.targets[name].location(), now=self._ctx.clock())
        self._ctx.target_ids[name] = binding.target_id
        if binding.target_id == target_id:
            self.replaced_targets.pop(name, None)
            return True
        finding = {"finding": "target_replaced", "target": name,
                   "location": self._ctx.targets[name].location(), "found_target_id": target_id,
                   "bound_target_id": binding.target_id, "bound_location": binding.location,
                   "pilot_id": self._ctx.pilot_id}
        if self.replaced_targets.get(name) != finding:
            self.replaced_targets[name] = finding
            if self._ctx.logbook is not None:
                self._ctx.logbook.append("finding.target_replaced",
                                         f"finding/target/{name}/{target_id}", finding)
        return False

    def refuse_if_replaced(self, target: str) -> None:
        """Refuse (``target_replaced``) an execution or preview on a replaced target.

        The binding is looked at again first, at most once every :data:`RECHECK_SECONDS`,
        so a ``pilot target rebind`` (or the database coming back under the name) takes
        effect in a running Pilot without a restart. Looking again is a continuity check
        of that target: a rotation it causes refuses the marque at hand as
        ``wrong_incarnation`` (the caller checks the marque again).
        """
        if target not in self.replaced_targets:
            return
        with self.lock:
            now = time.monotonic()
            if now - self.replaced_checked_at.get(target, float("-inf")) >= RECHECK_SECONDS:
                self.replaced_checked_at[target] = now
                self.check(only=(target,))
        refused = self.replaced(target)
        if refused is not None:
            raise refused

    def replaced(self, target: str) -> TargetReplaced | None:
        """The refusal for an execution or preview on a target whose name points at another
        database than the ledger bound it to, or None."""
        finding = self.replaced_targets.get(target)
        if finding is None:
            return None
        return TargetReplaced(
            f"target {target} now points at another database ({finding['location']}, identity "
            f"{finding['found_target_id']}) than this Pilot's ledger knows it by (identity "
            f"{finding['bound_target_id']}, at {finding['bound_location']}). Nothing was claimed "
            "or sent. Point the name back at that database, or, if the move is meant, accept it "
            f"with `marque pilot target rebind {target}`",
            detail={k: v for k, v in finding.items() if k != "finding"})

    def ensure(self, target: str) -> None:
        """Before a claim on ``target``: if its stamps were never read since start, read them now.

        A rotation that follows makes the marque at hand ``wrong_incarnation``
        (the caller checks the marque again). A target that still cannot be read
        stays unchecked: :meth:`unreadable` then says why, and the execution sends
        it nothing.
        """
        with self.lock:
            if target in self.unchecked:
                self.check(only=(target,))

    def unreadable(self, target: str) -> MarqueError | None:
        """Why an execution on ``target`` must send it nothing now, or None if it may go on.

        The error is the target's own (its host and port, or its file), with the
        reason added: its stamps are unread since start, so whether the ledger
        went back in time is not known yet (DESIGN §5).
        """
        if target not in self.unchecked:
            return None
        cause = self.errors.get(target)
        why = cause.message if cause is not None else f"target {target} could not be read"
        return TargetUnavailable(
            f"{why}. Its stamps are unread since this Pilot started, so it cannot tell yet "
            "whether its ledger was restored from an older copy: nothing was sent to the target. "
            "The same nonce runs again once the target is reachable",
            detail={"target": target, "reason": "continuity_unchecked"})

    def _knows_nonce(self, stamp: dict[str, Any]) -> bool:
        """Whether the ledger holds (or reaped) the execution an Effect Set row stamp names.

        A row stamp names its nonce, not the nonce's attempt: a ledger that never
        claimed that nonce went back in time. (One restored from the middle of the
        execution still knows the nonce; its rows' stamps keep those rows from
        applying twice.)
        """
        if self._ctx.ledger.attempts(stamp["marque_id"], stamp["nonce"]):
            return True
        return self._ctx.ledger.reaped(stamp["marque_id"], stamp["nonce"]) is not None

    def _knows(self, stamp: dict[str, Any]) -> bool:
        """Whether the ledger holds the attempt a stamp names — or held it and reaped it.

        A reaped nonce keeps its final attempt number, so its stamps stay known
        (a reap is not a regression, even once a wider skew allowance makes the
        marque look live again); a ledger restored from before the reap has
        neither the entries nor the record, and is still caught.
        """
        held = {a.attempt for a in self._ctx.ledger.attempts(stamp["marque_id"], stamp["nonce"])}
        if held:
            return stamp["attempt"] in held
        reaped = self._ctx.ledger.reaped(stamp["marque_id"], stamp["nonce"])
        return reaped is not None and stamp["attempt"] <= reaped.attempt
