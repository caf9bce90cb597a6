"""Account authorization routing (DESIGN §11.3): who may do what, on which target, to what.

``config`` parses a TOML routing config into immutable entries (strictly, with
the symbolic overlap check of ``overlap``), ``classify`` turns SQL into
``(operation, resource)`` tuples with sqlglot, and ``decide`` evaluates a
request into a :class:`Decision` value that is stored as it is.
"""

from marque.harbour.routing.bootstrap import BOOTSTRAP_PROFILE, BOOTSTRAP_PROFILE_TOML
from marque.harbour.routing.classify import ANY_RESOURCE, DIALECTS, Access, classify
from marque.harbour.routing.config import (
    ALLOW,
    CONFIG_VERSION,
    DELEGATE,
    DENY,
    OUTCOMES,
    Entry,
    RoutingConfig,
    parse_config,
    parse_duration,
)
from marque.harbour.routing.decide import (
    NO_MATCH,
    Decision,
    TupleDecision,
    approvals_with_caveats,
    evaluate,
    evaluate_accesses,
    evaluate_effects,
    require_permitted,
    within_caps,
)
from marque.harbour.routing.overlap import OPERATIONS

__all__ = [
    "ALLOW",
    "ANY_RESOURCE",
    "BOOTSTRAP_PROFILE",
    "BOOTSTRAP_PROFILE_TOML",
    "CONFIG_VERSION",
    "DELEGATE",
    "DENY",
    "DIALECTS",
    "NO_MATCH",
    "OPERATIONS",
    "OUTCOMES",
    "Access",
    "Decision",
    "Entry",
    "RoutingConfig",
    "TupleDecision",
    "approvals_with_caveats",
    "classify",
    "evaluate",
    "evaluate_accesses",
    "evaluate_effects",
    "parse_config",
    "parse_duration",
    "require_permitted",
    "within_caps",
]
