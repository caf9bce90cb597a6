"""Requests, Checkpoints, Resolutions and reports: the store's SQL for DESIGN §11.2–§11.5.

Three rules hold every write here:

* **One race guard.** Among blocking states a logical request scope is unique
  by a partial unique index; :meth:`RequestRecords.create_request` inserts with
  ``ON CONFLICT DO NOTHING`` and reads the row that holds the scope only after
  the index refused it. No preflight read decides anything.
* **Compare-and-set.** Every move is ``UPDATE … WHERE id = ? AND version = ?``;
  of two callers holding the same version exactly one moves the row.
* **The journal moves with the state.** Each move appends its logbook entry in
  the same transaction, and a compensating request carries its original along
  in that transaction too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from marque.errors import Conflict, Forbidden, InvalidInput, NotFound, RequestExpired
from marque.harbour.executions import (
    STALE_PREVIEW,
    STALE_PREVIEW_NEXT_STEP,
    latest_attempts,
    next_state,
)
from marque.harbour.lifecycle import (
    PRIMITIVE_ONLY,
    ExpiryRefused,
    IllegalTransition,
    IntentConflict,
    RequestState,
    StaleVersion,
    transition,
)
from marque.harbour.store.base import (
    DECISIONS,
    UPDATABLE_FIELDS,
    Checkpoint,
    Report,
    RequestDraft,
    RequestParts,
    Resolution,
    StoredRequest,
)
from marque.harbour.store.columns import canonical_json, loads
from marque.harbour.store.hooks import StoreHooks
from marque.harbour.store.schema import ACTIVE_PREDICATE
from marque.harbour.store.schema import CURRENT_REQUEST_COLUMNS as REQUEST_COLUMNS
from marque.harbour.store.webhook_sql import record_events
from marque.storage.tx import Tx

S = RequestState
_COLUMNS = ", ".join(REQUEST_COLUMNS)
_JSON_FIELDS = frozenset({"change", "budget", "routing", "preview", "failure"})
_IN_BLOCKING = ACTIVE_PREDICATE
#: The states a compensating request is in once approved: leaving them settles the original.
_COMPENSATION_RUNNING = frozenset({S.PREPARED, S.EXECUTING, S.RECONCILIATION})
#: How the original moves when its compensating request reaches a state.
_CARRIED: dict[RequestState, tuple[frozenset[RequestState], RequestState]] = {
    S.PREPARED: (frozenset({S.VERIFIED, S.ROLLBACK_FAILED}), S.ROLLING_BACK),
    S.VERIFIED: (frozenset({S.ROLLING_BACK}), S.ROLLED_BACK),
    S.FAILED: (frozenset({S.ROLLING_BACK}), S.ROLLBACK_FAILED),
    # Proved never to have run: the original's effect stands untouched.
    S.EXPIRED: (frozenset({S.ROLLING_BACK}), S.VERIFIED),
}
#: Logbook entries a transaction will append, in order, once its rows are written.
Journal = list[tuple[str, str, str, dict[str, Any]]]
#: The Pilot's ledger has lost track of these: only stamps can settle them now.
_PINNED = (S.PREPARED, S.EXECUTING)


#: Values bound in one ``IN (…)`` list: a page of requests is one chunk, well under
#: SQLite's limit on a statement's parameters.
_IN_CHUNK = 500


def _chunks(values: list[str]) -> list[list[str]]:
    return [values[i:i + _IN_CHUNK] for i in range(0, len(values), _IN_CHUNK)]


def _request(row: tuple[Any, ...]) -> StoredRequest:
    values = dict(zip(REQUEST_COLUMNS, row, strict=True))
    for name in _JSON_FIELDS:
        values[name] = loads(values[name])
    values["state"] = RequestState(values["state"])
    return StoredRequest(**values)


def _resolution(row: tuple[Any, ...]) -> Resolution:
    return Resolution(resolution_cid=row[0], checkpoint_cid=row[1], approver=row[2],
                      decision=row[3], body=loads(row[4]), at=row[5])


_RESOLUTION_COLUMNS = "resolution_cid, checkpoint_cid, approver, decision, body, at"


class RequestRecords(StoreHooks):
    """Request operations, over the hooks ``sql.SqlHarbourStore`` provides."""

    def _flush_tx(self, tx: Tx, journal: Journal, now: float) -> None:
        """Append ``journal``'s entries inside ``tx``.

        Always after the transaction's row writes: the logbook head is then the
        last lock every transaction takes, so no two transactions can each hold
        what the other waits for. The notifications these moves call for are written
        first, in the same transaction (``webhook_sql.record_events``).
        """
        record_events(tx, journal, now, getattr(self, "harbour_id", None))
        for kind, actor, subject, body in journal:
            self._append_tx(tx, kind, actor, subject, body, now)

    # -- creating and reading ------------------------------------------------------

    def create_request(self, draft: RequestDraft, *, actor: str | None = None,
                       now: float | None = None) -> tuple[StoredRequest, bool]:
        at = self._now(now)
        # A holder of the scope may leave its blocking state between our refused insert
        # and our read; then the insert is simply tried again.
        for _ in range(5):
            with self.transaction() as tx:
                if draft.rolls_back is not None:
                    self._check_compensable(tx, draft.rolls_back)
                new_id = "rq_" + uuid.uuid4().hex
                inserted = tx.execute(
                    f"INSERT INTO requests ({_COLUMNS}) VALUES "
                    f"({', '.join('?' for _ in REQUEST_COLUMNS)}) "
                    "ON CONFLICT DO NOTHING RETURNING id",
                    (new_id, draft.request_id, draft.principal, draft.reason, draft.pilot_id,
                     draft.target, canonical_json(draft.change), canonical_json(draft.budget),
                     int(draft.ttl_seconds), draft.change_cid, draft.authority_scope_cid,
                     draft.logical_request_scope, draft.intent_fingerprint, None, None, None,
                     None, draft.rolls_back, S.PREPARING.value, 1, at, at, None, None, None,
                     draft.requester_jkt, 0, None))
                if inserted:
                    self._append_tx(tx, "request.preparing", actor or draft.principal, new_id, {
                        "request_id": draft.request_id, "principal": draft.principal,
                        "logical_request_scope": draft.logical_request_scope,
                        "intent_fingerprint": draft.intent_fingerprint,
                        "change_cid": draft.change_cid, "pilot_id": draft.pilot_id,
                        "target": draft.target, "reason": draft.reason,
                        "rolls_back": draft.rolls_back, "to": S.PREPARING.value, "version": 1,
                        **({} if draft.requester_jkt is None
                           else {"requester_jkt": draft.requester_jkt}),
                    }, at)
                    return self._get_tx(tx, new_id), True
                active = self._active_tx(tx, draft.logical_request_scope)
            if active is None:
                continue
            if active.intent_fingerprint == draft.intent_fingerprint:
                return active, False
            raise IntentConflict(
                f"request id {draft.request_id[:64]!r} is already used by request {active.id} "
                "with a different change; choose a new request id, or repeat that request's "
                "exact change",
                detail={"request": active.id,
                        "logical_request_scope": active.logical_request_scope})
        raise Conflict("the request's scope kept changing hands while it was being created; retry")

    def _check_compensable(self, tx: Tx, original_id: str) -> None:
        original = self._get_tx(tx, original_id)
        if original.state not in (S.VERIFIED, S.ROLLBACK_FAILED):
            raise IllegalTransition(
                f"request {original.id} is {original.state}: only a verified request (or one "
                "whose rollback failed) can be compensated",
                detail={"rolls_back": original.id, "state": original.state.value})

    def get_request(self, id: str) -> StoredRequest:
        with self.reading() as tx:
            return self._get_tx(tx, id)

    def _get_tx(self, tx: Tx, id: str) -> StoredRequest:
        row = tx.one(f"SELECT {_COLUMNS} FROM requests WHERE id = ?", (id,))
        if row is None:
            raise NotFound(f"no request {str(id)[:64]!r}", detail={"id": str(id)[:64]})
        return _request(row)

    def _active_tx(self, tx: Tx, scope: str) -> StoredRequest | None:
        row = tx.one(f"SELECT {_COLUMNS} FROM requests WHERE logical_request_scope = ? "
                     f"AND {_IN_BLOCKING}", (scope,))
        return None if row is None else _request(row)

    def find_active(self, logical_request_scope: str) -> StoredRequest | None:
        with self.reading() as tx:
            return self._active_tx(tx, logical_request_scope)

    def find_history(self, logical_request_scope: str) -> list[StoredRequest]:
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_COLUMNS} FROM requests WHERE logical_request_scope = ? "
                              "ORDER BY created_at, id", (logical_request_scope,))
        return [_request(row) for row in rows]

    def list_requests(self, state: RequestState | str | None = None,
                      principal: str | None = None, *, limit: int | None = None,
                      before: tuple[float, str] | None = None) -> list[StoredRequest]:
        where: list[str] = []
        params: list[Any] = []
        if state is not None:
            where.append("state = ?")
            params.append(_state(state).value)
        if principal is not None:
            where.append("principal = ?")
            params.append(principal)
        if before is not None:
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            params.extend((float(before[0]), float(before[0]), str(before[1])))
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        bound = ""
        if limit is not None:
            bound = " LIMIT ?"
            params.append(int(limit))
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_COLUMNS} FROM requests{clause} "
                              f"ORDER BY created_at DESC, id DESC{bound}", params)
        return [_request(row) for row in rows]

    def get_requests(self, ids: Sequence[str]) -> dict[str, StoredRequest]:
        wanted = sorted({str(i) for i in ids})
        found: dict[str, StoredRequest] = {}
        if not wanted:
            return found
        with self.reading() as tx:
            self._requests_in_tx(tx, wanted, found)
        return found

    @staticmethod
    def _requests_in_tx(tx: Tx, ids: list[str], found: dict[str, StoredRequest]) -> None:
        """Add the requests of ``ids`` to ``found``, an ``IN (…)`` list a chunk at a time."""
        for chunk in _chunks(ids):
            marks = ", ".join("?" for _ in chunk)
            for row in tx.execute(f"SELECT {_COLUMNS} FROM requests WHERE id IN ({marks})",
                                  chunk):
                request = _request(row)
                found[request.id] = request

    def count_requests(self, principal: str | None = None) -> dict[str, int]:
        clause, params = ("", ()) if principal is None else (" WHERE principal = ?",
                                                             (principal,))
        with self.reading() as tx:
            rows = tx.execute(f"SELECT state, COUNT(*) FROM requests{clause} GROUP BY state",
                              params)
        return {str(state): int(n) for state, n in rows}

    # -- moving ------------------------------------------------------------------------

    def transition(self, id: str, expected_version: int, to: RequestState | str, *,
                   actor: str, now: float | None = None, reason: str | None = None,
                   body: dict[str, Any] | None = None, kind: str | None = None,
                   **updates: Any) -> StoredRequest:
        target = _state(to)
        unknown = set(updates) - UPDATABLE_FIELDS
        if unknown:
            raise InvalidInput(f"a transition cannot set {', '.join(sorted(unknown))}; it may "
                               f"set {', '.join(sorted(UPDATABLE_FIELDS))}")
        at = self._now(now)
        with self.transaction() as tx:
            current = self._get_tx(tx, id)
            if current.version != expected_version:
                raise _stale(current, expected_version)
            if (current.state, target) in PRIMITIVE_ONLY:
                raise IllegalTransition(
                    f"{current.state} → {target} is made only by its own store operation "
                    "(expire_prepared, or the compensating request's own moves), never by a "
                    "plain transition", detail={"from": current.state.value, "to": target.value})
            journal: Journal = []
            moved = self._move_tx(tx, current, expected_version, target, journal, actor=actor,
                                  now=at, reason=reason, body=body, kind=kind, updates=updates)
            self._flush_tx(tx, journal, at)
            return moved

    def _move_tx(self, tx: Tx, current: StoredRequest, expected_version: int, to: RequestState,
                 journal: Journal, *, actor: str, now: float, reason: str | None = None,
                 body: dict[str, Any] | None = None, kind: str | None = None,
                 updates: dict[str, Any] | None = None, carry: bool = True) -> StoredRequest:
        """Move ``current`` by compare-and-set inside ``tx``; its entry goes to ``journal``."""
        if current.version != expected_version:
            raise _stale(current, expected_version)
        transition(current.state, to)
        updates = updates or {}
        sets = ["state = ?", "version = version + 1", "updated_at = ?"]
        params: list[Any] = [to.value, now]
        for name in sorted(updates):
            sets.append(f"{name} = ?")
            params.append(canonical_json(updates[name]) if name in _JSON_FIELDS else updates[name])
        moved = tx.execute(f"UPDATE requests SET {', '.join(sets)} WHERE id = ? AND version = ? "
                           "RETURNING version", (*params, current.id, expected_version))
        if not moved:
            raise _stale(current, expected_version)
        logged: dict[str, Any] = {
            "request_id": current.request_id, "from": current.state.value, "to": to.value,
            "version": int(moved[0][0]), "reason": reason,
            **{name: updates[name] for name in ("checkpoint_cid", "marque_id", "failure",
                                                "marque_expires_at") if name in updates},
        }
        if "routing" in updates:
            logged["routing"] = updates["routing"]
        if "preview" in updates and isinstance(updates["preview"], dict):
            logged["preview_cid"] = updates["preview"].get("preview_cid")
        logged.update(body or {})
        journal.append((kind or f"request.{to.value}", actor, current.id, logged))
        if carry and current.rolls_back is not None:
            self._carry_original_tx(tx, current, to, journal, actor=actor, now=now)
        return self._get_tx(tx, current.id)

    def _carry_original_tx(self, tx: Tx, compensating: StoredRequest, to: RequestState,
                           journal: Journal, *, actor: str, now: float) -> None:
        """Move a compensating request's original with it (DESIGN §11.2), in ``tx``."""
        if to not in _CARRIED:
            return
        if to is not S.PREPARED and compensating.state not in _COMPENSATION_RUNNING:
            return  # never approved: the original was never touched by this request
        assert compensating.rolls_back is not None
        original = self._get_tx(tx, compensating.rolls_back)
        sources, destination = _CARRIED[to]
        if original.state not in sources:
            raise IllegalTransition(
                f"request {compensating.id} compensates {original.id}, which is "
                f"{original.state}: it cannot move to {destination} with it",
                detail={"rolls_back": original.id, "state": original.state.value,
                        "to": destination.value})
        self._move_tx(tx, original, original.version, destination, journal, actor=actor,
                      now=now, body={"compensated_by": compensating.id}, carry=False)

    # -- preparing again -----------------------------------------------------------------

    def note_preparation(self, id: str, expected_version: int, *, attempts: int, due: float,
                         failure: dict[str, Any] | None, actor: str,
                         now: float | None = None, kind: str | None = None) -> StoredRequest:
        at = self._now(now)
        with self.transaction() as tx:
            current = self._get_tx(tx, id)
            if current.version != expected_version:
                raise _stale(current, expected_version)
            if current.state is not S.PREPARING:
                raise IllegalTransition(
                    f"request {current.id} is {current.state}: only a preparing request's "
                    "preparation is tried again", detail={"from": current.state.value})
            moved = tx.execute(
                "UPDATE requests SET version = version + 1, updated_at = ?, "
                "prepare_attempts = ?, prepare_due = ?, failure = ? "
                "WHERE id = ? AND version = ? AND state = ? RETURNING version",
                (at, int(attempts), float(due), canonical_json(failure), current.id,
                 expected_version, S.PREPARING.value))
            if not moved:
                raise _stale(current, expected_version)
            if kind is not None:
                self._append_tx(tx, kind, actor, current.id, {
                    "request_id": current.request_id, "attempt": int(attempts),
                    "next_attempt_at": float(due), "failure": failure,
                    "version": int(moved[0][0])}, at)
            return self._get_tx(tx, current.id)

    def preparations_due(self, now: float, *, untouched_since: float) -> list[StoredRequest]:
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {_COLUMNS} FROM requests WHERE state = ? AND "
                "(prepare_due <= ? OR (prepare_due IS NULL AND updated_at <= ?)) "
                "ORDER BY created_at, id", (S.PREPARING.value, now, untouched_since))
        return [_request(row) for row in rows]

    # -- Checkpoints and Resolutions --------------------------------------------------------

    def seal_checkpoint(self, id: str, expected_version: int, *, checkpoint_cid: str,
                        body: dict[str, Any], expires_at: float, actor: str,
                        now: float | None = None, kind: str | None = None,
                        **updates: Any) -> StoredRequest:
        unknown = set(updates) - (UPDATABLE_FIELDS - {"checkpoint_cid"})
        if unknown:
            raise InvalidInput(f"sealing a Checkpoint cannot set {', '.join(sorted(unknown))}")
        at = self._now(now)
        with self.transaction() as tx:
            current = self._get_tx(tx, id)
            if current.version != expected_version:
                raise _stale(current, expected_version)
            stored = tx.execute(
                "INSERT INTO checkpoints (checkpoint_cid, request, body, expires_at, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING checkpoint_cid",
                (checkpoint_cid, current.id, canonical_json(body), float(expires_at), at))
            if not stored:
                raise Conflict(f"Checkpoint {checkpoint_cid[:80]} is already sealed",
                               detail={"checkpoint_cid": checkpoint_cid})
            journal: Journal = []
            moved = self._move_tx(tx, current, expected_version, S.AWAITING_APPROVAL, journal,
                                  actor=actor, now=at, body={"expires_at": float(expires_at)},
                                  kind=kind,
                                  updates={**updates, "checkpoint_cid": checkpoint_cid})
            self._flush_tx(tx, journal, at)
            return moved

    def get_checkpoint(self, checkpoint_cid: str) -> Checkpoint:
        with self.reading() as tx:
            row = tx.one("SELECT checkpoint_cid, request, body, expires_at, created_at "
                         "FROM checkpoints WHERE checkpoint_cid = ?", (checkpoint_cid,))
        if row is None:
            raise NotFound(f"no Checkpoint {str(checkpoint_cid)[:80]}")
        return Checkpoint(checkpoint_cid=row[0], request=row[1], body=loads(row[2]),
                          expires_at=row[3], created_at=row[4])

    def add_resolution(self, checkpoint_cid: str, *, resolution_cid: str, approver: str,
                       decision: str, body: dict[str, Any], now: float | None = None,
                       approver_jkt: str | None = None) -> tuple[Resolution, bool]:
        if decision not in DECISIONS:
            raise InvalidInput(f"a Resolution's decision is one of {', '.join(DECISIONS)}")
        at = self._now(now)
        with self.transaction() as tx:
            owner = tx.one("SELECT r.id, r.state FROM checkpoints c JOIN requests r "
                           "ON r.id = c.request WHERE c.checkpoint_cid = ?", (checkpoint_cid,))
            if owner is None:
                raise NotFound(f"no Checkpoint {str(checkpoint_cid)[:80]}")
            existing = tx.one(f"SELECT {_RESOLUTION_COLUMNS} FROM resolutions "
                              "WHERE checkpoint_cid = ? AND approver = ?",
                              (checkpoint_cid, approver))
            if existing is not None:
                return _resolution(existing), False
            if owner[1] != S.AWAITING_APPROVAL.value:
                raise Conflict(f"request {owner[0]} is {owner[1]}, no longer awaiting approval",
                               detail={"request": owner[0], "state": owner[1]})
            # The unique (checkpoint, approver) pair is what makes one approver count once.
            # So is the unique (checkpoint, approver key) pair for one key under two names.
            added = tx.execute(
                f"INSERT INTO resolutions ({_RESOLUTION_COLUMNS}, approver_jkt) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING resolution_cid",
                (resolution_cid, checkpoint_cid, approver, decision, canonical_json(body), at,
                 approver_jkt))
            if not added:
                raced = tx.one(f"SELECT {_RESOLUTION_COLUMNS} FROM resolutions "
                               "WHERE checkpoint_cid = ? AND approver = ?",
                               (checkpoint_cid, approver))
                same_key = None if raced is not None or approver_jkt is None else tx.one(
                    "SELECT approver FROM resolutions WHERE checkpoint_cid = ? "
                    "AND approver_jkt = ?", (checkpoint_cid, approver_jkt))
                if same_key is not None:
                    raise Conflict(
                        f"{same_key[0]} already resolved checkpoint {checkpoint_cid[:80]} with "
                        "the key this approver holds: one key counts once, under any name",
                        detail={"checkpoint_cid": checkpoint_cid, "holder": same_key[0],
                                "key_thumbprint": approver_jkt, "reason": "key_counted"})
                if raced is None:
                    raise Conflict(f"Resolution {resolution_cid[:80]} is already stored")
                return _resolution(raced), False
            self._append_tx(tx, f"resolution.{decision}", approver, owner[0], {
                "checkpoint_cid": checkpoint_cid, "resolution_cid": resolution_cid,
                "approver": approver, "decision": decision}, at)
        return Resolution(resolution_cid, checkpoint_cid, approver, decision,
                          loads(canonical_json(body)), at), True

    def resolutions(self, checkpoint_cid: str) -> list[Resolution]:
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_RESOLUTION_COLUMNS} FROM resolutions "
                              "WHERE checkpoint_cid = ? ORDER BY at, resolution_cid",
                              (checkpoint_cid,))
        return [_resolution(row) for row in rows]

    # -- ADR-038 ----------------------------------------------------------------------------

    def expire_prepared(self, id: str, expected_version: int, *, evidence: dict[str, Any],
                        now: float, skew_seconds: float, marque_exp: float, reason: str,
                        actor: str) -> StoredRequest:
        """``prepared → expired`` when the marque provably never ran and never can.

        Refuses (``ExpiryRefused``, or ``StaleVersion`` for a wrong version) and
        changes nothing unless: the request is ``prepared`` at
        ``expected_version``; ``now`` is past the marque's ``exp`` plus
        ``skew_seconds``; no execution report is recorded for its marque; and
        ``evidence`` — the Pilot's ``GET /v1/marques/{id}`` body, fetched by the
        caller — is for this marque and Pilot, from a reachable target, and
        shows no claim (no nonce, no budget row) and no stamp.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("expiring a prepared request needs a reason")
        at = float(now)
        with self.transaction() as tx:
            current = self._get_tx(tx, id)
            if current.version != expected_version:
                raise _stale(current, expected_version)
            if current.state is not S.PREPARED:
                raise _refused(current, "not_prepared",
                               f"request {current.id} is {current.state}, not prepared")
            if at < float(marque_exp) + float(skew_seconds):
                raise _refused(current, "marque_unexpired",
                               f"the marque of request {current.id} may still be used: it "
                               f"expires at {marque_exp}, plus {skew_seconds} s of clock skew")
            if current.marque_id is None:
                raise _refused(current, "evidence_incomplete",
                               f"request {current.id} records no marque to ask a Pilot about")
            if tx.one("SELECT 1 FROM reports WHERE marque_id = ?", (current.marque_id,)):
                raise _refused(current, "report_recorded",
                               f"a Pilot reported an execution of marque {current.marque_id}")
            _check_evidence(current, evidence)
            journal: Journal = []
            moved = self._move_tx(tx, current, expected_version, S.EXPIRED, journal, actor=actor,
                                  now=at, reason=reason, kind="request.expired",
                                  updates={"failure": {"code": RequestExpired.code,
                                                       "message": reason}}, body={
                                     "marque_id": current.marque_id, "marque_exp": marque_exp,
                                     "skew_seconds": skew_seconds,
                                     "evidence": {"pilot": evidence.get("pilot"),
                                                  "claims": [], "stamps": [],
                                                  "target_reachable": True}})
            self._flush_tx(tx, journal, at)
            return moved

    # -- reports -------------------------------------------------------------------------

    def record_report(self, marque_id: str, nonce: str, attempt: int, status: str,
                      body: dict[str, Any], *, now: float | None = None) -> bool:
        at = self._now(now)
        with self.transaction() as tx:
            owner = tx.one("SELECT id FROM requests WHERE marque_id = ?", (marque_id,))
            request = None if owner is None else owner[0]
            added = tx.execute(
                "INSERT INTO reports (marque_id, nonce, attempt, status, body, request, "
                "received_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING "
                "RETURNING marque_id",
                (marque_id, nonce, int(attempt), status, canonical_json(body), request, at))
            if not added:
                return False
            self._append_tx(tx, f"execution.{status}", "pilot", request or marque_id, {
                "marque_id": marque_id, "nonce": nonce, "attempt": int(attempt),
                "status": status, "request": request}, at)
        return True

    def ingest_report(self, report: dict[str, Any], *, actor: str,
                      now: float | None = None) -> tuple[bool, StoredRequest | None]:
        at = self._now(now)
        marque_id, nonce = str(report["marque_id"]), str(report["nonce"])
        attempt, status = int(report["attempt"]), str(report["status"])
        with self.transaction() as tx:
            row = tx.one(f"SELECT {_COLUMNS} FROM requests WHERE marque_id = ?", (marque_id,))
            if row is None:
                # Not a marque this Harbourmaster issued: nothing of it is its to keep.
                return False, None
            request = _request(row)
            pilot = report.get("pilot")
            if not isinstance(pilot, dict) or pilot.get("id") != request.pilot_id:
                raise Forbidden(f"marque {marque_id[:64]} was issued to Pilot "
                                f"{request.pilot_id}: no other Pilot may report it",
                                detail={"marque_id": marque_id[:128]})
            added = tx.execute(
                "INSERT INTO reports (marque_id, nonce, attempt, status, body, request, "
                "received_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING "
                "RETURNING marque_id", (marque_id, nonce, attempt, status, canonical_json(report),
                                        request.id, at))
            if not added:
                self._effect_set_later_tx(tx, report)
                return False, request
            journal: Journal = [(f"execution.{status}", actor, request.id, {
                                     "marque_id": marque_id, "nonce": nonce, "attempt": attempt,
                                     "status": status,
                                     "rows_affected": report.get("rows_affected"),
                                     "error": report.get("error"),
                                     "pilot": report.get("pilot"), "cause": report.get("cause"),
                                     "request": request.id,
                                     # What the Pilot signed, so the entry alone proves it.
                                     **({"effect_set": report["effect_set"]}
                                        if "signature" in report
                                        and report.get("effect_set") is not None else {}),
                                     **({"signature": report["signature"]}
                                        if "signature" in report else {})})]
            if self._report_moves_tx(tx, request, report):
                attempts = latest_attempts(
                    loads(r[0]) for r in tx.execute(
                        "SELECT body FROM reports WHERE marque_id = ? "
                        "ORDER BY received_at, nonce, attempt", (marque_id,)))
                to = next_state(request.state, attempts, request.budget,
                                request.marque_expires_at, at)
                if to is not None:
                    request = self._move_tx(
                        tx, request, request.version, to, journal, actor=actor, now=at,
                        reason=f"execution report: nonce {nonce[:64]} attempt {attempt} "
                               f"{status}",
                        body={"marque_id": marque_id, "executions": attempts},
                        updates=_failure_of(to, attempts))
            self._flush_tx(tx, journal, at)
        return True, request

    @staticmethod
    def _effect_set_later_tx(tx: Tx, report: dict[str, Any]) -> None:
        """A report of a status already received, now carrying the attempt's Effect Set
        summary the first one lacked (a recovered attempt that stays indeterminate: its
        sealed receipt is attached afterwards, docs/effects.md choice 43), completes the
        stored report once. Nothing moves and nothing is journalled: the status is the same."""
        if not isinstance(report.get("effect_set"), dict):
            return
        key = (str(report["marque_id"]), str(report["nonce"]), int(report["attempt"]),
               str(report["status"]))
        held = tx.one("SELECT body FROM reports WHERE marque_id = ? AND nonce = ? "
                      "AND attempt = ? AND status = ?", key)
        if held is None or isinstance(loads(held[0]).get("effect_set"), dict):
            return
        tx.execute("UPDATE reports SET body = ? WHERE marque_id = ? AND nonce = ? "
                   "AND attempt = ? AND status = ?", (canonical_json(report), *key))

    def _report_moves_tx(self, tx: Tx, request: StoredRequest, report: dict[str, Any]) -> bool:
        """Whether a report may move its request: only from the request's own Pilot, and
        in ``reconciliation`` only from its current ledger, because after an incarnation
        change only stamps settle it."""
        pilot = report.get("pilot")
        if not isinstance(pilot, dict) or pilot.get("id") != request.pilot_id:
            return False
        if request.state is not S.RECONCILIATION:
            return True
        row = tx.one("SELECT incarnation FROM pilots WHERE pilot_id = ?", (request.pilot_id,))
        return (row is not None and isinstance(pilot, dict)
                and pilot.get("incarnation") == row[0]
                and pilot.get("id") == request.pilot_id)

    def marque_pilots(self, marque_ids: list[str]) -> dict[str, str]:
        wanted = sorted(set(marque_ids))
        found: dict[str, str] = {}
        if not wanted:
            return found
        with self.reading() as tx:
            for chunk in _chunks(wanted):
                marks = ", ".join("?" for _ in chunk)
                for marque_id, pilot_id in tx.execute(
                        f"SELECT marque_id, pilot_id FROM requests WHERE marque_id IN ({marks})",
                        chunk):
                    found[marque_id] = pilot_id
        return found

    def reports(self, marque_id: str) -> list[Report]:
        with self.reading() as tx:
            rows = tx.execute("SELECT marque_id, nonce, attempt, status, body, request, "
                              "received_at FROM reports WHERE marque_id = ? "
                              "ORDER BY received_at, nonce, attempt", (marque_id,))
        return [Report(r[0], r[1], int(r[2]), r[3], loads(r[4]), r[5], r[6]) for r in rows]

    def request_parts(self, requests: Sequence[StoredRequest]) -> RequestParts:
        cids = sorted({r.checkpoint_cid for r in requests if r.checkpoint_cid is not None})
        marques = sorted({r.marque_id for r in requests if r.marque_id is not None})
        rolled_back = sorted({r.rolls_back for r in requests if r.rolls_back is not None})
        checkpoints: dict[str, Checkpoint] = {}
        resolutions: dict[str, list[Resolution]] = {}
        reports: dict[str, list[Report]] = {}
        originals: dict[str, StoredRequest] = {}
        if not cids and not marques and not rolled_back:
            return RequestParts(checkpoints, resolutions, reports, originals)
        with self.reading() as tx:
            self._requests_in_tx(tx, rolled_back, originals)
            for chunk in _chunks(cids):
                marks = ", ".join("?" for _ in chunk)
                for row in tx.execute("SELECT checkpoint_cid, request, body, expires_at, "
                                      f"created_at FROM checkpoints WHERE checkpoint_cid IN "
                                      f"({marks})", chunk):
                    checkpoints[row[0]] = Checkpoint(checkpoint_cid=row[0], request=row[1],
                                                     body=loads(row[2]), expires_at=row[3],
                                                     created_at=row[4])
                for row in tx.execute(f"SELECT {_RESOLUTION_COLUMNS} FROM resolutions WHERE "
                                      f"checkpoint_cid IN ({marks}) "
                                      "ORDER BY at, resolution_cid", chunk):
                    resolutions.setdefault(row[1], []).append(_resolution(row))
            for chunk in _chunks(marques):
                marks = ", ".join("?" for _ in chunk)
                for r in tx.execute("SELECT marque_id, nonce, attempt, status, body, request, "
                                    f"received_at FROM reports WHERE marque_id IN ({marks}) "
                                    "ORDER BY received_at, nonce, attempt", chunk):
                    reports.setdefault(r[0], []).append(
                        Report(r[0], r[1], int(r[2]), r[3], loads(r[4]), r[5], r[6]))
        return RequestParts(checkpoints, resolutions, reports, originals)

    # -- a Pilot's ledger changed incarnation -------------------------------------------------

    def _incarnation_changed_tx(self, tx: Tx, pilot_id: str, previous: str, incarnation: str,
                                journal: Journal, *, actor: str, now: float) -> None:
        rows = tx.execute(f"SELECT {_COLUMNS} FROM requests WHERE pilot_id = ? AND state IN "
                          "('prepared', 'executing', 'reconciliation') ORDER BY created_at, id",
                          (pilot_id,))
        affected = [_request(row) for row in rows]
        journal.append(("finding.ledger_incarnation_changed", actor, pilot_id, {
            "pilot_id": pilot_id, "previous_incarnation": previous, "incarnation": incarnation,
            "requests": [r.id for r in affected]}))
        for request in affected:
            if request.state in _PINNED:
                self._move_tx(tx, request, request.version, S.RECONCILIATION, journal,
                              actor=actor, now=now, reason="the Pilot's ledger changed incarnation",
                              body={"cause": "ledger_incarnation_changed",
                                    "previous_incarnation": previous})


def _failure_of(to: RequestState, attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``failure`` a report-driven move records (only a move to ``failed`` has one)."""
    if to is not S.FAILED:
        return {}
    errors = [row["error"] for row in attempts if isinstance(row.get("error"), dict)]
    stale = [e for e in errors if e.get("code") == STALE_PREVIEW]
    if stale:
        return {"failure": {"code": STALE_PREVIEW, "message": STALE_PREVIEW_NEXT_STEP}}
    last = errors[-1] if errors else {}
    return {"failure": {
        "code": last.get("code") or "aborted_not_applied",
        "message": "every execution was provably not applied and the marque cannot run "
                   "again" + (f"; last error: {last.get('message')}" if last.get("message")
                              else "")}}


def _state(value: RequestState | str) -> RequestState:
    try:
        return RequestState(value)
    except ValueError:
        raise InvalidInput(f"unknown request state {str(value)[:40]!r}") from None


def _stale(current: StoredRequest, expected_version: int) -> StaleVersion:
    return StaleVersion(
        f"request {current.id} is at version {current.version} ({current.state}), not "
        f"{expected_version}: it moved meanwhile; read it again",
        detail={"id": current.id, "version": current.version,
                "expected_version": expected_version})


def _refused(current: StoredRequest, reason: str, message: str) -> ExpiryRefused:
    return ExpiryRefused(message + "; the request stays as it is",
                         detail={"id": current.id, "reason": reason})


def _check_evidence(current: StoredRequest, evidence: Any) -> None:
    """Refuse unless ``evidence`` proves the marque was never claimed nor stamped."""
    if not isinstance(evidence, dict):
        raise _refused(current, "evidence_incomplete", "no evidence from the Pilot was given")
    pilot = evidence.get("pilot")
    if evidence.get("marque_id") != current.marque_id or not isinstance(pilot, dict) \
            or pilot.get("id") != current.pilot_id:
        raise _refused(current, "evidence_incomplete",
                       f"the evidence is not the Pilot {current.pilot_id}'s for marque "
                       f"{current.marque_id}")
    claims, stamps = evidence.get("claims"), evidence.get("stamps")
    if not isinstance(claims, list) or not isinstance(stamps, list):
        raise _refused(current, "evidence_incomplete",
                       "the evidence does not list the marque's claims and stamps")
    if claims or evidence.get("budget") is not None:
        raise _refused(current, "claim_seen",
                       f"the Pilot's ledger holds a claim under marque {current.marque_id}")
    if stamps:
        raise _refused(current, "stamp_seen",
                       f"the target holds a stamp of marque {current.marque_id}: it ran")
    if evidence.get("target_reachable") is not True:
        raise _refused(current, "evidence_incomplete",
                       "the Pilot could not ask its target for stamps: no stamp proves nothing")
