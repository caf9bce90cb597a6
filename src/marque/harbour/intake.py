"""Reading what callers send the Harbourmaster: a request, a Pilot's registration, reports.

Each reader checks a JSON body member by member and returns typed values, or
raises :class:`~marque.errors.InvalidInput` (``RequestIdInvalid`` for the
request id) naming the member — before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marque.change import Budget, Change, Guard, Statement, is_json_int
from marque.effects.request import EffectSetSubmission
from marque.errors import InvalidInput, RequestIdInvalid
from marque.harbour.effect_requests import EffectSetRequest
from marque.harbour.executions import REPORTED_STATUSES
from marque.harbour.request_change import RequestChange
from marque.harbour.routing import DIALECTS
from marque.harbour.statement_requests import StatementRequest
from marque.request_ids import resolve_request_id

_REQUEST_KEYS = frozenset({"request_id", "pilot_id", "target", "change", "budget",
                           "ttl_seconds", "reason", "rolls_back"})
_CHANGE_KEYS = frozenset({"statements", "guards", "isolation", "statement_timeout_ms"})
_BUDGET_KEYS = frozenset({"executions", "max_rows", "attempts_per_nonce"})
_PILOT_KEYS = frozenset({"pilot_id", "url", "incarnation", "targets"})
_PILOT_OPTIONAL_KEYS = frozenset({"report_key"})
_REPORT_KEYS = frozenset({"marque_id", "nonce", "attempt", "status", "rows_affected", "error",
                          "pilot", "cause", "effect_set", "signature"})
#: Reports accepted in one delivery.
MAX_REPORTS = 1000
#: The longest reason an approval, a rejection or an expiry may carry (as a request's own).
REASON_CHARS = 4096


def bounded_reason(reason: str | None) -> str | None:
    """``reason``, if it is no longer than :data:`REASON_CHARS`; else ``input_invalid``."""
    if reason is not None and len(reason) > REASON_CHARS:
        raise InvalidInput(f"a reason is at most {REASON_CHARS} characters; this one has "
                           f"{len(reason)}", detail={"limit": REASON_CHARS})
    return reason


@dataclass(frozen=True)
class Submission:
    """A checked ``POST /v1/requests`` body."""

    request_id: str
    pilot_id: str
    target: str
    #: Statements, or an Effect Set (its declaration and captured inputs, DESIGN §7).
    change: RequestChange
    budget: Budget
    ttl_seconds: int
    reason: str | None
    rolls_back: str | None


def _object(value: Any, where: str, keys: frozenset[str],
            required: frozenset[str] = frozenset()) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must be a JSON object")
    unknown = sorted(str(k) for k in value.keys() - keys)
    if unknown:
        raise InvalidInput(f"{where} has unknown member(s) {', '.join(unknown)}")
    missing = sorted(required - value.keys())
    if missing:
        raise InvalidInput(f"{where} lacks member(s) {', '.join(missing)}")
    return value


def _text(value: Any, where: str, *, optional: bool = False, limit: int = 1024) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInput(f"{where} must be non-blank text of at most {limit} characters")
    return value


def _params(value: Any, where: str) -> tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput(f"{where}.params must be a list of JSON scalars")
    return tuple(value)


def read_change(value: Any) -> RequestChange:
    """``{statements: [{sql, params, expect_rows?}], guards?, isolation?,
    statement_timeout_ms?}``, or ``{effect_set: {declaration, inputs, strength?}}`` (an
    Effect Set request)."""
    if isinstance(value, Mapping) and "effect_set" in value:
        data = _object(value, "change", frozenset({"effect_set"}), frozenset({"effect_set"}))
        return EffectSetRequest(EffectSetSubmission.from_json(data["effect_set"], InvalidInput))
    data = _object(value, "change", _CHANGE_KEYS, frozenset({"statements"}))
    statements = data["statements"]
    if not isinstance(statements, list) or not statements:
        raise InvalidInput("change.statements must be a non-empty list")
    built = []
    for index, item in enumerate(statements):
        where = f"change.statements[{index}]"
        item = _object(item, where, frozenset({"sql", "params", "expect_rows"}),
                       frozenset({"sql"}))
        built.append(Statement(item["sql"], _params(item.get("params"), where),
                               item.get("expect_rows")))
    guards = data.get("guards") or []
    if not isinstance(guards, list):
        raise InvalidInput("change.guards must be a list")
    checks = []
    for index, item in enumerate(guards):
        where = f"change.guards[{index}]"
        item = _object(item, where, frozenset({"sql", "params", "expect", "when"}),
                       frozenset({"sql"}))
        checks.append(Guard(item["sql"], _params(item.get("params"), where),
                            item.get("expect", True), item.get("when", "before")))
    return StatementRequest(Change(tuple(built), tuple(checks),
                                   data.get("isolation", "read_committed"),
                                   data.get("statement_timeout_ms")))


def read_budget(value: Any) -> Budget:
    """``{executions, max_rows, attempts_per_nonce?}``."""
    data = _object(value, "budget", _BUDGET_KEYS, frozenset({"executions", "max_rows"}))
    return Budget(data["executions"], data["max_rows"], data.get("attempts_per_nonce", 3))


def read_submission(body: Any, idempotency_key: str | None) -> Submission:
    """Check a ``POST /v1/requests`` body; the request id comes from it and/or the header."""
    data = _object(body, "the request body", _REQUEST_KEYS,
                   frozenset({"pilot_id", "target", "change", "budget", "ttl_seconds"}))
    request_id = resolve_request_id(data.get("request_id"), idempotency_key)
    if request_id is None:
        raise RequestIdInvalid(
            "give the request an id: request_id in the body or an Idempotency-Key header "
            "(a retried request with the same id is answered, never made twice)",
            detail={"rule": "missing"})
    ttl = data["ttl_seconds"]
    if not is_json_int(ttl) or ttl <= 0:
        raise InvalidInput("ttl_seconds must be a positive whole number of seconds")
    return Submission(
        request_id=request_id,
        pilot_id=str(_text(data["pilot_id"], "pilot_id", limit=128)),
        target=str(_text(data["target"], "target", limit=128)),
        change=read_change(data["change"]),
        budget=read_budget(data["budget"]),
        ttl_seconds=int(ttl),
        reason=_text(data.get("reason"), "reason", optional=True, limit=4096),
        rolls_back=_text(data.get("rolls_back"), "rolls_back", optional=True, limit=128),
    )


@dataclass(frozen=True)
class Registration:
    """A checked ``POST /v1/pilots`` body."""

    pilot_id: str
    url: str
    incarnation: str
    dialects: dict[str, str]
    #: The public JWK the Pilot signs its reports with (None from a Pilot that sends none).
    report_key: dict[str, Any] | None


def read_registration(body: Any) -> Registration:
    """``{pilot_id, url, incarnation, targets: {name: {dialect}}, report_key?}`` → its parts.

    ``report_key`` must be a public Ed25519 JWK (``{kty: OKP, crv: Ed25519, x}``
    and at most ``kid`` and ``alg`` besides); it is kept as those members.
    """
    data = _object(body, "the registration", _PILOT_KEYS | _PILOT_OPTIONAL_KEYS, _PILOT_KEYS)
    pilot_id = str(_text(data["pilot_id"], "pilot_id", limit=128))
    url = str(_text(data["url"], "url", limit=2048))
    if not url.startswith(("http://", "https://")):
        raise InvalidInput("url must be the Pilot service's http:// or https:// address")
    incarnation = str(_text(data["incarnation"], "incarnation", limit=256))
    targets = data["targets"]
    if not isinstance(targets, Mapping) or not targets:
        raise InvalidInput("targets must map each target's name to {dialect}")
    dialects: dict[str, str] = {}
    for name, spec in targets.items():
        _text(name, "a target's name", limit=128)
        spec = _object(spec, f"targets.{name}", frozenset({"dialect"}), frozenset({"dialect"}))
        if spec["dialect"] not in DIALECTS:
            raise InvalidInput(f"targets.{name}.dialect must be one of {', '.join(DIALECTS)}")
        dialects[str(name)] = str(spec["dialect"])
    return Registration(pilot_id, url, incarnation, dialects,
                        report_key_of(data.get("report_key")))


def report_key_of(jwk: Any) -> dict[str, Any] | None:
    """A Pilot's public report key as kept (``kid`` its thumbprint); None for None;
    ``InvalidInput`` for anything but a public Ed25519 JWK."""
    from marque.token.keys import ed25519_public, import_public, thumbprint

    if jwk is None:
        return None
    if not isinstance(jwk, Mapping) or "d" in jwk:
        raise InvalidInput("report_key must be a public JWK (no private member d)")
    unknown = sorted(str(k) for k in set(jwk) - {"kty", "crv", "x", "kid", "alg"})
    if unknown:
        raise InvalidInput(f"report_key has unknown member(s) {', '.join(unknown)}")
    members = dict(ed25519_public(dict(jwk), InvalidInput, "report_key"))
    import_public(members, InvalidInput, "report_key")
    # Kept as its thumbprint names it: the signer's kid is that thumbprint.
    return {**members, "kid": thumbprint(members)}


def read_reports(body: Any) -> tuple[str, list[dict[str, Any]]]:
    """``{pilot_id, reports: [outbox payload]}`` → the pilot id and the checked payloads."""
    data = _object(body, "the delivery", frozenset({"pilot_id", "reports"}),
                   frozenset({"pilot_id", "reports"}))
    pilot_id = str(_text(data["pilot_id"], "pilot_id", limit=128))
    reports = data["reports"]
    if not isinstance(reports, list) or len(reports) > MAX_REPORTS:
        raise InvalidInput(f"reports must be a list of at most {MAX_REPORTS} reports")
    checked = []
    for index, item in enumerate(reports):
        where = f"reports[{index}]"
        report = _object(item, where, _REPORT_KEYS,
                         frozenset({"marque_id", "nonce", "attempt", "status", "pilot"}))
        _text(report["marque_id"], f"{where}.marque_id", limit=128)
        _text(report["nonce"], f"{where}.nonce", limit=256)
        if not is_json_int(report["attempt"]) or report["attempt"] < 1:
            raise InvalidInput(f"{where}.attempt must be a whole number of at least 1")
        if report["status"] not in REPORTED_STATUSES:
            raise InvalidInput(f"{where}.status must be one of "
                               f"{', '.join(sorted(REPORTED_STATUSES))}")
        pilot = report["pilot"]
        if not isinstance(pilot, Mapping) or not isinstance(pilot.get("id"), str) \
                or not isinstance(pilot.get("incarnation"), str):
            raise InvalidInput(f"{where}.pilot must be {{id, incarnation}}")
        signature = report.get("signature")
        if "signature" in report and (not isinstance(signature, str) or not signature):
            raise InvalidInput(f"{where}.signature must be the Pilot's compact JWS of the "
                               "report, or absent")
        effect_set = report.get("effect_set")
        if effect_set is not None and not isinstance(effect_set, Mapping):
            raise InvalidInput(f"{where}.effect_set must be an object (an Effect Set "
                               "attempt's summary and set receipt) or absent")
        checked.append(dict(report))
    return pilot_id, checked
