"""The tools an agent sees: each one's name, description and JSON schema (docs/agents.md).

The descriptions are written for the model that reads them: what the tool
does, what comes back, and what to call next. Arguments are checked against
these schemas before anything is sent (:func:`check_arguments`), so a bad call
is answered ``input_invalid`` with the schema's own words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

from marque.errors import InvalidInput

__all__ = ["ToolSpec", "TOOLS", "TOOL_NAMES", "check_arguments", "QUERY_ROWS_MAX",
           "WAIT_SECONDS_MAX", "WAIT_SECONDS_DEFAULT", "LIST_LIMIT_MAX"]

#: The most rows a ``query`` may ask for (its budget's max_rows): more is never truncated.
QUERY_ROWS_MAX = 1000
#: ``wait_for_decision``'s longest and default wait (seconds).
WAIT_SECONDS_MAX = 300
WAIT_SECONDS_DEFAULT = 30
#: ``list_requests``' largest page.
LIST_LIMIT_MAX = 100


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, its description, its input schema, and whether it only reads."""

    name: str
    description: str
    schema: dict[str, Any]
    read_only: bool


_ID = {"type": "string", "minLength": 1, "maxLength": 256,
       "description": "The request's id (rq_…) as request_change returned it, or your own "
                      "request_id."}
_PARAMS = {"type": "array", "description": "Positional parameters of the statement (? or $1 "
           "placeholders), as JSON values.", "items": {}}
_STATEMENT = {"type": "object", "additionalProperties": False, "required": ["sql"],
              "properties": {"sql": {"type": "string", "minLength": 1}, "params": _PARAMS}}
_WHERE = {
    "pilot_id": {"type": "string", "minLength": 1,
                 "description": "The Pilot that runs it (default: the server's --pilot-id)."},
    "target": {"type": "string", "minLength": 1,
               "description": "The target database as the Pilot names it (default: the "
                              "server's --target)."},
}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": required}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("query", (
        "Run a read-only SQL query (SELECT) on a target database and get its rows. It goes "
        "through the Harbourmaster's routing like every change: a read the routing allows "
        "runs at once, inside a transaction the database itself keeps read-only, so a "
        "function that writes fails instead of writing. At most max_rows rows come back; a "
        "query returning more is refused whole (max_rows_exceeded), never cut short: narrow "
        "it or raise max_rows. A query the routing does not allow at once is answered with "
        "its request and what to do next (it may wait for a human, like request_change)."),
        _object({"sql": {"type": "string", "minLength": 1,
                         "description": "One SELECT statement."},
                 "params": _PARAMS, **_WHERE,
                 "max_rows": {"type": "integer", "minimum": 1, "maximum": QUERY_ROWS_MAX,
                              "default": 100, "description": "The most rows it may return."},
                 "request_id": {"type": "string", "minLength": 1, "maxLength": 256,
                                "description": "Your id for this query, to retry it safely "
                                               "(default: a new one)."}},
                ["sql"]), True),
    ToolSpec("request_change", (
        "Ask for a change to a database: SQL statements, or an Effect Set (row-level "
        "create/update/upsert/delete). It returns at once — it never waits for a human — "
        "with the request's id, the routing decision (allow, delegate to N human approvers, "
        "or deny), the exact preview (rows each statement touches, each changed row before "
        "and after, and caveats), and next_step. A delegated change waits for a human "
        "approver: call wait_for_decision, then execute once it is prepared. Retrying with "
        "the same request_id and the same change answers the same request, never a second "
        "one; the same request_id with a different change is refused (conflict). You can "
        "never approve your own change."),
        _object({"request_id": {"type": "string", "minLength": 1, "maxLength": 256,
                                "description": "Your id for this change: your retry key."},
                 "reason": {"type": "string", "minLength": 1, "maxLength": 4096,
                            "description": "Why this change is needed: the human approver "
                                           "reads it."},
                 "statements": {"type": "array", "minItems": 1, "items": _STATEMENT,
                                "description": "The SQL statements, run in order in one "
                                               "transaction. Give this or effect_set."},
                 "effect_set": {"type": "object", "required": ["declaration", "inputs"],
                                "description": "An Effect Set: {declaration, inputs} as "
                                               "docs/effects.md describes. Give this or "
                                               "statements."},
                 **_WHERE,
                 "max_rows": {"type": "integer", "minimum": 1,
                              "description": "The most rows one execution may touch; more "
                                             "aborts it untouched."},
                 "executions": {"type": "integer", "minimum": 1, "default": 1,
                                "description": "How many times the approved change may run."},
                 "ttl_seconds": {"type": "integer", "minimum": 1, "default": 3600,
                                 "description": "How long the approved marque stays valid."}},
                ["request_id", "reason", "max_rows"]), False),
    ToolSpec("get_request", (
        "One of your requests as it is now: its state, routing decision, preview, the "
        "humans' approvals and rejections (with their reasons), its executions and their "
        "outcomes, and next_step."),
        _object({"id": _ID}, ["id"]), True),
    ToolSpec("wait_for_decision", (
        "Wait until a human has decided on your request (approved, rejected, or it expired), "
        "or until timeout_seconds pass, then answer its state. decided=false means nobody "
        "has decided yet: call it again later (it holds no lock and costs nothing while it "
        "waits). Once the state is prepared, call execute."),
        _object({"id": _ID,
                 "timeout_seconds": {"type": "integer", "minimum": 1,
                                     "maximum": WAIT_SECONDS_MAX,
                                     "default": WAIT_SECONDS_DEFAULT,
                                     "description": "The longest wait, in seconds."}},
                ["id"]), True),
    ToolSpec("execute", (
        "Run your approved change (a request in state prepared) through its Pilot, exactly "
        "as it was approved, and answer the outcome: applied, aborted_not_applied (nothing "
        "changed), indeterminate (unknown yet: a human must look; never retry with a new "
        "attempt), or in_progress. The execution nonce is derived from the request and "
        "attempt, so calling execute again with the same attempt never runs it twice: it "
        "answers the recorded outcome (replayed=true). Use attempt 2, 3, … only for a "
        "change approved for several executions, to run it once more."),
        _object({"id": _ID,
                 "attempt": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1,
                             "description": "Which execution of the marque this is (1 for "
                                            "the first; the same number is a retry)."}},
                ["id"]), False),
    ToolSpec("list_requests", (
        "Your requests, newest first (only yours: an agent never sees another principal's), "
        "optionally in one state: preparing, awaiting_approval, prepared, executing, "
        "verified, reconciliation, failed, rejected, expired."),
        _object({"state": {"type": "string", "minLength": 1},
                 "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX,
                           "default": 20}}, []), True),
)
TOOL_NAMES = frozenset(tool.name for tool in TOOLS)
_BY_NAME = {tool.name: tool for tool in TOOLS}


def check_arguments(name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments of a call to ``name``, checked against its schema (``input_invalid``
    naming the first violation, or an unknown tool)."""
    tool = _BY_NAME.get(name)
    if tool is None:
        raise InvalidInput(f"no tool {name[:64]!r}: the tools are {', '.join(sorted(TOOL_NAMES))}")
    given = dict(arguments or {})
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(tool.schema).iter_errors(given))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "arguments"
        raise InvalidInput(f"{name}: {where}: {error.message}", detail={"tool": name,
                                                                         "where": where})
    return given
