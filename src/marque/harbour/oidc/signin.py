"""Signing in through the identity provider: the authorization code flow with PKCE, and the
command line's ID-token exchange (docs/console.md, "Signing in with OIDC").

**The console** (:meth:`SignIn.begin`, :meth:`SignIn.finish`). ``begin`` draws a
``state``, a ``nonce`` and a PKCE verifier (256 bits each), stores them by the state's
SHA-256 bound to the SHA-256 of a secret the browser holds in a cookie, and answers the
provider's authorization URL (``S256`` challenge). ``finish`` uses the state once (a
replay through any ``harbour serve`` finds it used), checks the browser is the one that
began, redeems the code at the token endpoint with the client secret and the verifier,
and verifies the ID token (:mod:`.tokens`) against the nonce it stored.

**The command line** (:meth:`SignIn.exchange`). ``marque login --oidc`` obtains an ID
token from the provider itself (the device authorization grant, for its own public client
``cli_client_id``) and posts it here. It is accepted only if its audience is that client —
an ID token issued to any other application is refused — if it was issued in the last
:data:`EXCHANGE_FRESH_SECONDS`, and only once (its SHA-256 is recorded in the store, with
the session it opened). The one exception is a renewal: a refresh grant in the same
second as the sign-in it renews can answer the very same ID token, which is accepted
when the renewal comes with that sign-in's own (live) token, and then ends that sign-in
and lasts no longer than it would have: a copy of an ID token alone is still worth
nothing after its first use. Any renewal (a new ID token too) ends the sign-in its
``renews`` names as the new one opens, if that is a live command line's sign-in of the
same principal (the store's compare-and-set, ``create_session(replaces=…)``); naming
anything else ends nothing, and the renewal is a fresh sign-in.

**Who it is** (:meth:`SignIn.identify`). The configured claim (``sub`` by default, or e.g.
``email``, which must then be ``email_verified``) is the name of a principal, which must
exist and be unrevoked: nobody is created by signing in. Its roles are the principal's
(never ``pilot``), or — with a groups claim configured — those its groups map to; no role
is no session.

**Checked again** (:mod:`.recheck`): a console session keeps the provider's refresh token
and is checked again every ``recheck_seconds``; a command line's token lasts no longer
than that interval, so its renewal (a new ID token, exchanged) is the check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from marque.errors import (
    InvalidInput,
    NotFound,
    OidcConfigInvalid,
    OidcLoginRefused,
    OidcSubjectUnknown,
)
from marque.harbour.oidc.config import OidcConfig, read_secret
from marque.harbour.oidc.provider import Provider, Providers
from marque.harbour.oidc.tokens import refuse, verify_id_token
from marque.harbour.principals import Principal, Role
from marque.harbour.store.base import HarbourStore, OidcLogin

#: How long a started sign-in may take, from the login page to the callback.
LOGIN_SECONDS = 600
#: How recently an ID token exchanged by the command line must have been issued.
EXCHANGE_FRESH_SECONDS = 600
#: The bearer token a command line's sign-in gets: its prefix, and how long it lasts.
CLI_TOKEN_PREFIX = "mqs_"
CLI_TOKEN_SECONDS = 3600


def sha256_hex(value: str) -> str:
    """The SHA-256 (hex) a secret is stored and looked up as."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Identity:
    """Who signed in: the principal, the roles granted and from where, and the provider's
    subject and session id."""

    principal: Principal
    roles: tuple[str, ...]
    roles_from: str
    subject: str
    sid: str | None
    next_path: str = "/"
    #: The provider's refresh token, kept with a console session for its checks.
    refresh_token: str | None = field(default=None, repr=False)


class SignIn:
    """Sign-ins against one Harbourmaster's store. Blocking: call from a worker thread."""

    def __init__(self, store: HarbourStore, providers: Providers) -> None:
        self.store = store
        self.providers = providers

    def config(self) -> OidcConfig | None:
        """The stored settings, or None when signing in through a provider is not set up."""
        body = self.store.oidc_settings()
        return None if body is None else OidcConfig.from_dict(body)

    def required(self) -> OidcConfig:
        """The stored settings; ``not_found`` when there are none."""
        config = self.config()
        if config is None:
            raise NotFound("this Harbourmaster has no identity provider configured "
                           "(`marque harbour oidc set`)")
        return config

    # -- the console's authorization code flow -------------------------------------

    def begin(self, browser_secret: str, next_path: str, redirect_uri: str,
              now: float) -> str:
        """Store a new sign-in; the provider's authorization URL to send the browser to."""
        config = self.required()
        discovery = self.providers.get(config.issuer).discovery()
        methods = discovery.code_challenge_methods
        if methods is not None and "S256" not in methods:
            raise OidcConfigInvalid("the provider does not offer PKCE with S256, which Marque "
                                    "requires", detail={"setting": "issuer"})
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        self.store.begin_oidc_login(sha256_hex(state), OidcLogin(
            browser_hash=sha256_hex(browser_secret), nonce=nonce, code_verifier=verifier,
            next_path=next_path, issuer=config.issuer, created_at=now,
            expires_at=now + LOGIN_SECONDS))
        query = urlencode({"response_type": "code", "client_id": config.client_id,
                           "redirect_uri": config.redirect_uri or redirect_uri,
                           "scope": " ".join(config.scopes), "state": state, "nonce": nonce,
                           "code_challenge": _challenge(verifier),
                           "code_challenge_method": "S256"})
        separator = "&" if "?" in discovery.authorization_endpoint else "?"
        return f"{discovery.authorization_endpoint}{separator}{query}"

    def finish(self, state: str, code: str | None, error: str | None, browser_secret: str,
               redirect_uri: str, now: float) -> Identity:
        """The callback: use the state once, redeem the code, verify the ID token, and
        say who signed in (``OidcLoginRefused`` / ``OidcSubjectUnknown`` otherwise)."""
        login = self.store.finish_oidc_login(sha256_hex(state or ""), now=now)
        if not hmac.compare_digest(login.browser_hash, sha256_hex(browser_secret)):
            raise OidcLoginRefused("this sign-in was started in another browser, so it was "
                                   "refused: start again from the login page",
                                   detail={"check": "browser"})
        config = self.required()
        if login.issuer != config.issuer:
            raise OidcLoginRefused("the identity provider was changed while this sign-in was "
                                   "under way: start again", detail={"check": "issuer"})
        if error or not code:
            raise OidcLoginRefused(f"the identity provider did not sign you in "
                                   f"({(error or 'no code')[:80]})",
                                   detail={"check": "provider", "error": (error or "")[:80]})
        provider = self.providers.get(config.issuer)
        answer = provider.post_token({
            "grant_type": "authorization_code", "code": code,
            "redirect_uri": config.redirect_uri or redirect_uri,
            "code_verifier": login.code_verifier},
            (config.client_id, read_secret(config.client_secret_file)))
        token = answer.get("id_token")
        if "error" in answer or not isinstance(token, str):
            raise OidcLoginRefused("the identity provider would not redeem the sign-in's code "
                                   f"({str(answer.get('error', 'no ID token'))[:80]})",
                                   detail={"check": "code"})
        claims = verify_id_token(token, provider, client_id=config.client_id, now=now,
                                 nonce=login.nonce)
        claims = self.with_userinfo(config, provider, claims, answer.get("access_token"))
        identity = self.identify(config, claims)
        refresh = answer.get("refresh_token")
        return Identity(identity.principal, identity.roles, identity.roles_from,
                        identity.subject, identity.sid, login.next_path,
                        refresh if isinstance(refresh, str) and refresh else None)

    def revoke_refresh_token(self, session_hash: str) -> None:
        """At logout: the refresh token the session kept for its checks, taken from the
        store and revoked at the provider (RFC 7009), when the provider names a revocation
        endpoint, so the provider's grant ends with the session. Logout has already ended
        the session here; a revocation that fails raises (for the caller to log) and
        changes nothing of that."""
        refresh = self.store.take_oidc_refresh_token(session_hash)
        config = self.config()
        if refresh is None or config is None:
            return
        provider = self.providers.get(config.issuer)
        provider.revoke_refresh_token(refresh, (config.client_id,
                                                read_secret(config.client_secret_file)))

    # -- the command line's exchange ------------------------------------------------

    def with_userinfo(self, config: OidcConfig, provider: Provider, claims: dict[str, Any],
                       access_token: Any) -> dict[str, Any]:
        """The ID token's claims, completed from the UserInfo endpoint when a claim the
        settings use is not in the ID token (a provider may put only ``sub`` there). The
        UserInfo answer must be for the same ``sub``; it never replaces a claim the signed
        ID token carries."""
        wanted = {config.subject_claim, *([config.groups_claim] if config.groups_claim else []),
                  *(["email_verified"] if config.subject_claim == "email" else [])}
        if wanted <= set(claims) or not isinstance(access_token, str):
            return claims
        info = provider.fetch_userinfo(access_token)
        if info is None:  # the provider has no UserInfo endpoint
            return claims
        if info.get("sub") != claims["sub"]:
            raise refuse("subject", "the provider's UserInfo answer is for another subject")
        return {**info, **claims}

    def exchange(self, id_token: str, now: float, access_token: str | None = None, *,
                 opens: str | None = None,
                 renewing: str | None = None) -> tuple[Identity, float, float | None]:
        """A command line's ID token (for ``cli_client_id``), checked and used once: who it
        is, when the token expires, and — for a renewal that got back the very token the
        session ``renewing`` was opened with — when that session would have expired (None
        otherwise). ``opens`` is the SHA-256 of the session this exchange opens."""
        config = self.required()
        if config.cli_client_id is None:
            raise NotFound("this Harbourmaster does not let the command line sign in through "
                           "its identity provider (`harbour oidc set --cli-client-id`)")
        provider = self.providers.get(config.issuer)
        claims = verify_id_token(id_token, provider, client_id=config.cli_client_id, now=now,
                                 nonce=None)
        if float(claims["iat"]) < now - EXCHANGE_FRESH_SECONDS:
            raise refuse("issued_at", "it was issued too long ago to be exchanged: sign in again")
        token_hash = sha256_hex(id_token)
        until: float | None = None
        if not self.store.note_exchanged_token(token_hash, expires_at=float(claims["exp"]),
                                               now=now, session_hash=opens):
            # Seen before. A refresh in the second the token was issued answers the same
            # token (its claims are whole seconds, its signature deterministic): accepted
            # only as the renewal of the live session it opened, which it replaces.
            if renewing is not None and opens is not None:
                until = self.store.renew_exchanged_token(token_hash, renewing=renewing,
                                                         session_hash=opens, now=now)
            if until is None:
                raise refuse("replayed", "it was exchanged before")
        claims = self.with_userinfo(config, provider, claims, access_token)
        return self.identify(config, claims), float(claims["exp"]), until

    def sign_out(self, bearer: str, now: float) -> bool:
        """End the command line's sign-in whose bearer token is ``bearer`` (``marque
        logout``): True when this ended it, False when there was none to end (ended
        already, expired, or never issued: the token authenticates nobody either way, so
        a retried logout is answered alike). A principal's token is no sign-in: an
        unknown one is ``Unauthenticated``, a valid one ``InvalidInput`` (only an admin's
        rotation or revocation ends it)."""
        if not bearer.startswith(CLI_TOKEN_PREFIX):
            principal = self.store.authenticate(bearer)
            raise InvalidInput(f"this is principal {principal.name}'s own token, not a "
                               "sign-in through the identity provider: logging out does not "
                               "end it (an admin rotates or revokes it: `marque harbour "
                               "principal rotate`)", detail={"token": "principal"})
        return self.store.end_cli_session(sha256_hex(bearer), now=now)

    # -- who it is -------------------------------------------------------------------

    def identify(self, config: OidcConfig, claims: dict[str, Any]) -> Identity:
        """The principal the claims name and the roles this sign-in is granted."""
        name = claims.get(config.subject_claim)
        if not isinstance(name, str) or not name or len(name.encode()) > 128:
            raise OidcSubjectUnknown(f"the identity provider's token has no usable "
                                     f"{config.subject_claim!r} claim to name a principal by",
                                     detail={"claim": config.subject_claim})
        if config.subject_claim == "email" and claims.get("email_verified") is not True:
            raise OidcSubjectUnknown("the identity provider does not say this email address is "
                                     "verified, so it names no principal",
                                     detail={"claim": "email"})
        try:
            principal = self.store.get_principal(name)
        except NotFound:
            principal = None
        if principal is None or principal.revoked:
            raise OidcSubjectUnknown(f"you signed in as {name!r}, and no principal of that name "
                                     "may use this Harbourmaster: ask an admin to add one",
                                     detail={"subject": name})
        if config.groups_claim:
            granted = config.roles_for(claims.get(config.groups_claim))
            source = "groups"
        else:
            granted = principal.roles - {Role.PILOT}
            source = "principal"
        if not granted:
            raise OidcSubjectUnknown(f"you signed in as {name!r}, whose groups grant no role "
                                     "here: ask an admin to add you to a group that does"
                                     if source == "groups" else
                                     f"principal {name!r} holds no role the console grants",
                                     detail={"subject": name})
        sid = claims.get("sid")
        return Identity(principal, tuple(sorted(r.value for r in granted)), source,
                        str(claims["sub"]), sid if isinstance(sid, str) else None)
