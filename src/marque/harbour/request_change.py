"""What a request asks for, as the Harbourmaster's flow sees it (DESIGN §11).

A request's change is statements (:class:`~marque.harbour.statement_requests.StatementRequest`)
or an Effect Set before its preview
(:class:`~marque.harbour.effect_requests.EffectSetRequest`). The flow is the
same for both — one scope and lifecycle, one routing config, one Checkpoint,
one marque — and :class:`RequestChange` names every step at which they differ:

* its **identity** (§11.1): the intent preimages of its kind;
* its **routing**: statements are classified, an Effect Set's members are routed
  by kind and table; routing may make a statement change ``read_only``;
* its **preview**: what the preview token carries, which refusals of the Pilot
  end the request and with what error, and how the answer is checked to be
  this request's preview;
* its **marque's change**: the statements themselves, or the
  :class:`~marque.change.EffectSetChange` naming the stored preview — which is
  why an Effect Set is previewed even when routing allows it at once.

:mod:`marque.harbour.service` calls these and never asks which kind it holds;
:mod:`marque.harbour.intake` tells the kinds apart in a submitted body and
:func:`stored_change` in a stored one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from marque.change import AnyChange
from marque.harbour.effect_requests import EffectSetRequest, effect_set_change, is_effect_set
from marque.harbour.statement_requests import StatementRequest

if TYPE_CHECKING:
    from marque.change import Budget, Change
    from marque.effects.request import EffectPreviewRequest
    from marque.errors import MarqueError
    from marque.harbour.identity import RequestIdentity
    from marque.harbour.routing import Decision, RoutingConfig
    from marque.harbour.store.base import PilotRecord

__all__ = ["RequestChange", "stored_change", "marque_change"]


class RequestChange(Protocol):
    """The steps of a request's life that depend on what its change is (module docstring)."""

    @property
    def change_cid(self) -> str:
        """The CID of the change as the request stores it (:meth:`to_claim`)."""
        ...

    def to_claim(self) -> dict[str, Any]:
        """The change as the request stores it, with its ``change_cid``."""
        ...

    def identity(self, harbour_id: str, principal: str, request_id: str, budget: Budget,
                 ttl_seconds: int, pilot_id: str, target: str) -> RequestIdentity:
        """The request's §11.1 scope and intent; the request id is checked first."""
        ...

    def route(self, config: RoutingConfig, principal: str, target: str,
              dialect: str) -> Decision:
        """The routing decision for this change on ``target`` in ``dialect``."""
        ...

    def routed(self, decision: Decision) -> RequestChange:
        """The change as ``decision`` makes it, which is what the request stores."""
        ...

    @property
    def read_only(self) -> bool:
        """Whether the change was routed as a read (a resumed preparation checks this)."""
        ...

    @property
    def marque_names_preview(self) -> bool:
        """Whether the marque's change is named by the preview, so that even an allowed
        request is previewed before it is issued."""
        ...

    @property
    def preview_refusals(self) -> tuple[type[MarqueError], ...]:
        """The Pilot's refusals of the preview (and a foreign preview's
        ``preview_failed``) that end the request ``failed``; others leave it for a retry."""
        ...

    def preview_change(self, logical_request_scope: str) -> Change | EffectPreviewRequest:
        """What the preview token asks the Pilot to preview."""
        ...

    def previewed(self, answer: Any, pilot: PilotRecord,
                  target: str) -> tuple[dict[str, Any], str]:
        """``(the preview the request stores, the preview_cid its Checkpoint seals)`` from
        the Pilot's ``answer``; ``PreviewFailed`` if it is not this change's preview."""
        ...

    def refused(self, exc: MarqueError, request_id: str) -> MarqueError:
        """The error raised for a refusal in :attr:`preview_refusals`, once the request
        ``request_id`` has ended ``failed`` by it."""
        ...

    def marque_change(self, preview: dict[str, Any] | None) -> AnyChange:
        """The change the marque carries, given the preview the request stores."""
        ...


def stored_change(claim: Any) -> RequestChange:
    """A stored request change read back strictly (its CID rechecked)."""
    if is_effect_set(claim):
        return EffectSetRequest.from_claim(claim)
    return StatementRequest.from_claim(claim)


def marque_change(claim: Any, preview: Any) -> AnyChange:
    """The change a stored request's marque carries (:meth:`RequestChange.marque_change`).

    An Effect Set's is named by its stored preview alone, so its inputs — up to
    the largest ``max_items`` of rows — are not read back and bound again.
    """
    if is_effect_set(claim):
        return effect_set_change(preview)
    return stored_change(claim).marque_change(preview)
