"""Marques, preview tokens and query tokens from the Harbourmaster's one issuer key.

The Harbourmaster never executes (DESIGN §11.4): what it hands out is a marque
for an allowed or approved request, a preview token asking a Pilot what a change
would do (§10), and a query token asking a Pilot for the evidence of one marque
(§10). All three are signed with the same issuer key and name the same issuer,
so a Pilot trusts one JWKS for all of them; :class:`Issuer` is the one place
that makes them.

A request's marque (§2 and §11.4) says who asked (``sub``), whose key may use it
(``cnf.jkt``, from the requester's *registered* key), the request it answers
(``req``) and what permitted it (``approval``): the Checkpoint's CID and the
Resolutions that approved it, or, for an allowed request, the routing config's
CID alone — an allow is never dressed up as an approval.

Decisions recorded here:

* A requester without a registered public key is :class:`~marque.errors.Forbidden`
  (HTTP 403): the principal is known but cannot hold a marque until an admin
  registers its key; a private key offered as the registered one is
  ``InvalidInput`` (the Harbourmaster must never hold a holder's secret).
* A ``ttl_seconds`` above the routing entry's ``max_ttl`` is refused with
  :class:`~marque.errors.InvalidInput`, never clamped: the TTL is part of the
  intent the approvers saw (``program_definition_cid``), so issuing another one
  silently would issue something nobody approved. :func:`check_ttl` lets the
  request be refused at creation, before anyone is asked to approve it.
* A delegated request's marque is issued only against its sealed Checkpoint:
  the change, the logical request and the environment must be the
  Checkpoint's, and the approval must list at least the sealed number of
  Resolutions, or it is :class:`~marque.errors.RevalidationFailed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from marque.change import AnyChange, Budget, Change, EffectSetChange, is_json_int
from marque.cid import MAX_SAFE_INT, is_cid
from marque.errors import Forbidden, InvalidInput, MarqueInvalid, RevalidationFailed
from marque.harbour.checkpoint import Checkpoint, Tally, TallyState
from marque.token import (
    Marque,
    TrustedKeys,
    issue_marque,
    public_jwk,
    read_marque,
    thumbprint,
    unverified_claims,
)
from marque.token.service_tokens import MAX_SHORT_TOKEN_SECONDS, PreviewGrant
from marque.token.service_tokens import issue_preview_token as _issue_preview_token
from marque.token.service_tokens import issue_query_token as _issue_query_token

__all__ = [
    "Issuer",
    "RequestMarque",
    "approval_for_allow",
    "approval_for_checkpoint",
    "check_ttl",
    "issue_request_marque",
    "read_request_marque",
]

_ALLOW_KEYS: Final = frozenset({"config_cid"})
_CHECKPOINT_KEYS: Final = frozenset({"checkpoint_cid", "resolutions"})


# -- the approval claim ------------------------------------------------------------------


def approval_for_allow(config_cid: str) -> dict[str, Any]:
    """The ``approval`` claim of an allowed request: the routing config's CID, nothing else."""
    if not isinstance(config_cid, str) or not is_cid(config_cid):
        raise InvalidInput("config_cid must be a CID")
    return {"config_cid": config_cid}


def approval_for_checkpoint(checkpoint: Checkpoint, tally: Tally) -> dict[str, Any]:
    """The ``approval`` claim of an approved Checkpoint: its CID and the counted Resolutions.

    Raises :class:`InvalidInput` unless ``tally`` is this Checkpoint's and says
    ``approved`` — a pending or rejected Checkpoint has no approval to carry.
    """
    if tally.checkpoint_cid != checkpoint.cid:
        raise InvalidInput(f"the tally is of checkpoint {tally.checkpoint_cid}, not "
                           f"{checkpoint.cid}")
    if tally.state is not TallyState.APPROVED:
        raise InvalidInput(f"checkpoint {checkpoint.cid} is {tally.state.value}, not approved: "
                           "no marque can be issued for it")
    return {"checkpoint_cid": checkpoint.cid, "resolutions": list(tally.approval_cids)}


def _read_approval(approval: Any) -> dict[str, Any]:
    """The approval claim, checked for one of its two exact shapes (a fresh copy)."""
    if not isinstance(approval, Mapping):
        raise InvalidInput("approval must be {checkpoint_cid, resolutions} or {config_cid}")
    keys = set(approval.keys())
    if keys == _ALLOW_KEYS:
        return approval_for_allow(approval["config_cid"])
    if keys == _CHECKPOINT_KEYS:
        checkpoint_cid = approval["checkpoint_cid"]
        resolutions = approval["resolutions"]
        if not isinstance(checkpoint_cid, str) or not is_cid(checkpoint_cid):
            raise InvalidInput("approval.checkpoint_cid must be a CID")
        if (not isinstance(resolutions, list | tuple) or not resolutions
                or not all(isinstance(r, str) and is_cid(r) for r in resolutions)):
            raise InvalidInput("approval.resolutions must be a non-empty list of Resolution CIDs")
        if len(set(resolutions)) != len(resolutions):
            raise InvalidInput("approval.resolutions lists a Resolution twice")
        return {"checkpoint_cid": checkpoint_cid, "resolutions": list(resolutions)}
    raise InvalidInput("approval must be exactly {checkpoint_cid, resolutions} (a delegated "
                       "request) or {config_cid} (an allowed one)")


def _bind_to_checkpoint(
    approval: dict[str, Any], checkpoint: Checkpoint, *, logical_request_scope: str,
    change: AnyChange, pilot_id: str, incarnation: str, target: str,
) -> None:
    """Refuse a marque that would carry anything other than what the Checkpoint sealed."""
    mismatched = [
        name for name, ours, sealed in (
            ("checkpoint_cid", approval["checkpoint_cid"], checkpoint.cid),
            ("logical_request_scope", logical_request_scope, checkpoint.logical_request_scope),
            ("change_cid", change.change_cid, checkpoint.change_cid),
            ("pilot_id", pilot_id, checkpoint.pilot_id),
            ("incarnation", incarnation, checkpoint.incarnation),
            ("target", target, checkpoint.target),
        ) if ours != sealed
    ]
    if mismatched:
        raise RevalidationFailed(
            f"the marque would not carry what checkpoint {checkpoint.cid} sealed "
            f"({', '.join(mismatched)} differ): a changed request needs a new approval",
            detail={"failed": mismatched, "checkpoint_cid": checkpoint.cid})
    if len(approval["resolutions"]) < checkpoint.approvals:
        raise RevalidationFailed(
            f"checkpoint {checkpoint.cid} needs {checkpoint.approvals} approval(s); the approval "
            f"lists {len(approval['resolutions'])}",
            detail={"failed": ["approvals"], "checkpoint_cid": checkpoint.cid})


# -- marques -----------------------------------------------------------------------------


def check_ttl(ttl_seconds: Any, max_ttl_seconds: int | None) -> int:
    """``ttl_seconds`` if it is a positive whole number within ``max_ttl_seconds`` (None: no cap).

    A TTL above the routing entry's ``max_ttl`` is :class:`InvalidInput`, never
    shortened: call this when the request is made, so nobody approves a TTL that
    cannot be issued.
    """
    if not is_json_int(ttl_seconds) or not 0 < ttl_seconds <= MAX_SAFE_INT:
        raise InvalidInput("ttl_seconds must be a positive whole number of seconds")
    if max_ttl_seconds is not None:
        if not is_json_int(max_ttl_seconds) or max_ttl_seconds <= 0:
            raise InvalidInput("max_ttl_seconds must be a positive whole number of seconds")
        if ttl_seconds > max_ttl_seconds:
            raise InvalidInput(
                f"ttl_seconds {ttl_seconds} exceeds the routing entry's max_ttl of "
                f"{max_ttl_seconds} s: ask again with a TTL of at most that",
                detail={"ttl_seconds": ttl_seconds, "max_ttl_seconds": max_ttl_seconds})
    return int(ttl_seconds)


def _registered_key(requester: str, requester_jwk: dict[str, Any] | None) -> dict[str, Any]:
    if requester_jwk is None:
        raise Forbidden(
            f"principal {requester} has no registered public key, so no marque can be bound to "
            "it: an admin registers one with `marque harbour principal add … --key PUBLIC_JWK`",
            detail={"principal": requester})
    if isinstance(requester_jwk, dict) and "d" in requester_jwk:
        raise InvalidInput(f"the registered key of {requester} is a private key; register "
                           "only its public half")
    return public_jwk(requester_jwk)


def issue_request_marque(
    issuer_key: dict[str, Any],
    *,
    issuer: str,
    requester: str,
    requester_jwk: dict[str, Any] | None,
    pilot_id: str,
    incarnation: str,
    target: str,
    change: AnyChange,
    budget: Budget,
    ttl_seconds: int,
    max_ttl_seconds: int | None,
    logical_request_scope: str,
    approval: Mapping[str, Any],
    checkpoint: Checkpoint | None = None,
    now: float | None = None,
    marque_id: str | None = None,
) -> str:
    """Sign the marque of an allowed or approved request (DESIGN §2, §11.4).

    ``sub`` is ``requester``, ``cnf.jkt`` the thumbprint of its registered key,
    ``req`` the ``logical_request_scope`` and ``approval`` either
    ``{checkpoint_cid, resolutions}`` (build it with
    :func:`approval_for_checkpoint`; ``checkpoint`` is then required and the
    marque must carry exactly what it sealed) or ``{config_cid}`` (an allowed
    request, :func:`approval_for_allow`; no ``checkpoint``). ``exp - iat`` is
    ``ttl_seconds``, which must be within ``max_ttl_seconds``.

    Raises :class:`Forbidden` (no registered key), :class:`InvalidInput` (a bad
    argument, TTL or approval shape) or :class:`RevalidationFailed` (the marque
    would differ from the Checkpoint).
    """
    holder = _registered_key(requester, requester_jwk)
    ttl = check_ttl(ttl_seconds, max_ttl_seconds)
    if not isinstance(logical_request_scope, str) or not is_cid(logical_request_scope):
        raise InvalidInput("logical_request_scope must be a CID")
    if not isinstance(change, Change | EffectSetChange):
        raise InvalidInput("change must be a Change or an EffectSetChange")
    claim = _approval_claim(approval, checkpoint, logical_request_scope=logical_request_scope,
                            change=change, pilot_id=pilot_id, incarnation=incarnation,
                            target=target)
    return issue_marque(
        issuer_key, pilot_id=pilot_id, incarnation=incarnation, target=target,
        holder_jwk=holder, change=change, budget=budget, ttl_seconds=ttl, subject=requester,
        issuer=issuer, now=now, marque_id=marque_id, request_scope=logical_request_scope,
        approval=claim)


def _approval_claim(
    approval: Mapping[str, Any], checkpoint: Checkpoint | None, *,
    logical_request_scope: str, change: AnyChange, pilot_id: str, incarnation: str,
    target: str,
) -> dict[str, Any]:
    """The ``approval`` claim to sign, read from ``approval`` and held to ``checkpoint``:
    an approved request's against what it sealed, an allowed one's with none."""
    claim = _read_approval(approval)
    if "checkpoint_cid" in claim:
        if checkpoint is None:
            raise InvalidInput("an approved request's marque is issued against its Checkpoint: "
                               "pass checkpoint=")
        _bind_to_checkpoint(claim, checkpoint, logical_request_scope=logical_request_scope,
                            change=change, pilot_id=pilot_id, incarnation=incarnation,
                            target=target)
    elif checkpoint is not None:
        raise InvalidInput("an allowed request has no Checkpoint; its approval is the config "
                           "CID alone")
    return claim


@dataclass(frozen=True)
class RequestMarque:
    """A verified marque together with the request it answers and what permitted it."""

    marque: Marque
    request_scope: str | None
    approval: dict[str, Any] | None


def read_request_marque(token: str, trusted: TrustedKeys) -> RequestMarque:
    """Verify ``token`` (:func:`marque.token.read_marque`) and read its ``req`` and ``approval``.

    Both are ``None`` on a marque issued locally (``marque issue``). The two
    claims are read only after the signature has held, from the same token.
    """
    marque = read_marque(token, trusted)
    claims = unverified_claims(marque.token) or {}
    req = claims.get("req")
    if req is not None and (not isinstance(req, str) or not is_cid(req)):
        raise MarqueInvalid("claim req must be the logical request scope's CID")
    approval = claims.get("approval")
    try:
        read = None if approval is None else _read_approval(approval)
    except InvalidInput as exc:
        raise MarqueInvalid(f"claim approval: {exc.message}") from exc
    return RequestMarque(marque=marque, request_scope=req, approval=read)


# -- one issuer for all three kinds ------------------------------------------------------


@dataclass(frozen=True)
class Issuer:
    """The Harbourmaster's issuer key and name: every marque and service token it signs.

    Building one checks the key (an Ed25519 private JWK); :attr:`jwks` is what a
    Pilot pins to trust all three kinds of token.
    """

    key: dict[str, Any] = field(repr=False)
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInput("the issuer name must be a non-empty string")
        if not isinstance(self.key, dict) or not self.key.get("d"):
            raise InvalidInput("the issuer key must be a private Ed25519 JWK")
        public_jwk(self.key)  # refuses anything but Ed25519

    @property
    def kid(self) -> str:
        """The ``kid`` tokens are signed under: the key's own, else its thumbprint."""
        kid = self.key.get("kid")
        return kid if isinstance(kid, str) and kid else thumbprint(self.key)

    @property
    def jwks(self) -> dict[str, Any]:
        """The public JWKS a Pilot trusts: ``{"keys": [public JWK with kid]}``."""
        return TrustedKeys([{**public_jwk(self.key), "kid": self.kid}]).to_jwks()

    def marque(
        self,
        *,
        requester: str,
        requester_jwk: dict[str, Any] | None,
        pilot_id: str,
        incarnation: str,
        target: str,
        change: AnyChange,
        budget: Budget,
        ttl_seconds: int,
        max_ttl_seconds: int | None,
        logical_request_scope: str,
        approval: Mapping[str, Any],
        checkpoint: Checkpoint | None = None,
        now: float | None = None,
        marque_id: str | None = None,
    ) -> str:
        """:func:`issue_request_marque` with this key and issuer name."""
        return issue_request_marque(
            self.key, issuer=self.name, requester=requester, requester_jwk=requester_jwk,
            pilot_id=pilot_id, incarnation=incarnation, target=target, change=change,
            budget=budget, ttl_seconds=ttl_seconds, max_ttl_seconds=max_ttl_seconds,
            logical_request_scope=logical_request_scope, approval=approval,
            checkpoint=checkpoint, now=now, marque_id=marque_id)

    def preview_token(
        self,
        grant: PreviewGrant,
        *,
        ttl_seconds: int = MAX_SHORT_TOKEN_SECONDS,
        now: float | None = None,
        jti: str | None = None,
    ) -> str:
        """A preview token (DESIGN §10) for ``grant``'s change on one Pilot ledger and
        target."""
        return _issue_preview_token(self.key, grant, ttl_seconds=ttl_seconds,
                                    issuer=self.name, now=now, jti=jti)

    def query_token(
        self,
        *,
        pilot_id: str,
        marque_id: str,
        ttl_seconds: int = MAX_SHORT_TOKEN_SECONDS,
        now: float | None = None,
        jti: str | None = None,
    ) -> str:
        """A query token (DESIGN §10) for the evidence a Pilot holds of one marque."""
        return _issue_query_token(self.key, pilot_id=pilot_id, marque_id=marque_id,
                                  ttl_seconds=ttl_seconds, issuer=self.name, now=now, jti=jti)
