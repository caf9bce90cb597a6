"""The outcome lattice of DESIGN §4 and the outcome object of §9.

Each attempt of a nonce settles by monotonic merge (seed 001): an observation
only lands if it ranks strictly above what is recorded, so a late timeout can
never overwrite a commit and ``applied`` is absorbing. And an attempt settles
*once*: after ``aborted_not_applied`` or ``applied`` nothing moves it, whatever
a late reconciler brings (its evidence may be about another attempt of the same
nonce). :func:`advance` is that rule, the one transition function; the storage
layers implement it as a compare-and-set on ``rank``. :func:`merge` is the bare
lattice join, used by code that reasons about observations.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Status(enum.Enum):
    """Where one attempt stands. The value is the wire name."""

    IN_PROGRESS = "in_progress"
    INDETERMINATE = "indeterminate"
    ABORTED_NOT_APPLIED = "aborted_not_applied"
    APPLIED = "applied"

    @property
    def rank(self) -> int:
        """Higher wins on merge."""
        return _RANK[self]

    @property
    def settled(self) -> bool:
        """True once evidence decided the attempt (nothing can change it)."""
        return self in (Status.APPLIED, Status.ABORTED_NOT_APPLIED)


_RANK = {
    Status.IN_PROGRESS: 1,
    Status.INDETERMINATE: 2,
    Status.ABORTED_NOT_APPLIED: 3,
    Status.APPLIED: 4,
}


def merge(current: Status, observed: Status) -> Status:
    """The lattice join of two observations: the higher rank wins."""
    return observed if observed.rank > current.rank else current


#: Ranks at or above this are settled: the ledger's compare-and-set never moves them.
SETTLED_RANK = 3


def advance(current: Status, observed: Status) -> Status:
    """An attempt's status after an observation: settled stays, else the higher rank wins."""
    if current.settled:
        return current
    return merge(current, observed)


# Exit statuses of DESIGN §9, by the outcome object's status.
EXIT_STATUS = {
    "applied": 0,
    "refused": 3,
    "aborted_not_applied": 4,
    "indeterminate": 5,
    "in_progress": 6,
}


@dataclass(frozen=True)
class Outcome:
    """The outcome object of DESIGN §9: what a caller is told about a nonce."""

    marque_id: str
    nonce: str
    status: str
    attempt: int
    rows_affected: int | None
    pilot_id: str
    incarnation: str
    replayed: bool = False
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    #: False when the ledger could not record this answer (DESIGN §9): the attempt stays
    #: claimed there, and reconciliation settles it from the target's stamp later.
    recorded: bool = True

    @property
    def exit_status(self) -> int:
        """The CLI exit status this outcome maps to."""
        return EXIT_STATUS[self.status]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """The outcome object back from its JSON form (as a Pilot service sends it)."""
        pilot = data.get("pilot") or {}
        return cls(
            marque_id=data["marque_id"], nonce=data["nonce"], status=data["status"],
            attempt=data["attempt"], rows_affected=data.get("rows_affected"),
            pilot_id=pilot.get("id") or "", incarnation=pilot.get("incarnation") or "",
            replayed=bool(data.get("replayed")), error=data.get("error"),
            result=data.get("result"), recorded=data.get("recorded", True) is not False,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of DESIGN §9 (plus ``result`` for reads, and ``recorded``)."""
        return {
            "marque_id": self.marque_id,
            "nonce": self.nonce,
            "status": self.status,
            "attempt": self.attempt,
            "rows_affected": self.rows_affected,
            "replayed": self.replayed,
            "pilot": {"id": self.pilot_id, "incarnation": self.incarnation},
            "error": self.error,
            "result": self.result,
            "recorded": self.recorded,
        }


def refusal_object(
    marque_id: str | None, nonce: str, pilot: dict[str, Any], error: dict[str, Any]
) -> dict[str, Any]:
    """The outcome object of a refusal: every key of an outcome, nothing claimed or run."""
    body = Outcome(marque_id or "", nonce, "refused", 0, None, pilot.get("id") or "",
                   pilot.get("incarnation") or "", error=error).to_dict()
    body.update(marque_id=marque_id, attempt=None, pilot=dict(pilot))
    if "recorded" in body:
        body["recorded"] = False  # nothing was claimed, so nothing was recorded
    return body
