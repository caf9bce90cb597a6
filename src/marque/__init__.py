"""Marque: preview, approve and execute database changes exactly once, within budget.

The public API is what ``__all__`` names (pinned by ``tests/unit/test_public_api.py``);
everything else is importable but may change between releases. Names are
resolved on first use, so ``import marque`` costs nothing (the CLI's start-up
time depends on it).

    from marque import open_pilot, make_proof

    pilot = open_pilot("./pilot")
    outcome = pilot.execute(token, make_proof(holder, token, nonce="n1",
                                              pilot_id=pilot.pilot_id), "n1")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public name → the module that defines it.
_EXPORTS = {
    # the Pilot
    "open_pilot": "marque.pilot",
    "Pilot": "marque.pilot",
    "Settings": "marque.pilot",
    # outcomes
    "Outcome": "marque.outcome",
    "Status": "marque.outcome",
    # the approved work and the capability that carries it
    "Change": "marque.change",
    "Statement": "marque.change",
    "Guard": "marque.change",
    "Budget": "marque.change",
    "issue_marque": "marque.token",
    "make_proof": "marque.token",
    "new_key": "marque.token",
    "public_jwk": "marque.token",
    "thumbprint": "marque.token",
    # errors (every class is in marque.errors; these are the ones callers catch)
    "MarqueError": "marque.errors",
    "UsageError": "marque.errors",
    "Refusal": "marque.errors",
    "NotApplied": "marque.errors",
    "Indeterminate": "marque.errors",
    "Unavailable": "marque.errors",
    # canonical identities (``marque.cid.cid`` computes a content id)
    "canonicalize": "marque.cid",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'marque' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
