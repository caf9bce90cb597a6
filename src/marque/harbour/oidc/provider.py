"""The identity provider as the Harbourmaster reaches it: discovery, keys, token endpoint.

Discovery is ``{issuer}/.well-known/openid-configuration`` (OpenID Connect Discovery
1.0); its ``issuer`` must equal the configured one exactly, or the document is refused —
a provider answering for another issuer is a mix-up, not a detail. The JWKS is fetched
from its ``jwks_uri`` and kept; an ID token signed with a ``kid`` not in it makes one
refetch (a provider that rotated its key), and refetches are rate-limited
(:data:`REFETCH_SECONDS` apart) so tokens with made-up key ids cannot make this process
hammer the provider. Every call has a timeout; anything else than a well-formed answer
is :class:`~marque.errors.OidcProviderUnavailable`, never a guess.

Each :class:`Provider` keeps one ``httpx.Client`` (made at its first call, closed with
:meth:`Providers.close` when the service closes), so a session's check at the provider
reuses a kept connection rather than opening one (and a TLS handshake) per call.

Blocking (httpx): call from a worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from marque.errors import OidcConfigInvalid, OidcLoginRefused, OidcProviderUnavailable

#: Seconds between two JWKS refetches caused by an unknown ``kid``.
REFETCH_SECONDS = 30.0
#: Seconds a discovery document is kept before it is read again.
DISCOVERY_SECONDS = 3600.0
TIMEOUT = httpx.Timeout(10.0)
_MAX_BODY = 512 * 1024


@dataclass(frozen=True)
class Discovery:
    """The members of a discovery document Marque uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str | None
    end_session_endpoint: str | None
    userinfo_endpoint: str | None
    code_challenge_methods: tuple[str, ...] | None
    signing_algs: tuple[str, ...]
    scopes_supported: tuple[str, ...] = ()
    #: Where tokens are revoked (RFC 7009), if the provider says.
    revocation_endpoint: str | None = None

    @classmethod
    def parse(cls, issuer: str, data: Any) -> Discovery:
        """Check a discovery document against the issuer it was fetched for."""
        if not isinstance(data, dict):
            raise OidcProviderUnavailable(f"{issuer}'s discovery document is not a JSON object")
        if data.get("issuer") != issuer:
            raise OidcConfigInvalid(
                f"the provider at {issuer} says its issuer is {str(data.get('issuer'))[:200]!r}:"
                " configure exactly the issuer its discovery document names",
                detail={"setting": "issuer"})
        for member in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(data.get(member), str) or not data[member].startswith("http"):
                raise OidcProviderUnavailable(f"{issuer}'s discovery document lacks {member}")
        methods = data.get("code_challenge_methods_supported")
        algs = data.get("id_token_signing_alg_values_supported") or ["RS256"]
        return cls(issuer=issuer, authorization_endpoint=data["authorization_endpoint"],
                   token_endpoint=data["token_endpoint"], jwks_uri=data["jwks_uri"],
                   device_authorization_endpoint=_optional(data, "device_authorization_endpoint"),
                   end_session_endpoint=_optional(data, "end_session_endpoint"),
                   userinfo_endpoint=_optional(data, "userinfo_endpoint"),
                   code_challenge_methods=None if not isinstance(methods, list)
                   else tuple(str(m) for m in methods),
                   signing_algs=tuple(str(a) for a in algs if isinstance(a, str)),
                   scopes_supported=tuple(str(s) for s in data.get("scopes_supported") or ()
                                          if isinstance(s, str)),
                   revocation_endpoint=_optional(data, "revocation_endpoint"))


def _optional(data: dict[str, Any], member: str) -> str | None:
    value = data.get(member)
    return value if isinstance(value, str) and value.startswith("http") else None


def _json(response: httpx.Response, what: str) -> Any:
    if len(response.content) > _MAX_BODY:
        raise OidcProviderUnavailable(f"the provider's {what} is larger than Marque reads")
    try:
        return response.json()
    except ValueError:
        raise OidcProviderUnavailable(f"the provider's {what} is not JSON "
                                      f"(HTTP {response.status_code})") from None


def _request(client: httpx.Client | None, method: str, url: str, *,
             timeout: httpx.Timeout | float = TIMEOUT, **kwargs: Any) -> httpx.Response:
    """One call, on the kept ``client``; without one (a one-off, as `harbour oidc set`
    checking discovery), on a client made for it and closed after."""
    if client is not None:
        return client.request(method, url, timeout=timeout, follow_redirects=False, **kwargs)
    with httpx.Client(timeout=timeout, follow_redirects=False) as once:
        return once.request(method, url, **kwargs)


def fetch_json(url: str, what: str, *, client: httpx.Client | None = None) -> Any:
    """GET ``url`` as JSON (200 only)."""
    try:
        response = _request(client, "GET", url)
    except httpx.HTTPError as exc:
        raise OidcProviderUnavailable(f"cannot reach the provider's {what} at {url}: "
                                      f"{type(exc).__name__}") from None
    if response.status_code != 200:
        raise OidcProviderUnavailable(f"the provider's {what} at {url} answered HTTP "
                                      f"{response.status_code}")
    return _json(response, what)


def discover(issuer: str, *, client: httpx.Client | None = None) -> Discovery:
    """The provider's discovery document, fetched and checked."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    return Discovery.parse(issuer, fetch_json(url, "discovery document", client=client))


def post_token(endpoint: str, form: dict[str, str], auth: tuple[str, str] | None = None, *,
               client: httpx.Client | None = None) -> dict[str, Any]:
    """POST to a token endpoint; its JSON answer. An OAuth error answer (400 with
    ``error``) is returned as it is, for the caller to read; anything else unexpected is
    ``OidcProviderUnavailable``."""
    try:
        response = _request(client, "POST", endpoint, data=form,
                            headers={"Accept": "application/json"}, auth=auth)
    except httpx.HTTPError as exc:
        raise OidcProviderUnavailable(f"cannot reach the provider's token endpoint: "
                                      f"{type(exc).__name__}") from None
    body = _json(response, "token endpoint answer")
    if not isinstance(body, dict) or (response.status_code != 200 and "error" not in body):
        raise OidcProviderUnavailable(f"the provider's token endpoint answered HTTP "
                                      f"{response.status_code}")
    return body


def revoke_token(endpoint: str, token: str, hint: str, auth: tuple[str, str] | None = None,
                 *, client_id: str | None = None, client: httpx.Client | None = None,
                 timeout: httpx.Timeout | float = TIMEOUT) -> None:
    """Revoke ``token`` at a revocation endpoint (RFC 7009 §2.1: 200, also for a token it
    no longer knows); anything else is ``OidcProviderUnavailable``. A confidential client
    authenticates with ``auth`` (its id and secret); a public one, as the command line's,
    names itself with ``client_id`` in the body."""
    data = {"token": token, "token_type_hint": hint}
    if client_id is not None:
        data["client_id"] = client_id
    try:
        response = _request(client, "POST", endpoint, timeout=timeout, auth=auth, data=data,
                            headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise OidcProviderUnavailable(f"cannot reach the provider's revocation endpoint: "
                                      f"{type(exc).__name__}") from None
    if response.status_code != 200:
        said = ""
        try:
            body = response.json()
            said = f" ({str(body.get('error'))[:80]})" if isinstance(body, dict) else ""
        except ValueError:
            pass
        raise OidcProviderUnavailable(f"the provider's revocation endpoint answered HTTP "
                                      f"{response.status_code}{said}")


def fetch_userinfo(endpoint: str, access_token: str, *,
                   client: httpx.Client | None = None) -> dict[str, Any]:
    """The UserInfo endpoint's claims for ``access_token`` (OpenID Connect Core §5.3)."""
    try:
        response = _request(client, "GET", endpoint,
                            headers={"Authorization": f"Bearer {access_token}",
                                     "Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise OidcProviderUnavailable(f"cannot reach the provider's UserInfo endpoint: "
                                      f"{type(exc).__name__}") from None
    if response.status_code != 200:
        raise OidcProviderUnavailable(f"the provider's UserInfo endpoint answered HTTP "
                                      f"{response.status_code}")
    body = _json(response, "UserInfo answer")
    if not isinstance(body, dict):
        raise OidcProviderUnavailable("the provider's UserInfo answer is not a JSON object")
    return body


class Provider:
    """One issuer's discovery document and keys, kept by this process (thread-safe)."""

    def __init__(self, issuer: str, *, clock: Callable[[], float] = time.monotonic,
                 refetch_seconds: float = REFETCH_SECONDS) -> None:
        self.issuer = issuer
        self._clock = clock
        self._refetch_seconds = refetch_seconds
        self._lock = threading.Lock()
        self._discovery: Discovery | None = None
        self._discovered_at = 0.0
        self._keys: dict[str, dict[str, Any]] | None = None
        self._last_refetch: float | None = None
        # Its own lock: discovery() calls client() while holding self._lock.
        self._client_lock = threading.Lock()
        self._client: httpx.Client | None = None
        #: How many times the JWKS was fetched (the first time included).
        self.jwks_fetches = 0

    def client(self) -> httpx.Client:
        """This provider's kept HTTP client (made at first use; thread-safe to share)."""
        with self._client_lock:
            if self._client is None:
                # No cookie jar to speak of: one session's call must carry nothing a provider
                # set on another's (as the one-off calls before, which kept none).
                jar = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
                self._client = httpx.Client(timeout=TIMEOUT, follow_redirects=False,
                                            cookies=jar)
            return self._client

    def close(self) -> None:
        """Close the kept client and its connections (a later call makes a new one)."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def post_token(self, form: dict[str, str], auth: tuple[str, str]) -> dict[str, Any]:
        """:func:`post_token` to this provider's token endpoint, on the kept client."""
        return post_token(self.discovery().token_endpoint, form, auth, client=self.client())

    def revoke_refresh_token(self, token: str, auth: tuple[str, str]) -> bool:
        """Revoke a refresh token at this provider (:func:`revoke_token`); False when the
        provider names no revocation endpoint."""
        endpoint = self.discovery().revocation_endpoint
        if endpoint is None:
            return False
        revoke_token(endpoint, token, "refresh_token", auth, client=self.client())
        return True

    def fetch_userinfo(self, access_token: str) -> dict[str, Any] | None:
        """:func:`fetch_userinfo` on the kept client; None when the provider has no
        UserInfo endpoint."""
        endpoint = self.discovery().userinfo_endpoint
        if endpoint is None:
            return None
        return fetch_userinfo(endpoint, access_token, client=self.client())

    def discovery(self) -> Discovery:
        """The discovery document (read again after :data:`DISCOVERY_SECONDS`)."""
        with self._lock:
            now = self._clock()
            if self._discovery is None or now - self._discovered_at > DISCOVERY_SECONDS:
                self._discovery = discover(self.issuer, client=self.client())
                self._discovered_at = now
            return self._discovery

    def _fetch_keys(self) -> dict[str, dict[str, Any]]:
        data = fetch_json(self.discovery().jwks_uri, "JWKS", client=self.client())
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, list):
            raise OidcProviderUnavailable("the provider's JWKS holds no keys")
        self.jwks_fetches += 1
        found: dict[str, dict[str, Any]] = {}
        for key in keys:
            if isinstance(key, dict) and isinstance(key.get("kid"), str) \
                    and key.get("use", "sig") == "sig":
                found[key["kid"]] = key
        return found

    def key(self, kid: str) -> dict[str, Any]:
        """The public JWK named ``kid``: from the kept JWKS, else after one refetch (if the
        last was long enough ago); an unknown ``kid`` is ``OidcLoginRefused``."""
        if self._keys is None:
            keys = self._fetch_keys()
            with self._lock:
                self._keys = keys
        if kid in self._keys:
            return self._keys[kid]
        with self._lock:
            now = self._clock()
            allowed = self._last_refetch is None \
                or now - self._last_refetch >= self._refetch_seconds
            if allowed:
                self._last_refetch = now
        if allowed:
            keys = self._fetch_keys()
            with self._lock:
                self._keys = keys
            if kid in keys:
                return keys[kid]
        raise OidcLoginRefused(f"the ID token is signed with a key ({kid[:80]!r}) the provider "
                               "does not publish", detail={"check": "unknown_key"})


class Providers:
    """One :class:`Provider` per issuer, kept for this process's life."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_issuer: dict[str, Provider] = {}

    def get(self, issuer: str) -> Provider:
        """The kept provider for ``issuer`` (made on first use)."""
        with self._lock:
            found = self._by_issuer.get(issuer)
            if found is None:
                found = self._by_issuer[issuer] = Provider(issuer)
            return found

    def close(self) -> None:
        """Close every kept provider's HTTP client (when the service closes)."""
        with self._lock:
            kept = list(self._by_issuer.values())
        for provider in kept:
            provider.close()
