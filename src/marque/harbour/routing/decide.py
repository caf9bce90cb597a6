"""Evaluating a request against a routing config (DESIGN §11.3): a decision, as a value.

Every statement of a request is classified (``classify.py``) into tuples
``(principal, target, resource, operation)``; each tuple is matched against
the config's entries; the request's decision combines them:

1. any tuple an entry **denies** → ``deny``, code ``account_denied``;
2. else any tuple **no entry matches** → ``deny``, code ``account_no_match``
   (a distinct refusal: nobody said no, but nobody said yes either);
3. else any tuple is **delegated** → ``delegate``, with the strictest terms
   of every delegate entry involved: the largest ``approvals``,
   ``self_approval`` only if *every* one allows it, and the smallest
   ``max_ttl`` any of them sets, and ``caveats = "two_approvers"`` if any one
   sets it (applied once the preview is known: :func:`approvals_with_caveats`);
4. else → ``allow``.

The same strictest-terms rule settles one tuple that two delegate entries
both select (same-outcome overlaps are legal). Entries of different outcomes
never select a common tuple — the config was refused at load otherwise.

A tuple whose resource is ``"*"`` (SQL that may touch any table: an unknown
function, no table named, an unclassifiable statement) stands for every
resource, named in the config or not. It is decided as the worst of all of
them — checked on one representative per resource atom of the config (each
named resource, and one for all the unnamed ones), which is exact for the
same reason the overlap check is (``overlap.py``).

The :class:`Decision` records everything it was derived from — the config CID,
each tuple, and the entries that matched it — so it can be stored and shown
as it is, never re-derived from a config that may since have changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from marque.errors import AccountConfigInvalid, AccountDenied, AccountNoMatch, InvalidInput
from marque.harbour.routing.classify import (
    ANY_RESOURCE,
    READ,
    Access,
    classify,
    table_resource,
)
from marque.harbour.routing.config import (
    ALLOW,
    CAVEATS_SHOW,
    CAVEATS_TWO_APPROVERS,
    DELEGATE,
    DENY,
    Entry,
    RoutingConfig,
)
from marque.harbour.routing.overlap import Other, Point, resource_atoms
from marque.preview_caveats import caveat_codes

__all__ = ["NO_MATCH", "TupleDecision", "Decision", "evaluate", "evaluate_accesses",
           "evaluate_effects", "EFFECT_OPERATIONS", "require_permitted", "within_caps",
           "approvals_with_caveats"]

#: The operation each Effect Set member kind is routed as (DESIGN §7, §11.3).
EFFECT_OPERATIONS: Final = {"create": "write", "update": "write", "upsert": "write",
                            "delete": "write", "command": "other"}

#: The outcome recorded for a tuple that no entry selects.
NO_MATCH: Final = "no_match"
_CODE_DENIED: Final = "account_denied"
_CODE_NO_MATCH: Final = "account_no_match"
# Worse first: how tuple outcomes combine.
_SEVERITY = {DENY: 3, NO_MATCH: 2, DELEGATE: 1, ALLOW: 0}


@dataclass(frozen=True)
class _Terms:
    """A delegate's terms; ``combine`` keeps the strictest of two."""

    approvals: int = 0
    self_approval: bool = True
    max_ttl_seconds: int | None = None
    caveats: str = CAVEATS_SHOW

    def combine(self, other: _Terms) -> _Terms:
        ttls = [t for t in (self.max_ttl_seconds, other.max_ttl_seconds) if t is not None]
        return _Terms(
            approvals=max(self.approvals, other.approvals),
            self_approval=self.self_approval and other.self_approval,
            max_ttl_seconds=min(ttls) if ttls else None,
            caveats=(CAVEATS_TWO_APPROVERS if CAVEATS_TWO_APPROVERS in
                     (self.caveats, other.caveats) else CAVEATS_SHOW),
        )

    @classmethod
    def of(cls, entry: Entry) -> _Terms:
        return cls(entry.approvals, entry.self_approval, entry.max_ttl_seconds, entry.caveats)


@dataclass(frozen=True)
class TupleDecision:
    """One tuple of one statement, the entries that selected it, and its outcome.

    ``outcome`` is ``allow``, ``deny``, ``delegate`` or ``no_match``;
    ``entries`` are the indexes of every entry that selected the tuple (for a
    ``"*"`` resource: that selected it for some resource).
    """

    statement: int
    operation: str
    resource: str
    outcome: str
    entries: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored with a request."""
        return {"statement": self.statement, "operation": self.operation,
                "resource": self.resource, "outcome": self.outcome,
                "entries": list(self.entries)}


@dataclass(frozen=True)
class Decision:
    """The routing decision for one request: what happens, why, and under which config.

    ``outcome`` is ``allow``, ``deny`` or ``delegate``; ``code`` is ``None``,
    ``"account_denied"`` or ``"account_no_match"`` (both with outcome
    ``deny``). ``approvals``, ``self_approval`` and ``max_ttl_seconds`` are the
    delegate's terms (0, False, None otherwise). ``all_read`` says every tuple
    is a read, so the change must be issued with ``"access": "read_only"``.
    """

    outcome: str
    code: str | None
    approvals: int
    self_approval: bool
    max_ttl_seconds: int | None
    config_cid: str
    principal: str
    target: str
    tuples: tuple[TupleDecision, ...]
    all_read: bool
    #: A delegate's policy for a preview with caveats (``show`` or ``two_approvers``).
    caveats: str = CAVEATS_SHOW
    #: The strictest budget caps of the entries involved (None: no cap), and, for a
    #: request denied because its budget asks more, why (:func:`within_caps`).
    max_rows: int | None = None
    max_executions: int | None = None
    over_cap: str | None = None

    @property
    def permitted(self) -> bool:
        """Whether the request may go on (allowed, or delegated for approval)."""
        return self.outcome != DENY

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored with a request and shown to people, exactly as decided."""
        return {
            "outcome": self.outcome,
            "code": self.code,
            "approvals": self.approvals,
            "self_approval": self.self_approval,
            "max_ttl_seconds": self.max_ttl_seconds,
            "config_cid": self.config_cid,
            "principal": self.principal,
            "target": self.target,
            "all_read": self.all_read,
            "caveats": self.caveats,
            "tuples": [t.to_dict() for t in self.tuples],
            # Only when set: a decision without caps is stored exactly as before them.
            **{key: value for key, value in (("max_rows", self.max_rows),
                                             ("max_executions", self.max_executions),
                                             ("over_cap", self.over_cap))
               if value is not None},
        }


def _decide_point(entries: Sequence[Entry], point: Point) -> tuple[str, tuple[int, ...], _Terms]:
    matched = [e for e in entries if e.contains(point)]
    if not matched:
        return NO_MATCH, (), _Terms()
    outcomes = {e.outcome for e in matched}
    if len(outcomes) > 1:
        # parse_config refuses such a config; meeting one here means it was built by hand.
        raise AccountConfigInvalid(
            f"entries {[e.index for e in matched]} select one tuple with different outcomes"
        )
    terms = _Terms()
    for entry in matched:
        if entry.outcome == DELEGATE:
            terms = terms.combine(_Terms.of(entry))
    return outcomes.pop(), tuple(e.index for e in matched), terms


def _decide_tuple(
    config: RoutingConfig, principal: str, target: str, access: Access
) -> tuple[str, tuple[int, ...], _Terms]:
    resources: list[str | Other]
    if access.resource == ANY_RESOURCE:
        resources = resource_atoms([e.region for e in config.entries])
    else:
        resources = [access.resource]
    worst = ALLOW
    matched: set[int] = set()
    terms = _Terms()
    for resource in resources:
        outcome, indexes, point_terms = _decide_point(
            config.entries, (principal, target, resource, access.operation)
        )
        matched.update(indexes)
        if _SEVERITY[outcome] > _SEVERITY[worst]:
            worst = outcome
        if outcome == DELEGATE:
            terms = terms.combine(point_terms)
    return worst, tuple(sorted(matched)), terms


def evaluate_accesses(
    config: RoutingConfig,
    principal: str,
    target: str,
    accesses_per_statement: Sequence[Sequence[Access]],
) -> Decision:
    """The :class:`Decision` for already-classified statements (one tuple list per statement)."""
    if not isinstance(principal, str) or not principal:
        raise InvalidInput("routing needs the principal's name")
    if not isinstance(target, str) or not target:
        raise InvalidInput("routing needs a target name")
    if not accesses_per_statement or any(not a for a in accesses_per_statement):
        raise InvalidInput("routing needs at least one statement, each with at least one tuple")
    tuples: list[TupleDecision] = []
    terms = _Terms()
    worst = ALLOW
    for index, accesses in enumerate(accesses_per_statement):
        for access in accesses:
            outcome, entries, tuple_terms = _decide_tuple(config, principal, target, access)
            tuples.append(TupleDecision(index, access.operation, access.resource, outcome,
                                        entries))
            if _SEVERITY[outcome] > _SEVERITY[worst]:
                worst = outcome
            if outcome == DELEGATE:
                terms = terms.combine(tuple_terms)
    all_read = all(t.operation == READ for t in tuples)
    caps = _caps(config, tuples)
    if worst in (DENY, NO_MATCH):
        code = _CODE_DENIED if worst == DENY else _CODE_NO_MATCH
        return Decision(DENY, code, 0, False, None, config.config_cid, principal, target,
                        tuple(tuples), all_read)
    if worst == DELEGATE:
        return Decision(DELEGATE, None, terms.approvals, terms.self_approval,
                        terms.max_ttl_seconds, config.config_cid, principal, target,
                        tuple(tuples), all_read, terms.caveats,
                        max_rows=caps.get("max_rows"), max_executions=caps.get("max_executions"))
    return Decision(ALLOW, None, 0, False, None, config.config_cid, principal, target,
                    tuple(tuples), all_read, max_rows=caps.get("max_rows"),
                    max_executions=caps.get("max_executions"))


def _caps(config: RoutingConfig, tuples: Sequence[TupleDecision]) -> dict[str, int]:
    """The smallest ``max_rows`` and ``max_executions`` any entry selecting a tuple sets."""
    caps: dict[str, int] = {}
    for key in ("max_rows", "max_executions"):
        values = [getattr(entry, key) for entry in config.entries
                  if any(entry.index in t.entries for t in tuples)
                  and getattr(entry, key) is not None]
        if values:
            caps[key] = min(values)
    return caps


def within_caps(decision: Decision, max_rows: int, executions: int) -> Decision:
    """``decision``, or a deny (``account_denied``, ``over_cap`` saying why) when a request's
    budget asks more rows or executions than the entries that route it allow."""
    if not decision.permitted:
        return decision
    over = []
    if decision.max_rows is not None and max_rows > decision.max_rows:
        over.append(f"max_rows {max_rows} is over the routing cap of {decision.max_rows}")
    if decision.max_executions is not None and executions > decision.max_executions:
        over.append(f"executions {executions} is over the routing cap of "
                    f"{decision.max_executions}")
    if not over:
        return decision
    return replace(decision, outcome=DENY, code=_CODE_DENIED, approvals=0,
                   self_approval=False, max_ttl_seconds=None, over_cap="; ".join(over))


def evaluate(
    config: RoutingConfig,
    principal: str,
    target: str,
    statements_sql: Sequence[str],
    dialect: str,
) -> Decision:
    """Route a request: classify each statement in ``dialect``, then decide (module docstring).

    Returns the :class:`Decision` whatever it is, refusals included; call
    :func:`require_permitted` to raise the typed error for a refusal.
    """
    if isinstance(statements_sql, str):
        raise InvalidInput("statements_sql must be a sequence of statements, not one string")
    return evaluate_accesses(
        config, principal, target, [classify(sql, dialect) for sql in statements_sql]
    )


def evaluate_effects(
    config: RoutingConfig,
    principal: str,
    target: str,
    members: Sequence[tuple[str, str]],
    dialect: str,
) -> Decision:
    """Route an Effect Set: one tuple per member ``(kind, table)`` — its table as the resource
    (:func:`~marque.harbour.routing.classify.table_resource`) and its kind's operation
    (:data:`EFFECT_OPERATIONS`) — combined exactly as statements are (a tuple's
    ``statement`` is the member's index). Never ``all_read``: an Effect Set always writes
    or commands."""
    accesses = []
    for kind, table in members:
        if kind not in EFFECT_OPERATIONS:
            raise InvalidInput(f"unknown Effect Set member kind {kind!r}")
        accesses.append([Access(EFFECT_OPERATIONS[kind], table_resource(table, dialect))])
    return evaluate_accesses(config, principal, target, accesses)


def approvals_with_caveats(decision: Decision, preview: Any) -> Decision:
    """The decision a delegated request's Checkpoint is sealed with once its preview is
    known: ``approvals`` raised to at least 2 when the decision says
    ``caveats = "two_approvers"`` and the preview names any caveat
    (:func:`~marque.preview_caveats.caveat_codes`); otherwise ``decision`` itself."""
    if decision.outcome == DELEGATE and decision.caveats == CAVEATS_TWO_APPROVERS \
            and caveat_codes(preview) and decision.approvals < 2:
        return replace(decision, approvals=2)
    return decision


def require_permitted(decision: Decision) -> Decision:
    """Return ``decision`` if it allows or delegates; raise its typed refusal otherwise.

    :class:`AccountDenied` for an explicit deny, :class:`AccountNoMatch` when
    some tuple matched no entry; the error's ``detail`` is the decision.
    """
    if decision.outcome != DENY:
        return decision
    if decision.over_cap is not None:
        raise AccountDenied(
            f"denied by routing config {decision.config_cid} for {decision.principal} on "
            f"{decision.target}: the budget asks too much ({decision.over_cap}); ask for a "
            "smaller budget", detail=decision.to_dict())
    refused = [t for t in decision.tuples if t.outcome in (DENY, NO_MATCH)]
    shown = ", ".join(
        f"statement {t.statement}: {t.operation} on {t.resource}"
        + (f" (entry {list(t.entries)})" if t.entries else "")
        for t in refused
        if (t.outcome == DENY) == (decision.code == _CODE_DENIED)
    )
    if decision.code == _CODE_DENIED:
        raise AccountDenied(
            f"denied by routing config {decision.config_cid} for {decision.principal} on "
            f"{decision.target}: {shown}", detail=decision.to_dict(),
        )
    raise AccountNoMatch(
        f"no entry of routing config {decision.config_cid} matches {decision.principal} on "
        f"{decision.target} for: {shown}", detail=decision.to_dict(),
    )
