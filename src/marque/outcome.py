"""The outcome lattice of DESIGN §4 and the outcome object of §9.

Each attempt of a nonce settles by monotonic merge (seed 001): an observation
only lands if it ranks strictly above what is recorded, so a late timeout can
never overwrite a commit and ``applied`` is absorbing. The storage layers
implement the same rule as a compare-and-set on ``rank``; :func:`merge` is its
pure statement, used by tests and by code that reasons about outcomes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
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
    """The status after ``observed`` meets ``current``: the higher rank wins."""
    return observed if observed.rank > current.rank else current


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
    events: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @property
    def exit_status(self) -> int:
        """The CLI exit status this outcome maps to."""
        return EXIT_STATUS[self.status]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of DESIGN §9 (plus ``result`` for reads)."""
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
        }
