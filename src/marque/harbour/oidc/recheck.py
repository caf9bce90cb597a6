"""Checking a console sign-in again at the provider (docs/console.md, "Checked again").

A session opened through the provider holds what the provider said at sign-in. So that
a user the provider disables, or whose groups no longer grant a role, does not keep a
working day's session, each one is checked again at most ``oidc.recheck_seconds`` after
its last check, at its next page: the provider's refresh token (kept with the session,
and useless without the client secret, which the store does not hold) is redeemed for a
fresh ID token, verified as at sign-in, and the claims are mapped to a principal and
roles again. The session goes on only if it is the same principal and the roles it holds
are all still granted; roles granted since are not added (they come with the next
sign-in). Otherwise it ends, with a reason the login page explains:

* ``provider_refused``    — the provider would not renew the sign-in (the user or the
  grant was revoked there, its session ended), or answered a token that does not verify;
* ``provider_unreachable`` — the provider could not be reached: an unconfirmed sign-in is
  not carried past its interval, so it ends (sign in again once the provider is back);
* ``no_refresh_token``    — the provider gave this sign-in no refresh token to check it by;
* ``groups_changed``      — the claims no longer grant every role the session holds, or
  name no principal that may sign in;
* ``oidc_cleared``        — the identity provider is no longer configured;
* ``check_failed``        — anything else kept the check from confirming the sign-in
  (the client secret file unreadable, a discovery document for another issuer).

Of several ``harbour serve`` processes seeing a check due, one claims it in the store
(:meth:`~marque.harbour.store.base.HarbourStore.claim_oidc_check`); the others go on
while it is under way (at most the provider call's timeout). Blocking: call from a
worker thread.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from marque.errors import (
    MarqueError,
    OidcLoginRefused,
    OidcProviderUnavailable,
    OidcSubjectUnknown,
    Unauthenticated,
)
from marque.harbour.oidc.config import OidcConfig, read_secret
from marque.harbour.oidc.signin import SignIn
from marque.harbour.oidc.tokens import verify_id_token
from marque.harbour.store.base import ConsoleSession

log = logging.getLogger(__name__)

_SAID = {
    "provider_refused": "the identity provider would not renew this sign-in",
    "provider_unreachable": "the identity provider could not be reached to check this "
                            "sign-in again",
    "no_refresh_token": "the identity provider gave this sign-in no refresh token to check "
                        "it again by",
    "groups_changed": "the identity provider no longer grants every role this sign-in holds",
    "oidc_cleared": "the identity provider is no longer configured",
    "check_failed": "this sign-in could not be checked again",
}


class _Ended(Exception):
    def __init__(self, reason: str, why: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.why = why


class Rechecks:
    """The checks of one Harbourmaster's console sessions opened through the provider."""

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin
        self.store = signin.store

    def check(self, session: ConsoleSession, now: float) -> None:
        """Check ``session`` at the provider if it is due; end it and raise
        ``Unauthenticated`` (``detail["reason"]`` as above) if it must not go on."""
        try:
            config = self.signin.config()
        except MarqueError:
            config = None  # settings that cannot be read confirm nothing
        due_before = now - (config.recheck_seconds if config is not None else 0)
        if session.oidc_checked_at is not None and session.oidc_checked_at > due_before:
            return  # read with the session: not due, so no claim (no second query)
        claim = self.store.claim_oidc_check(session.session_hash, due_before=due_before,
                                            now=now)
        if claim is None:
            return
        try:
            if config is None:
                raise _Ended("oidc_cleared")
            if claim.refresh_token is None:
                raise _Ended("no_refresh_token")
            kept = self._renew(config, session, claim.refresh_token, now)
        except _Ended as end:
            self._end(session, now, end)
        except MarqueError as exc:  # e.g. the secret file unreadable: nothing was confirmed
            self._end(session, now, _Ended("check_failed", f"{exc.code}: {exc.message}"))
        except Exception:
            # The check was claimed and did not confirm the sign-in: the session does not
            # go on until the next interval on the strength of a failure.
            self.store.revoke_session(session.session_hash, now=now)
            raise
        self.store.note_oidc_check(session.session_hash, refresh_token=kept, checked_at=now)

    def _end(self, session: ConsoleSession, now: float, end: _Ended) -> NoReturn:
        self.store.revoke_session(session.session_hash, now=now)
        log.info("console session of %s ended at its check with the identity provider: "
                 "%s %s", session.principal, end.reason, end.why)
        raise Unauthenticated(f"{_SAID[end.reason]}: sign in again",
                              detail={"reason": end.reason})

    def _renew(self, config: OidcConfig, session: ConsoleSession, refresh_token: str,
               now: float) -> str:
        """The refresh grant, and the claims it answers checked; the refresh token to keep."""
        provider = self.signin.providers.get(config.issuer)
        try:
            answer = provider.post_token({"grant_type": "refresh_token",
                                          "refresh_token": refresh_token},
                                         (config.client_id, read_secret(config.client_secret_file)))
        except OidcProviderUnavailable as exc:
            raise _Ended("provider_unreachable", exc.message) from None
        if "error" in answer:
            raise _Ended("provider_refused", str(answer.get("error"))[:80])
        try:
            claims = self._claims(config, answer, now)
        except OidcProviderUnavailable as exc:
            raise _Ended("provider_unreachable", exc.message) from None
        except OidcLoginRefused as exc:
            raise _Ended("provider_refused", exc.message) from None
        if claims.get("sub") != session.oidc_subject:
            raise _Ended("provider_refused", "the renewed sign-in is for another subject")
        try:
            identity = self.signin.identify(config, claims)
        except OidcSubjectUnknown as exc:
            raise _Ended("groups_changed", exc.message) from None
        if identity.principal.name != session.principal \
                or not set(session.roles or ()) <= set(identity.roles):
            raise _Ended("groups_changed", f"now {','.join(identity.roles)}")
        renewed = answer.get("refresh_token")
        return renewed if isinstance(renewed, str) and renewed else refresh_token

    def _claims(self, config: OidcConfig, answer: dict[str, Any], now: float) -> dict[str, Any]:
        """The renewed sign-in's claims: its ID token's, verified (there is no nonce on a
        refresh), completed from UserInfo; UserInfo's alone when no ID token is answered."""
        provider = self.signin.providers.get(config.issuer)
        access = answer.get("access_token")
        token = answer.get("id_token")
        if isinstance(token, str):
            claims = verify_id_token(token, provider, client_id=config.client_id, now=now,
                                     nonce=None)
            return self.signin.with_userinfo(config, provider, claims, access)
        info = provider.fetch_userinfo(access) if isinstance(access, str) else None
        if info is None:
            raise OidcLoginRefused("the provider renewed the sign-in without an ID token or "
                                   "a UserInfo endpoint to say who it is")
        return info
