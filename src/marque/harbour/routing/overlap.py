"""Tuple sets over the open universe, and the exact test for their intersection.

An entry of a routing config selects ``principal × target × resource ×
operation``. Each dimension is a finite set of names or ``"*"`` — every
member, *including members nobody has named yet* (a principal added next
week, a table created tomorrow). The entry's tuple set is that product minus
the union of its own ``except`` products. Two entries with different outcomes
must select disjoint sets, and that has to be decided for the open universe,
not for the names some database happens to hold today.

The decision is exact by a finite argument. For the regions involved, every
dimension splits into *atoms*: each name that any of them mentions, plus — in
an open dimension where every region involved says ``"*"`` — one atom standing
for all names none of them mentions (:data:`OTHER`). Two members of one atom
are in exactly the same selectors, so they are in exactly the same regions;
checking one representative point per combination of atoms therefore decides
emptiness exactly. ``operation`` is a closed dimension (``read | write | ddl |
other``), so ``"*"`` there is just its four members and has no OTHER atom.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ALL",
    "OTHER",
    "DIMENSIONS",
    "OPERATIONS",
    "AllMembers",
    "Other",
    "Selector",
    "Box",
    "Region",
    "Point",
    "intersection_witness",
    "resource_atoms",
    "describe_point",
]

#: The dimensions of a tuple, in order.
DIMENSIONS: Final = ("principal", "target", "resource", "operation")
#: The closed set of operations a statement can be classified as.
OPERATIONS: Final = frozenset({"read", "write", "ddl", "other"})
_OPERATION_INDEX = DIMENSIONS.index("operation")


class AllMembers:
    """``"*"``: every member of a dimension, present and future."""

    _instance: AllMembers | None = None

    def __new__(cls) -> AllMembers:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ALL"


class Other:
    """A member of an open dimension that no selector in question names."""

    _instance: Other | None = None

    def __new__(cls) -> Other:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OTHER"


ALL: Final = AllMembers()
OTHER: Final = Other()

#: A dimension's selection: ``ALL`` or a finite, non-empty set of names.
Selector = AllMembers | frozenset[str]
#: One representative tuple: a name, or ``OTHER``, per dimension.
Point = tuple["str | Other", "str | Other", "str | Other", "str | Other"]


def _selects(selector: Selector, value: str | Other) -> bool:
    if isinstance(selector, AllMembers):
        return True
    return isinstance(value, str) and value in selector


@dataclass(frozen=True)
class Box:
    """A product of four selectors (principal, target, resource, operation)."""

    principal: Selector
    target: Selector
    resource: Selector
    operation: Selector

    @property
    def selectors(self) -> tuple[Selector, Selector, Selector, Selector]:
        """The four selectors in :data:`DIMENSIONS` order."""
        return (self.principal, self.target, self.resource, self.operation)

    def contains(self, point: Point) -> bool:
        """Whether ``point`` lies in this product."""
        return all(_selects(s, v) for s, v in zip(self.selectors, point, strict=True))


@dataclass(frozen=True)
class Region:
    """A box minus the union of its exclusion boxes: one entry's tuple set."""

    box: Box
    exclusions: tuple[Box, ...] = ()

    def contains(self, point: Point) -> bool:
        """Whether ``point`` is selected and not excluded."""
        return self.box.contains(point) and not any(e.contains(point) for e in self.exclusions)

    def boxes(self) -> Iterator[Box]:
        """The box and every exclusion box (all the selectors this region mentions)."""
        yield self.box
        yield from self.exclusions


def _atoms(dimension: int, regions: Sequence[Region]) -> list[str | Other]:
    """The atoms of ``dimension`` inside every region's box, for deciding their intersection."""
    named: set[str] = set()
    for region in regions:
        for box in region.boxes():
            selector = box.selectors[dimension]
            if not isinstance(selector, AllMembers):
                named.update(selector)
    candidates: list[str | Other]
    if dimension == _OPERATION_INDEX:
        candidates = [*sorted(OPERATIONS)]
    else:
        candidates = [*sorted(named), OTHER]
    # Keep only atoms every region's own box selects: the intersection lives there.
    return [
        atom
        for atom in candidates
        if all(_selects(region.box.selectors[dimension], atom) for region in regions)
    ]


def _grid(regions: Sequence[Region]) -> Iterable[Point]:
    principal, target, resource, operation = (_atoms(d, regions) for d in range(4))
    yield from itertools.product(principal, target, resource, operation)


def intersection_witness(*regions: Region) -> Point | None:
    """A representative point in every one of ``regions``, or ``None`` if they are disjoint.

    Exact over the open universe (see the module docstring): ``None`` means no
    tuple, named or not yet named, lies in all of them.
    """
    for point in _grid(regions):
        if all(region.contains(point) for region in regions):
            return point
    return None


def resource_atoms(regions: Sequence[Region]) -> list[str | Other]:
    """Every resource any region names, plus ``OTHER``: representatives of all resources."""
    named: set[str] = set()
    for region in regions:
        for box in region.boxes():
            if not isinstance(box.resource, AllMembers):
                named.update(box.resource)
    return [*sorted(named), OTHER]


def describe_point(point: Point) -> str:
    """``principal=… target=… resource=… operation=…``, OTHER shown as a phrase."""
    parts = []
    for name, value in zip(DIMENSIONS, point, strict=True):
        shown = f"(any {name} the config does not name)" if isinstance(value, Other) else value
        parts.append(f"{name}={shown}")
    return " ".join(parts)
