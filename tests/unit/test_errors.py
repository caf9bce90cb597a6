"""Every stable code of DESIGN §9 is one registered error class with the right exit status."""

from __future__ import annotations

import pytest

from marque import errors

DESIGN_CODES = {
    "marque_invalid": 3, "marque_expired": 3, "marque_not_yet_valid": 3, "wrong_pilot": 3,
    "wrong_incarnation": 3, "unknown_target": 3, "pop_missing": 3, "pop_invalid": 3,
    "pop_replayed": 3, "pop_key_mismatch": 3, "budget_exhausted": 3, "attempts_exhausted": 3,
    "max_rows_exceeded": 4, "guard_failed": 4, "statement_error": 4,
    "serialization_failure": 4, "statement_timeout": 4, "lease_expired": 5,
    "commit_unknown": 5, "conflict": 2,
    # DESIGN §9, the control plane's and infrastructure's codes
    "ledger_unavailable": 7, "harbour_unavailable": 7, "pilot_unavailable": 7,
    "unauthenticated": 2, "forbidden": 2, "not_found": 2, "request_id_invalid": 2,
    "self_approval": 3, "revalidation_failed": 3, "account_denied": 3,
    "account_no_match": 3, "account_config_invalid": 3, "delegation_rejected": 3,
    "request_expired": 3, "target_unavailable": 4, "preview_failed": 4,
}
# Marque's own additions (documented in docs/errors.md).
OWN_CODES = {
    "input_invalid": 2, "config_invalid": 2, "ledger_exists": 2, "ledger_missing": 2,
    "home_mismatch": 2, "ledger_not_durable": 2, "nonce_reaped": 2, "ledger_corrupt": 7,
    "postgres_support_missing": 2,
    "owner_gone": 5, "pilot_lost": 5,
    "logbook_broken": 8,
    # a fault in a service itself, logged (docs/errors.md)
    "internal": 1,
    # Effect Sets (docs/effects.md)
    "effect_declaration_invalid": 2, "effect_input_invalid": 2, "effect_duplicate_identity": 2,
    "effect_max_items_exceeded": 2, "effect_preview_invalid": 2, "effect_receipt_invalid": 2,
    "reconciliation_invalid": 2, "resume_revalidation_failed": 3, "effect_unsupported": 3,
    "stale_preview": 4,
    # target identity (docs/model.md, "A target's identity")
    "target_replaced": 3, "target_unsettled": 2,
    # the services' router (docs/errors.md)
    "method_not_allowed": 2,
    # a Resolution repeated with another reason or decision (docs/errors.md)
    "already_approved": 2, "already_rejected": 2,
    # a Pilot's execution reports (docs/harbour-service.md)
    "report_signature_invalid": 2, "report_key_changed": 2,
    # the services' body limits (docs/harbour-service.md, docs/service.md: "Limits")
    "payload_too_large": 2,
    # an approval of a preview over its budget (docs/harbour.md, "Row images")
    "preview_over_budget": 3,
    # `marque undo` (docs/harbour.md, "Undo")
    "undo_unavailable": 3, "undo_conflict": 4,
    # a row key declared for a target table (docs/cli.md, `pilot target row-key`)
    "row_key_invalid": 2,
    # an endpoint that did not accept `harbour webhooks test` (docs/notifications.md)
    "webhook_delivery_failed": 7,
    # signing in through an identity provider (docs/console.md, "Signing in with OIDC")
    "oidc_config_invalid": 2, "oidc_login_refused": 2, "oidc_subject_unknown": 2,
    "token_login_disabled": 2, "oidc_provider_unavailable": 7,
}
HTTP = {"unauthenticated": 401, "forbidden": 403, "not_found": 404, "conflict": 409,
        "ledger_unavailable": 503, "budget_exhausted": 403, "input_invalid": 400,
        "target_replaced": 403, "target_unsettled": 409, "method_not_allowed": 405,
        "payload_too_large": 413, "undo_unavailable": 403, "undo_conflict": 422,
        "oidc_login_refused": 401, "oidc_subject_unknown": 403,
        "token_login_disabled": 403, "oidc_provider_unavailable": 503,
        "oidc_config_invalid": 400, "internal": 500}


@pytest.mark.parametrize(("code", "exit_status"), sorted({**DESIGN_CODES, **OWN_CODES}.items()))
def test_each_design_code_is_registered_once(code: str, exit_status: int) -> None:
    """lookup(code) finds a class carrying that code and the exit status DESIGN §9 gives it."""
    cls = errors.lookup(code)
    assert cls.code == code
    assert cls.exit_status == exit_status
    error = cls("why", sqlstate="40001")
    assert error.to_dict() == {"code": code, "message": "why", "sqlstate": "40001"}


def test_a_code_cannot_be_registered_twice() -> None:
    """Registering an existing code again is a TypeError at class creation."""
    with pytest.raises(TypeError):
        type("Again", (errors.Refusal,), {}, code="budget_exhausted")


def test_unknown_code_is_a_key_error() -> None:
    """lookup of a code nobody registered raises KeyError."""
    with pytest.raises(KeyError):
        errors.lookup("no_such_code")


def test_the_registry_holds_exactly_the_documented_codes() -> None:
    """No code is registered that the tables above (and docs/errors.md) do not name."""
    assert set(errors.MarqueError._registry) == set(DESIGN_CODES) | set(OWN_CODES)


@pytest.mark.parametrize(("code", "status"), sorted(HTTP.items()))
def test_http_status_follows_the_error_class(code: str, status: int) -> None:
    """DESIGN §10: the problem document's HTTP status is derived from the class."""
    assert errors.lookup(code).http_status == status
