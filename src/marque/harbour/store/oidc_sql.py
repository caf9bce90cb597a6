"""Signing in through an identity provider, in the Harbourmaster's store, for both engines.

What must hold across every ``harbour serve`` sharing a store lives here as constraints
and compare-and-sets, never in one process's memory:

* the settings are one row (``id = 1``), replaced whole and logged;
* a sign-in's ``state`` is a row keyed by its SHA-256, used by one ``UPDATE … WHERE
  used_at IS NULL RETURNING``: a replayed callback, through this process or another,
  finds it used and is refused;
* an ID token the command line exchanged is a row keyed by its SHA-256, inserted with
  ``ON CONFLICT DO NOTHING``: the second exchange of one token inserts nothing. The row
  names the session the token opened; a refresh at the provider within the same second
  can answer that very token, and it is accepted again only as the renewal of that
  session — one ``UPDATE … WHERE session_hash = <the renewed session>`` that moves it to
  the new session while the renewed one is live, ending the renewed one in the same
  transaction. So each exchanged token opens one live session at a time, and a login
  (which renews nothing) with a token seen before is refused, as always.

* a session's check at the provider is claimed by one ``UPDATE … WHERE checked_at <= ?``:
  of several processes seeing it due, one makes the call (a refresh token may be used
  once) and the others go on, the check being under way.

Turning ``require`` on ends the console sessions opened with a principal's token in the
same transaction that stores it, so break-glass sessions do not outlive the switch.
"""

from __future__ import annotations

from typing import Any

from marque.errors import InvalidInput, OidcLoginRefused
from marque.harbour.principals import hashes_equal
from marque.harbour.store.base import OidcCheck, OidcLogin
from marque.harbour.store.columns import canonical_json, loads
from marque.harbour.store.hooks import StoreHooks
from marque.harbour.store.session_sql import end_live_cli_session_txn

_HEX = frozenset("0123456789abcdef")


def _check_hash(value: str, what: str) -> None:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise InvalidInput(f"{what} is stored by its SHA-256 (64 hex digits)")


class OidcRecords(StoreHooks):
    """OIDC operations, over the hooks ``sql.SqlHarbourStore`` provides."""

    def set_oidc_settings(self, body: dict[str, Any], *, actor: str,
                          now: float | None = None) -> int:
        at = self._now(now)
        text = canonical_json(body)
        with self.transaction() as tx:
            tx.execute("INSERT INTO oidc_settings (id, body, updated_at) VALUES (1, ?, ?) "
                       "ON CONFLICT (id) DO UPDATE SET body = excluded.body, "
                       "updated_at = excluded.updated_at", (text, at))
            ended = []
            if body.get("require"):
                ended = tx.execute("UPDATE console_sessions SET revoked_at = ? "
                                   "WHERE revoked_at IS NULL AND (via IS NULL OR via = 'token') "
                                   "RETURNING session_hash", (at,))
            self._append_tx(tx, "oidc.configured", actor, "oidc",
                            {**body, "token_sessions_ended": len(ended)}, at)
        return len(ended)

    def clear_oidc_settings(self, *, actor: str, now: float | None = None) -> bool:
        at = self._now(now)
        with self.transaction() as tx:
            gone = tx.execute("DELETE FROM oidc_settings WHERE id = 1 RETURNING id")
            if gone:
                self._append_tx(tx, "oidc.cleared", actor, "oidc", {}, at)
        return bool(gone)

    def oidc_settings(self) -> dict[str, Any] | None:
        with self.reading() as tx:
            row = tx.one("SELECT body FROM oidc_settings WHERE id = 1")
        found: dict[str, Any] | None = None if row is None else loads(row[0])
        return found

    def begin_oidc_login(self, state_hash: str, login: OidcLogin) -> None:
        _check_hash(state_hash, "a sign-in's state")
        _check_hash(login.browser_hash, "a sign-in's browser binding")
        with self.transaction() as tx:
            # Expired sign-ins go as new ones begin (no sweep needed), so the table holds at
            # most one sign-in's life of them, however many are begun and abandoned.
            tx.execute("DELETE FROM oidc_logins WHERE expires_at < ?", (login.created_at,))
            tx.execute("INSERT INTO oidc_logins (state_hash, browser_hash, nonce, code_verifier, "
                       "next_path, issuer, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (state_hash, login.browser_hash, login.nonce, login.code_verifier,
                        login.next_path, login.issuer, login.created_at, login.expires_at))

    def finish_oidc_login(self, state_hash: str, *, now: float | None = None) -> OidcLogin:
        if not isinstance(state_hash, str) or len(state_hash) != 64:
            raise OidcLoginRefused("this sign-in's state is unknown: start again from the login "
                                   "page", detail={"check": "state_unknown"})
        at = self._now(now)
        with self.transaction() as tx:
            row = tx.one("UPDATE oidc_logins SET used_at = ? WHERE state_hash = ? AND "
                         "used_at IS NULL RETURNING state_hash, browser_hash, nonce, "
                         "code_verifier, next_path, issuer, created_at, expires_at",
                         (at, state_hash))
            used = None if row is not None else tx.one(
                "SELECT used_at FROM oidc_logins WHERE state_hash = ?", (state_hash,))
        if row is None or not hashes_equal(row[0], state_hash):
            check = "state_used" if used is not None else "state_unknown"
            said = "was already used" if used is not None else "is unknown"
            raise OidcLoginRefused(f"this sign-in's state {said}, so it was refused: start "
                                   "again from the login page", detail={"check": check})
        login = OidcLogin(browser_hash=row[1], nonce=row[2], code_verifier=row[3],
                          next_path=row[4], issuer=row[5], created_at=row[6], expires_at=row[7])
        if at >= login.expires_at:
            raise OidcLoginRefused("this sign-in took too long and its state expired: start "
                                   "again from the login page", detail={"check": "state_expired"})
        return login

    def note_exchanged_token(self, token_hash: str, *, expires_at: float,
                             now: float | None = None, session_hash: str | None = None) -> bool:
        _check_hash(token_hash, "an exchanged ID token")
        if session_hash is not None:
            _check_hash(session_hash, "a console session")
        at = self._now(now)
        with self.transaction() as tx:
            tx.execute("DELETE FROM oidc_exchanged WHERE expires_at < ?", (at - 3600,))
            fresh = tx.execute("INSERT INTO oidc_exchanged (token_hash, expires_at, "
                               "session_hash) VALUES (?, ?, ?) ON CONFLICT (token_hash) "
                               "DO NOTHING RETURNING token_hash",
                               (token_hash, float(expires_at), session_hash))
        return bool(fresh)

    def renew_exchanged_token(self, token_hash: str, *, renewing: str, session_hash: str,
                              now: float | None = None) -> float | None:
        _check_hash(token_hash, "an exchanged ID token")
        _check_hash(renewing, "a console session")
        _check_hash(session_hash, "a console session")
        at = self._now(now)
        with self.transaction() as tx:
            # The compare-and-set: the token moves only from the session it opened, and only
            # while that one is a live command line's sign-in. Of two renewals of one
            # session with one token, the second finds the token moved and is refused.
            moved = tx.one("UPDATE oidc_exchanged SET session_hash = ? WHERE token_hash = ? "
                           "AND session_hash = ? AND EXISTS (SELECT 1 FROM console_sessions "
                           "WHERE session_hash = ? AND via = 'cli' AND revoked_at IS NULL "
                           "AND expires_at > ?) RETURNING token_hash",
                           (session_hash, token_hash, renewing, renewing, at))
            if moved is None:
                return None
            return end_live_cli_session_txn(tx, renewing, at)

    def end_oidc_sessions(self, *, subject: str | None = None, sid: str | None = None,
                          now: float | None = None) -> int:
        if subject is None and sid is None:
            raise InvalidInput("a back-channel logout names a subject or a session id")
        at = self._now(now)
        clauses: list[str] = []
        params: list[Any] = [at]
        if sid is not None:
            clauses.append("oidc_sid = ?")
            params.append(sid)
        if subject is not None:
            clauses.append("oidc_subject = ?")
            params.append(subject)
        with self.transaction() as tx:
            ended = tx.execute("UPDATE console_sessions SET revoked_at = ? WHERE revoked_at IS "
                               f"NULL AND via <> 'token' AND {' AND '.join(clauses)} "
                               "RETURNING session_hash", tuple(params))
        return len(ended)

    def note_oidc_check(self, session_hash: str, *, refresh_token: str | None,
                        checked_at: float) -> None:
        _check_hash(session_hash, "a console session")
        with self.transaction() as tx:
            # Checks of ended or purged sessions go (their refresh tokens with them).
            tx.execute("DELETE FROM oidc_session_checks WHERE session_hash NOT IN (SELECT "
                       "session_hash FROM console_sessions WHERE revoked_at IS NULL AND "
                       "expires_at > ?)", (float(checked_at),))
            tx.execute("INSERT INTO oidc_session_checks (session_hash, refresh_token, "
                       "checked_at) VALUES (?, ?, ?) ON CONFLICT (session_hash) DO UPDATE "
                       "SET refresh_token = excluded.refresh_token, "
                       "checked_at = excluded.checked_at",
                       (session_hash, refresh_token, float(checked_at)))

    def take_oidc_refresh_token(self, session_hash: str) -> str | None:
        _check_hash(session_hash, "a console session")
        with self.transaction() as tx:
            # Taken, not read: of two logouts of one session, one revokes the token.
            row = tx.one("DELETE FROM oidc_session_checks WHERE session_hash = ? "
                         "RETURNING refresh_token", (session_hash,))
        return None if row is None or row[0] is None else str(row[0])

    def claim_oidc_check(self, session_hash: str, *, due_before: float,
                         now: float | None = None) -> OidcCheck | None:
        _check_hash(session_hash, "a console session")
        at = self._now(now)
        with self.reading() as tx:  # most pages find their check not due: no write then
            last = tx.one("SELECT checked_at FROM oidc_session_checks WHERE session_hash = ?",
                          (session_hash,))
        if last is not None and float(last[0]) > due_before:
            return None
        with self.transaction() as tx:
            row = tx.one("UPDATE oidc_session_checks SET checked_at = ? WHERE session_hash = ? "
                         "AND checked_at <= ? RETURNING refresh_token",
                         (at, session_hash, float(due_before)))
            known = row is not None or tx.one(
                "SELECT 1 FROM oidc_session_checks WHERE session_hash = ?",
                (session_hash,)) is not None
        if row is not None:
            return OidcCheck(refresh_token=row[0])
        return None if known else OidcCheck(refresh_token=None)
