"""Who is calling the Harbourmaster, and what they may see and do (DESIGN §11.7).

Every method of the core checks its caller's roles itself (:func:`require`), so
the HTTP API, the console, the CLI and agents obey one rule. A request another
requester made is answered exactly like a missing one (:func:`find`): request
ids never leak, and a refusal to an authenticated caller is 403, never 404.
"""

from __future__ import annotations

import hashlib

from marque.errors import Forbidden, MarqueError, NotFound, Unauthenticated
from marque.harbour.identity import authority_scope_cid, logical_request_scope
from marque.harbour.oidc.signin import CLI_TOKEN_PREFIX
from marque.harbour.principals import Principal, Role
from marque.harbour.store.base import HarbourStore, StoredRequest

__all__ = ["ASKERS", "READERS", "authenticate", "find", "only_own", "require", "sees_all"]

#: Who may read every request (and its logbook entries).
READERS = (Role.APPROVER, Role.AUDITOR, Role.ADMIN)
#: Who may ask for a change and see it through: a requester, or an agent (docs/agents.md).
ASKERS = (Role.REQUESTER, Role.AGENT)


def authenticate(store: HarbourStore, token: str | None, now: float) -> Principal:
    """The principal holding ``token``; ``Unauthenticated`` if none, unknown or revoked."""
    if not token:
        raise Unauthenticated("send `Authorization: Bearer <token>`: this endpoint needs "
                              "a principal's token")
    if token.startswith(CLI_TOKEN_PREFIX):  # `marque login --oidc`: a short-lived session
        return _signed_in(store, token, now)
    return store.authenticate(token)


def _signed_in(store: HarbourStore, token: str, now: float) -> Principal:
    """The principal of a command line's sign-in token, with the roles it was granted."""
    session, principal = store.get_session(
        hashlib.sha256(token.encode("utf-8")).hexdigest(), now=now)
    if session.via != "cli":
        raise Unauthenticated("the token is not one this Harbourmaster issued")
    return principal


def require(principal: Principal, *roles: Role) -> None:
    """Refuse a principal holding none of ``roles`` (403, never 404: it is authenticated).

    An agent is refused everything not naming :data:`Role.AGENT` whatever else it holds,
    so no role added beside it can ever let it approve, expire or administer."""
    if principal.has(Role.AGENT) and Role.AGENT not in roles:
        raise Forbidden(f"{principal.name} is an agent: agents may request, read their own "
                        "requests and execute their own marques, and nothing else; a "
                        "human with the role " + " or ".join(r.value for r in roles)
                        + " does this", detail={"principal": principal.name,
                                                "roles": sorted(r.value for r in roles)})
    if not any(principal.has(role) for role in roles):
        raise Forbidden(f"{principal.name} may not do this: it needs the role "
                        f"{' or '.join(r.value for r in roles)}",
                        detail={"principal": principal.name,
                                "roles": sorted(r.value for r in roles)})


def sees_all(principal: Principal) -> bool:
    """Whether ``principal`` may read every request (one of :data:`READERS`)."""
    return any(principal.has(role) for role in READERS)


def only_own(principal: Principal) -> str | None:
    """Whose requests a listing for ``principal`` holds: None for everyone's, else its
    own name."""
    return None if sees_all(principal) else principal.name


def _visible(principal: Principal, request: StoredRequest) -> bool:
    if sees_all(principal):
        return True
    return any(principal.has(role) for role in ASKERS) \
        and request.principal == principal.name


def find(store: HarbourStore, principal: Principal, id_or_request_id: str) -> StoredRequest:
    """A request the caller may see, by ``rq_`` id or by the caller's own request id.

    A caller's request id resolves in the caller's scope to its active request if
    there is one, else to the most recent one in its history (failed, expired, …): an
    id keeps answering with its latest request whatever its state. Another
    requester's request is ``NotFound``, exactly like a missing one, so request ids
    never leak.
    """
    if not isinstance(id_or_request_id, str) or not id_or_request_id:
        raise NotFound("no such request")
    if id_or_request_id.startswith("rq_"):
        try:
            request: StoredRequest | None = store.get_request(id_or_request_id)
        except NotFound:
            request = None
    else:
        try:
            scope: str | None = logical_request_scope(
                authority_scope_cid(store.harbour_id, principal.name), id_or_request_id)
        except MarqueError:
            scope = None
        request = None if scope is None else (
            store.find_active(scope) or next(reversed(store.find_history(scope)), None))
    if request is None or not _visible(principal, request):
        raise NotFound(f"no request {id_or_request_id[:64]!r} that you may see",
                       detail={"id": id_or_request_id[:64]})
    return request
