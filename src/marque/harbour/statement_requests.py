"""Statement requests at the Harbourmaster (DESIGN §11): a :class:`~marque.change.Change`.

The request stores the change, the Checkpoint seals its preview by
``preview_cid`` and the marque carries the change itself — as routed, so a
change whose every statement is a read carries ``access: "read_only"`` (§11.3),
which is part of its ``change_cid``. A preview is asked for only when the
change needs approval: an allowed one is issued at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from marque.change import READ_ONLY, Budget, Change
from marque.cid import cid
from marque.errors import MarqueError, PreviewFailed
from marque.harbour.identity import RequestIdentity, request_identity
from marque.harbour.routing import Decision, RoutingConfig, evaluate
from marque.target.row_images import diff_cid

if TYPE_CHECKING:
    from marque.harbour.store.base import PilotRecord

__all__ = ["StatementRequest"]


@dataclass(frozen=True)
class StatementRequest:
    """A request for statements: the :class:`~marque.harbour.request_change.RequestChange`
    of a :class:`~marque.change.Change`."""

    change: Change

    marque_names_preview: ClassVar[bool] = False
    preview_refusals: ClassVar[tuple[type[MarqueError], ...]] = (PreviewFailed,)

    @classmethod
    def from_claim(cls, claim: Any) -> StatementRequest:
        """A stored change read back strictly (``MarqueInvalid`` otherwise)."""
        return cls(Change.from_claim(claim))

    @property
    def change_cid(self) -> str:
        """The change's ``change_cid``."""
        return self.change.change_cid

    def to_claim(self) -> dict[str, Any]:
        """The change's claim."""
        return self.change.to_claim()

    def identity(self, harbour_id: str, principal: str, request_id: str, budget: Budget,
                 ttl_seconds: int, pilot_id: str, target: str) -> RequestIdentity:
        """:func:`~marque.harbour.identity.request_identity` of the change."""
        return request_identity(harbour_id, principal, request_id, self.change, budget,
                                ttl_seconds, pilot_id, target)

    def route(self, config: RoutingConfig, principal: str, target: str,
              dialect: str) -> Decision:
        """Every statement classified in ``dialect`` and routed (its ``access`` plays no
        part, so a stored ``read_only`` change routes as it did before it was marked)."""
        return evaluate(config, principal, target, [s.sql for s in self.change.statements],
                        dialect)

    def routed(self, decision: Decision) -> StatementRequest:
        """The change marked ``read_only`` when every statement is a read."""
        if decision.all_read:
            return StatementRequest(replace(self.change, access=READ_ONLY))
        return self

    @property
    def read_only(self) -> bool:
        """Whether the change is marked ``read_only``."""
        return self.change.read_only

    def preview_change(self, logical_request_scope: str) -> Change:
        """The change itself."""
        return self.change

    def previewed(self, answer: Any, pilot: PilotRecord,
                  target: str) -> tuple[dict[str, Any], str]:
        """The Pilot's answer as it came and its ``preview_cid``, once it is shown to be
        this change's preview on this Pilot and target."""
        mismatch = _preview_mismatch(answer, self.change, pilot, target)
        if mismatch:
            raise PreviewFailed(f"the Pilot's preview does not describe this change "
                                f"({mismatch})")
        return answer, answer["preview_cid"]

    def refused(self, exc: MarqueError, request_id: str) -> MarqueError:
        """``preview_failed`` with the refusal's message, SQLSTATE and detail, naming the
        request (as an Effect Set request's refusal keeps them)."""
        return PreviewFailed(exc.message, sqlstate=exc.sqlstate,
                             detail={**exc.detail, "id": request_id})

    def marque_change(self, preview: dict[str, Any] | None) -> Change:
        """The change itself: a statement marque does not name its preview."""
        return self.change


def _preview_mismatch(preview: Any, change: Change, pilot: PilotRecord, target: str) -> str:
    """What makes ``preview`` not this change's preview on this Pilot ("" if nothing)."""
    if not isinstance(preview, dict) or not isinstance(preview.get("preview_cid"), str):
        return "it is not a preview object"
    body = {k: v for k, v in preview.items() if k != "preview_cid"}
    if cid(body) != preview["preview_cid"]:
        return "its preview_cid does not match its content"
    if preview.get("change_cid") != change.change_cid:
        return "another change_cid"
    if preview.get("pilot") != {"id": pilot.pilot_id, "incarnation": pilot.incarnation}:
        return "another Pilot or ledger incarnation"
    if preview.get("target") != target:
        return "another target"
    if "diff_cid" in preview and preview["diff_cid"] != _diff_cid_of(preview):
        return "its diff_cid does not match its row images"
    return ""


def _diff_cid_of(preview: dict[str, Any]) -> str | None:
    statements = preview.get("statements")
    if not isinstance(statements, list) or not all(isinstance(s, dict) for s in statements):
        return None
    try:
        return diff_cid(statements)
    except MarqueError:
        return None
