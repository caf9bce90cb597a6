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
}


@pytest.mark.parametrize(("code", "exit_status"), sorted(DESIGN_CODES.items()))
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
