"""The authorization evidence an Effect Set's receipts carry for the marque that ran it.

A Harbourmaster's marque names the approval it was issued under; a marque issued
locally names the trusted issuer key that signed it. The set receipt seals this
evidence (:mod:`marque.effects.receipts`), and a Run binds it at admission
(:func:`marque.pilot.effect_run.bound_cids`), so a resume under other authority
does not revalidate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marque.cid import cid

if TYPE_CHECKING:
    from marque.token import Marque

__all__ = ["authorization", "local_authorization"]

#: Marque's authorization evidence for a marque issued without a Harbourmaster.
LOCAL_AUTHORIZATION_VERSION = "marque-local-authorization/0.1"


def authorization(marque: Marque) -> dict[str, Any]:
    """The set receipt's authorization evidence for ``marque``: a Harbourmaster's marque
    carries its ``approval`` claim — ``{checkpoint_cid, resolutions}`` becomes ``{kind:
    "approval", checkpoint_cid, resolution_cids}``, ``{config_cid}`` an account ``allow``;
    a marque issued locally has none (:func:`local_authorization`). The claim is read from
    the token whose signature :func:`marque.token.read_marque` already verified."""
    from marque.cid import is_cid
    from marque.token import unverified_claims

    approval = (unverified_claims(marque.token) or {}).get("approval")
    if isinstance(approval, dict) and set(approval) == {"checkpoint_cid", "resolutions"}:
        resolutions = approval["resolutions"]
        if (isinstance(approval["checkpoint_cid"], str) and is_cid(approval["checkpoint_cid"])
                and isinstance(resolutions, list) and resolutions
                and all(isinstance(r, str) and is_cid(r) for r in resolutions)):
            return {"kind": "approval", "checkpoint_cid": approval["checkpoint_cid"],
                    "resolution_cids": list(resolutions)}
    if (isinstance(approval, dict) and set(approval) == {"config_cid"}
            and isinstance(approval["config_cid"], str) and is_cid(approval["config_cid"])):
        return {"kind": "allow", "config_cid": approval["config_cid"],
                "approval_required": False, "risk_claim_required": False}
    return local_authorization(marque)


def local_authorization(marque: Marque) -> dict[str, Any]:
    """The set receipt's authorization for a marque issued without a Harbourmaster: an
    ``allow`` whose ``config_cid`` names the trusted issuer key that signed it."""
    return {"kind": "allow",
            "config_cid": cid({"version": LOCAL_AUTHORIZATION_VERSION, "issuer": marque.issuer,
                               "kid": marque.kid}),
            "approval_required": False, "risk_claim_required": False}
