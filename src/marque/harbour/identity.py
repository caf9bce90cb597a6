"""Logical request identity (DESIGN §11.1): who asked, under which caller id, for what.

A caller retries a request by sending the same caller request id again. The
Harbourmaster must then recognise the *same* request (same scope, same intent)
and refuse a *different* one reusing the id (same scope, other intent). Both
sides of that comparison are CIDs over closed preimages, written here once:

* the **scope** — ``logical_request_scope`` over ``authority_scope_cid`` (the
  Harbourmaster and the principal's unique name) and the caller request id;
* the **intent** — ``intent_fingerprint`` over the program (pilot, target,
  statement texts, guards, isolation, timeout, budget, ttl), the parameter
  values, and the caller input intent (``NO_INPUT_INTENT``: a statement
  request captures no input).

An **Effect Set request** (DESIGN §7) has its own program preimage,
``marque-effect-request-program/0.1``, binding the declaration by its CID
(``EffectSetDeclaration.declaration_cid``, which leaves out the members'
``input`` file names) and the strength asked per member; its parameters are
the empty list (``params: []``: an Effect Set has no statement parameters);
and its ``caller_input_intent_cid`` is the captured inputs'
(``marque-caller-input-intent/0.1``, docs/effects.md) — never
``NO_INPUT_INTENT``. So a changed input value, member or strength is another
intent (``conflict`` under the same request id), while the same declaration
and relations sent again — from JSON or CSV, rows in any order — are the same.

How the change is split between the two intent parts: ``statements`` in the
program preimage is the list of SQL texts, and every statement's parameters go
only into ``parameter_values_cid`` (one list per statement, in order). Guards
are part of the program: each appears as its full claim ``{sql, params, expect,
when}`` (:meth:`marque.change.Guard.to_claim`) — a guard's parameters are part
of the check it states, like its ``expect``, and the §11.1 parameter preimage
names statement parameters only. Nothing else enters: not the ``reason``, not
the routing decision, not the ``access`` mode routing derives, not clocks.

Caller request ids are checked before anything is built from them, and are
refused rather than normalised: a stored id is exactly what the caller sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marque.change import Budget, Change, Guard
from marque.cid import cid
from marque.effects.request import EffectSetSubmission
from marque.request_ids import check_request_id

__all__ = [
    "NO_INPUT_INTENT",
    "RequestIdentity",
    "authority_scope_cid",
    "logical_request_scope",
    "program_definition_cid",
    "parameter_values_cid",
    "intent_fingerprint",
    "request_identity",
    "effect_program_definition_cid",
    "effect_request_identity",
]

AUTHORITY_SCOPE_VERSION = "marque-authority-scope/0.1"
LOGICAL_REQUEST_VERSION = "actql-logical-request/0.1"
PROGRAM_VERSION = "marque-request-program/0.1"
EFFECT_PROGRAM_VERSION = "marque-effect-request-program/0.1"
PARAMETERS_VERSION = "marque-request-parameters/0.1"
CALLER_INPUT_INTENT_VERSION = "actql-caller-input-intent/0.1"
INTENT_VERSION = "actql-logical-request-intent/0.1"

#: ``caller_input_intent_cid`` of a request that selects no caller input (seed 002's NoInputIntent).
NO_INPUT_INTENT = cid({"version": CALLER_INPUT_INTENT_VERSION, "selection": "none"})


# -- the §11.1 preimages --------------------------------------------------------------


def authority_scope_cid(harbour_id: str, principal: str) -> str:
    """``CID({version: "marque-authority-scope/0.1", harbour_id, principal})``.

    ``principal`` is the principal's unique name: the authenticated authority,
    never something the request body says.
    """
    return cid({"version": AUTHORITY_SCOPE_VERSION, "harbour_id": harbour_id,
                "principal": principal})


def logical_request_scope(authority_scope_cid: str, caller_request_id: str) -> str:
    """``CID({version: "actql-logical-request/0.1", authority_scope_cid, caller_request_id})``.

    The caller request id is checked first (:func:`check_request_id`).
    """
    return cid({
        "version": LOGICAL_REQUEST_VERSION,
        "authority_scope_cid": authority_scope_cid,
        "caller_request_id": check_request_id(caller_request_id),
    })


def program_definition_cid(
    pilot_id: str,
    target: str,
    statements: Sequence[str],
    guards: Sequence[Guard],
    isolation: str,
    statement_timeout_ms: int | None,
    budget: Budget,
    ttl_seconds: int,
    expect_rows: Sequence[int | None] | None = None,
) -> str:
    """``CID({version: "marque-request-program/0.1", pilot_id, target, statements, guards,
    isolation, statement_timeout_ms, budget, ttl_seconds})``, and ``expect_rows`` (one
    count or null per statement) only when some statement fences its row count, so every
    other request keeps the fingerprint it always had.

    ``statements`` are the SQL texts only (their parameters belong to
    :func:`parameter_values_cid`); ``guards`` appear as their full claims
    ``{sql, params, expect, when}``; ``budget`` as ``{executions, max_rows,
    attempts_per_nonce}``; ``statement_timeout_ms`` may be ``None`` (JSON null).
    """
    preimage: dict[str, Any] = {
        "version": PROGRAM_VERSION,
        "pilot_id": pilot_id,
        "target": target,
        "statements": list(statements),
        "guards": [guard.to_claim() for guard in guards],
        "isolation": isolation,
        "statement_timeout_ms": statement_timeout_ms,
        "budget": budget.to_claim(),
        "ttl_seconds": ttl_seconds,
    }
    if expect_rows is not None and any(n is not None for n in expect_rows):
        preimage["expect_rows"] = list(expect_rows)
    return cid(preimage)


def parameter_values_cid(params_per_statement: Sequence[Sequence[Any]]) -> str:
    """``CID({version: "marque-request-parameters/0.1", params: [[…] per statement]})``."""
    return cid({
        "version": PARAMETERS_VERSION,
        "params": [list(params) for params in params_per_statement],
    })


def intent_fingerprint(
    caller_input_intent_cid: str, parameter_values_cid: str, program_definition_cid: str
) -> str:
    """``CID({version: "actql-logical-request-intent/0.1", caller_input_intent_cid,
    parameter_values_cid, program_definition_cid})``."""
    return cid({
        "version": INTENT_VERSION,
        "caller_input_intent_cid": caller_input_intent_cid,
        "parameter_values_cid": parameter_values_cid,
        "program_definition_cid": program_definition_cid,
    })


@dataclass(frozen=True)
class RequestIdentity:
    """Every §11.1 CID of one request: its scope (what it is) and its intent (what it asks)."""

    caller_request_id: str
    authority_scope_cid: str
    logical_request_scope: str
    program_definition_cid: str
    parameter_values_cid: str
    caller_input_intent_cid: str
    intent_fingerprint: str


def request_identity(
    harbour_id: str,
    principal: str,
    request_id: str,
    change: Change,
    budget: Budget,
    ttl_seconds: int,
    pilot_id: str,
    target: str,
) -> RequestIdentity:
    """The :class:`RequestIdentity` of a statement request; the request id is checked first."""
    caller_request_id = check_request_id(request_id)
    program = program_definition_cid(
        pilot_id,
        target,
        [statement.sql for statement in change.statements],
        change.guards,
        change.isolation,
        change.statement_timeout_ms,
        budget,
        ttl_seconds,
        [statement.expect_rows for statement in change.statements],
    )
    parameters = parameter_values_cid([statement.params for statement in change.statements])
    return _identity(harbour_id, principal, caller_request_id, program, parameters,
                     NO_INPUT_INTENT)


def _identity(harbour_id: str, principal: str, caller_request_id: str, program: str,
              parameters: str, intent: str) -> RequestIdentity:
    """The scope and fingerprint of a checked request id, over its program, parameters and
    caller input intent (§11.1): the same for statement and Effect Set requests."""
    authority = authority_scope_cid(harbour_id, principal)
    return RequestIdentity(
        caller_request_id=caller_request_id,
        authority_scope_cid=authority,
        logical_request_scope=logical_request_scope(authority, caller_request_id),
        program_definition_cid=program,
        parameter_values_cid=parameters,
        caller_input_intent_cid=intent,
        intent_fingerprint=intent_fingerprint(intent, parameters, program),
    )


def effect_program_definition_cid(
    pilot_id: str,
    target: str,
    declaration_cid: str,
    strength: Mapping[str, str],
    budget: Budget,
    ttl_seconds: int,
) -> str:
    """``CID({version: "marque-effect-request-program/0.1", pilot_id, target,
    declaration_cid, strength: {effect_id: full_diff | targeted}, budget, ttl_seconds})``:
    the program of an Effect Set request (its inputs are its caller input intent)."""
    return cid({
        "version": EFFECT_PROGRAM_VERSION,
        "pilot_id": pilot_id,
        "target": target,
        "declaration_cid": declaration_cid,
        "strength": {str(k): str(v) for k, v in sorted(strength.items())},
        "budget": budget.to_claim(),
        "ttl_seconds": ttl_seconds,
    })


def effect_request_identity(
    harbour_id: str,
    principal: str,
    request_id: str,
    submission: EffectSetSubmission,
    budget: Budget,
    ttl_seconds: int,
    pilot_id: str,
    target: str,
) -> RequestIdentity:
    """The :class:`RequestIdentity` of an Effect Set request (module docstring)."""
    caller_request_id = check_request_id(request_id)
    program = effect_program_definition_cid(
        pilot_id, target, submission.declaration.declaration_cid,
        {eid: s.value for eid, s in submission.strength.items()}, budget, ttl_seconds)
    return _identity(harbour_id, principal, caller_request_id, program,
                     parameter_values_cid([]), submission.caller_input_intent_cid)
