"""The web console's sessions in the Harbourmaster's store (DESIGN §12), for both engines.

A session lives in the store, not in a process, so that every ``harbour
serve`` sharing one PostgreSQL store honours a login made through any of
them, and a logout made through one ends it everywhere. The browser holds a
random session id; the store keeps only its SHA-256 (``session_hash``), so
whoever reads the store cannot open a session.

Whether a session still works is decided by one ``SELECT`` joining the
session to its principal (and to its last check at the identity provider, if
any): unknown, expired, logged out, or belonging to a principal revoked since
are each ``Unauthenticated`` with a ``reason``, so revoking a principal ends
its console sessions at once, with no sweep. A session points at its
principal's row (``principal_id``), not its name: a revoked name added again
is a new principal, and the old one's sessions stay dead; rotating a token
ends the principal's sessions in the same transaction. A command line's renewal ends
the sign-in it replaces in the transaction that opens the new one, and its logout ends
it, each by one conditional ``UPDATE`` (only a live ``cli`` session; for a renewal, only
one of the same principal).
Nothing here writes the logbook: a session changes no request, no Pilot and
no principal.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from marque.errors import InvalidInput, Unauthenticated
from marque.harbour.principals import Principal, hashes_equal, parse_roles
from marque.harbour.store.base import ConsoleSession
from marque.harbour.store.columns import canonical_json, loads
from marque.harbour.store.hooks import StoreHooks
from marque.storage.tx import Tx

_SESSION_COLUMNS = "s.session_hash, s.principal, s.csrf_secret, s.created_at, s.expires_at, " \
                   "s.revoked_at, s.via, s.roles, s.roles_from, s.oidc_subject, s.oidc_sid, " \
                   "c.checked_at"
_SESSION_WIDTH = 12
_VIA = frozenset({"token", "oidc", "cli"})
_HEX64 = frozenset("0123456789abcdef")


def _session(row: tuple[Any, ...]) -> ConsoleSession:
    roles = loads(row[7])
    return ConsoleSession(session_hash=row[0], principal=row[1], csrf_secret=row[2],
                          created_at=row[3], expires_at=row[4], revoked_at=row[5],
                          via=row[6] or "token", roles=None if roles is None else tuple(roles),
                          roles_from=row[8], oidc_subject=row[9], oidc_sid=row[10],
                          oidc_checked_at=None if row[11] is None else float(row[11]))


def _check_hash(session_hash: str) -> None:
    if not isinstance(session_hash, str) or len(session_hash) != 64 \
            or not set(session_hash) <= _HEX64:
        raise InvalidInput("a session is stored by the SHA-256 of its id (64 hex digits)")


def end_live_cli_session_txn(tx: Tx, session_hash: str, at: float, *,
                             principal_id: Any = None) -> float | None:
    """End a live command-line sign-in inside ``tx``, by one compare-and-set: its expiry,
    or None when there was none to end (unknown, ended, expired, not a command line's, or,
    with ``principal_id``, another principal's). A logout, a renewal and a same-token
    renewal all end a sign-in through this one statement."""
    sql = ("UPDATE console_sessions SET revoked_at = ? WHERE session_hash = ? AND via = 'cli' "
           "AND revoked_at IS NULL AND expires_at > ?")
    params: tuple[Any, ...] = (at, session_hash, at)
    if principal_id is not None:
        sql, params = sql + " AND principal_id = ?", (*params, principal_id)
    row = tx.one(sql + " RETURNING expires_at", params)
    return None if row is None else float(row[0])


def _granted(session: ConsoleSession, principal: Principal) -> Principal:
    """The principal as this session may act: a token session's roles are the principal's
    own, live; a sign-in through the provider holds the roles granted at sign-in — from
    the groups claim, or from the principal, and then it ends once the principal no
    longer holds one of them (an admin's revocation takes effect at the next request)."""
    if session.roles is None:
        return principal
    granted = parse_roles(session.roles)
    if session.roles_from == "groups":
        return replace(principal, roles=granted)
    if not granted <= principal.roles:
        raise Unauthenticated(f"principal {principal.name} no longer holds a role this sign-in "
                              "was granted: sign in again", detail={"reason": "role_revoked"})
    return principal


class SessionRecords(StoreHooks):
    """Console session operations, over the hooks ``sql.SqlHarbourStore`` provides."""

    def create_session(self, session_hash: str, principal: str, *, csrf_secret: str,
                       expires_at: float, now: float | None = None, via: str = "token",
                       roles: tuple[str, ...] | None = None, roles_from: str | None = None,
                       oidc_subject: str | None = None, oidc_sid: str | None = None,
                       replaces: str | None = None) -> ConsoleSession:
        _check_hash(session_hash)
        if replaces is not None:
            _check_hash(replaces)
            if via != "cli":
                raise InvalidInput("only a command line's sign-in replaces the one it renews")
        if via not in _VIA or (via == "token") != (roles is None) \
                or (roles is None) != (roles_from is None):
            raise InvalidInput("a session opened through the identity provider carries its "
                               "granted roles and where they came from; a token session none")
        if roles is not None:
            roles = tuple(sorted(r.value for r in parse_roles(roles)))
        if not isinstance(csrf_secret, str) or len(csrf_secret) < 32:
            raise InvalidInput("a session's CSRF secret must be at least 32 characters")
        at = self._now(now)
        if expires_at <= at:
            raise InvalidInput("a session must expire after it starts")
        with self.transaction() as tx:
            # One statement: the principal must exist and be unrevoked as the row goes in.
            row = tx.one(
                "INSERT INTO console_sessions (session_hash, principal, principal_id, "
                "csrf_secret, created_at, expires_at, via, roles, roles_from, oidc_subject, "
                "oidc_sid) SELECT ?, name, id, ?, ?, ?, ?, ?, ?, ?, ? FROM principals "
                "WHERE name = ? AND revoked_at IS NULL RETURNING session_hash, principal_id",
                (session_hash, csrf_secret, at, float(expires_at), via,
                 None if roles is None else canonical_json(list(roles)), roles_from, oidc_subject,
                 oidc_sid, principal))
            if row is not None and replaces is not None:
                # The compare-and-set of a renewal: the renewed sign-in ends as this one
                # opens, only if it is a live command line's of the same principal (by row:
                # a name revoked and added again is another principal). Anything else the
                # caller named is left as it is, and this session opens all the same.
                end_live_cli_session_txn(tx, replaces, at, principal_id=row[1])
        if row is None:
            raise Unauthenticated(f"no unrevoked principal named {str(principal)[:128]!r} can "
                                  "hold a console session", detail={"reason": "principal"})
        return ConsoleSession(session_hash=session_hash, principal=principal,
                              csrf_secret=csrf_secret, created_at=at,
                              expires_at=float(expires_at), via=via, roles=roles,
                              roles_from=roles_from, oidc_subject=oidc_subject,
                              oidc_sid=oidc_sid)

    def get_session(self, session_hash: str, *,
                    now: float | None = None) -> tuple[ConsoleSession, Principal]:
        if not isinstance(session_hash, str) or len(session_hash) != 64:
            raise Unauthenticated("no such console session", detail={"reason": "unknown"})
        at = self._now(now)
        with self.reading() as tx:
            row = tx.one(
                f"SELECT {_SESSION_COLUMNS}, p.name, p.roles, p.public_jwk, p.revoked_at, "
                "p.created_at, p.id, p.key_thumbprint FROM console_sessions s "
                "JOIN principals p ON p.id = s.principal_id "
                # Its last check at the provider comes in the same read, so a page whose
                # check is not due makes no second query (oidc/recheck.py).
                "LEFT JOIN oidc_session_checks c ON c.session_hash = s.session_hash "
                "WHERE s.session_hash = ?", (session_hash,))
        # The index found the row; the constant-time comparison is what decides.
        if row is None or not hashes_equal(row[0], session_hash):
            raise Unauthenticated("no such console session", detail={"reason": "unknown"})
        session = _session(row[:_SESSION_WIDTH])
        if session.revoked_at is not None:
            raise Unauthenticated("this console session was ended (by logging out, or by "
                                  "a rotation of its principal's token)",
                                  detail={"reason": "revoked"})
        if at >= session.expires_at:
            raise Unauthenticated("this console session has expired",
                                  detail={"reason": "expired"})
        p = row[_SESSION_WIDTH:]
        principal = Principal(name=p[0], roles=parse_roles(loads(p[1])), public_jwk=loads(p[2]),
                              revoked_at=p[3], created_at=p[4], id=p[5], key_thumbprint=p[6])
        if principal.revoked:
            raise Unauthenticated(f"principal {principal.name} was revoked: its console "
                                  "sessions no longer work",
                                  detail={"reason": "principal_revoked"})
        return session, _granted(session, principal)

    def revoke_session(self, session_hash: str, *, now: float | None = None) -> bool:
        at = self._now(now)
        with self.transaction() as tx:
            ended = tx.execute("UPDATE console_sessions SET revoked_at = ? "
                               "WHERE session_hash = ? AND revoked_at IS NULL "
                               "RETURNING session_hash", (at, session_hash))
        return bool(ended)

    def end_cli_session(self, session_hash: str, *, now: float | None = None) -> bool:
        if not isinstance(session_hash, str) or len(session_hash) != 64:
            return False  # no such session: nothing to end
        at = self._now(now)
        with self.transaction() as tx:
            # Only a command line's own sign-in, and only while live: a console session's
            # id sent as a bearer token ends nothing, and a second logout finds none.
            ended = end_live_cli_session_txn(tx, session_hash, at)
        return ended is not None

    def purge_sessions(self, *, before: float) -> int:
        with self.transaction() as tx:
            gone = tx.execute("DELETE FROM console_sessions WHERE expires_at < ? "
                              "RETURNING session_hash", (float(before),))
        return len(gone)
