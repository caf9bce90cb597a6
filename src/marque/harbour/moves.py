"""The two moves every path through a request ends in (DESIGN §11.2, §11.4).

A request either ends — ``failed``, ``rejected`` or ``expired`` — with the error
that ended it recorded as its ``failure`` (:func:`end`: the error class's stable
code and its message), or its marque is signed and stored with ``prepared``
(:func:`issue`). Both are one compare-and-set on the request's version; the
loser of a race reads the request again and answers what the winner stored, so
a marque that lost is never stored nor handed out.
"""

from __future__ import annotations

from typing import Any

from marque.change import AnyChange, Budget
from marque.errors import Forbidden, InvalidInput, MarqueError, RevalidationFailed
from marque.harbour.checkpoint import Checkpoint
from marque.harbour.context import HarbourContext
from marque.harbour.lifecycle import RequestState, StaleVersion
from marque.harbour.store.base import StoredRequest
from marque.token import unverified_claims

__all__ = ["end", "failure", "issue"]

S = RequestState


def failure(error: MarqueError, conflicts: list[dict[str, Any]] | None = None
            ) -> dict[str, Any]:
    """The ``failure`` a request records for ``error``: ``{code, message}``, and for an
    ``undo_conflict`` the rows in conflict, by key."""
    recorded: dict[str, Any] = {"code": error.code, "message": error.message}
    if conflicts is not None:
        recorded["conflicts"] = conflicts
    return recorded


def end(ctx: HarbourContext, request: StoredRequest, to: RequestState, error: MarqueError, *,
        actor: str, conflicts: list[dict[str, Any]] | None = None,
        **updates: Any) -> StoredRequest:
    """Move ``request`` to the end state ``to``, its ``failure`` ``error``; a lost race
    re-reads."""
    try:
        return ctx.store.transition(request.id, request.version, to, actor=actor,
                                    now=ctx.now(), reason=error.message,
                                    failure=failure(error, conflicts), **updates)
    except StaleVersion:
        return ctx.store.get_request(request.id)


def issue(ctx: HarbourContext, request: StoredRequest, change: AnyChange, *,
          approval: dict[str, Any], max_ttl: int | None, actor: str,
          checkpoint: Checkpoint | None = None, routing: dict[str, Any] | None = None,
          preview: dict[str, Any] | None = None) -> StoredRequest:
    """Sign the request's marque and store it with ``prepared``, or lose the race. A
    requester revoked meanwhile, or a marque that cannot be signed, ends the request
    ``failed`` with ``revalidation_failed``."""
    requester = ctx.store.get_principal(request.principal)
    extra: dict[str, Any] = {} if routing is None else {"routing": routing}
    if preview is not None:
        extra["preview"] = preview
    if requester.revoked:
        return end(ctx, request, S.FAILED,
                   RevalidationFailed(f"the requester {requester.name} was revoked"),
                   actor=actor, **extra)
    pilot = ctx.store.get_pilot(request.pilot_id)
    try:
        token = ctx.issuer.marque(
            requester=requester.name, requester_jwk=requester.public_jwk,
            pilot_id=request.pilot_id,
            incarnation=checkpoint.incarnation if checkpoint else pilot.incarnation,
            target=request.target, change=change, budget=Budget.from_claim(request.budget),
            ttl_seconds=request.ttl_seconds, max_ttl_seconds=max_ttl,
            logical_request_scope=request.logical_request_scope, approval=approval,
            checkpoint=checkpoint)
    except (Forbidden, RevalidationFailed, InvalidInput) as exc:
        return end(ctx, request, S.FAILED, RevalidationFailed(exc.message), actor=actor,
                   **extra)
    return _store_issued(ctx, request, token, approval, actor, extra)


def _store_issued(ctx: HarbourContext, request: StoredRequest, token: str,
                  approval: dict[str, Any], actor: str, extra: dict[str, Any]) -> StoredRequest:
    claims = unverified_claims(token) or {}
    expires_at = float(claims["exp"])
    try:
        return ctx.store.transition(
            request.id, request.version, S.PREPARED, actor=actor, now=ctx.now(),
            kind="marque.issued",
            body={"marque_id": claims["jti"], "expires_at": expires_at, "approval": approval},
            marque_id=claims["jti"], marque=token, marque_expires_at=expires_at, **extra,
            # A preparation that once could not reach its Pilot kept why; now it moved on.
            **({"failure": None} if request.failure and request.state is S.PREPARING
               else {}))
    except StaleVersion:
        return ctx.store.get_request(request.id)
