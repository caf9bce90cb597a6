"""The pure parts of signing in through an identity provider: settings, claim checks, the
groups mapping and where a sign-in may return to."""

from __future__ import annotations

from typing import Any

import pytest

from marque.errors import OidcConfigInvalid, OidcLoginRefused
from marque.harbour.console.oidc import safe_next
from marque.harbour.oidc.config import RECHECK_SECONDS, OidcConfig, parse_group_role
from marque.harbour.oidc.tokens import LEEWAY_SECONDS, _check_claims
from marque.harbour.principals import Role

ISSUER = "https://idp.example"
NOW = 1_800_000_000.0


def config(**changes: Any) -> OidcConfig:
    base: dict[str, Any] = {"issuer": ISSUER, "client_id": "marque",
                            "client_secret_file": "/etc/marque/secret"}
    return OidcConfig(**{**base, **changes})


@pytest.mark.parametrize(("changes", "setting"), [
    ({"issuer": "http://idp.example"}, "issuer"),
    ({"issuer": "https://idp.example/?tenant=1"}, "issuer"),
    ({"issuer": "ftp://idp.example"}, "issuer"),
    ({"client_id": " "}, "client_id"),
    ({"client_secret_file": "relative/secret"}, "client_secret_file"),
    ({"subject_claim": "a b"}, "subject_claim"),
    ({"groups_claim": "groups"}, "group_roles"),
    ({"group_roles": {"g": ("approver",)}}, "group_roles"),
    ({"groups_claim": "groups", "group_roles": {"g": ("pilot",)}}, "group_roles"),
    ({"redirect_uri": "https://h.example/callback"}, "redirect_uri"),
    ({"scopes": ("email",)}, "scopes"),
    ({"recheck_seconds": 59}, "recheck_seconds"),
    ({"recheck_seconds": 8 * 3600 + 1}, "recheck_seconds"),
    ({"recheck_seconds": True}, "recheck_seconds"),
    ({"recheck_seconds": "300"}, "recheck_seconds"),
])
def test_settings_that_cannot_work_are_refused(changes: dict[str, Any], setting: str) -> None:
    with pytest.raises(OidcConfigInvalid) as refused:
        config(**changes)
    assert refused.value.detail["setting"] == setting


def test_settings_round_trip_and_http_is_only_for_loopback() -> None:
    made = config(issuer="http://127.0.0.1:8080", groups_claim="groups",
                  group_roles={"ops": ("approver", "auditor")}, require=True)
    assert OidcConfig.from_dict(made.to_dict()) == made
    with pytest.raises(OidcConfigInvalid):
        OidcConfig.from_dict({**made.to_dict(), "version": "other"})


def test_the_recheck_interval_defaults_and_older_settings_get_the_default() -> None:
    """Five minutes unless set; settings kept before the interval existed read as five
    minutes too (the default, not a guess at something looser)."""
    assert config().recheck_seconds == RECHECK_SECONDS == 300
    assert config(recheck_seconds=60).to_dict()["recheck_seconds"] == 60
    kept = config().to_dict()
    del kept["recheck_seconds"]
    assert OidcConfig.from_dict(kept).recheck_seconds == RECHECK_SECONDS


def test_groups_grant_only_their_mapped_roles() -> None:
    made = config(groups_claim="groups", group_roles={"ops": ("approver",),
                                                      "audit": ("auditor",)})
    assert made.roles_for(["ops", "audit", "other"]) == {Role.APPROVER, Role.AUDITOR}
    assert made.roles_for(["other"]) == frozenset()
    assert made.roles_for("ops") == frozenset()  # a claim that is not a list grants nothing
    assert parse_group_role("a=b=approver") == ("a=b", Role.APPROVER)
    with pytest.raises(OidcConfigInvalid):
        parse_group_role("ops")


def claims(**changes: Any) -> dict[str, Any]:
    return {"iss": ISSUER, "aud": "marque", "sub": "carol", "iat": NOW - 5, "exp": NOW + 300,
            "nonce": "n-1", **changes}


@pytest.mark.parametrize(("changes", "check"), [
    ({"iss": "https://other.example"}, "issuer"),
    ({"aud": "other-app"}, "audience"),
    ({"aud": ["other-app", "marque"]}, "audience"),  # several audiences and no azp of ours
    ({"exp": NOW - LEEWAY_SECONDS}, "expired"),
    ({"exp": "tomorrow"}, "expired"),
    ({"iat": NOW + LEEWAY_SECONDS + 1}, "issued_at"),
    ({"sub": ""}, "subject"),
    ({"nonce": "n-2"}, "nonce"),
    ({"nonce": None}, "nonce"),
])
def test_each_claim_check_refuses_on_its_own(changes: dict[str, Any], check: str) -> None:
    with pytest.raises(OidcLoginRefused) as refused:
        _check_claims(claims(**changes), ISSUER, "marque", NOW, "n-1")
    assert refused.value.detail["check"] == check


def test_claims_that_hold_pass() -> None:
    _check_claims(claims(), ISSUER, "marque", NOW, "n-1")
    _check_claims(claims(aud=["other", "marque"], azp="marque"), ISSUER, "marque", NOW, "n-1")
    _check_claims(claims(exp=NOW - LEEWAY_SECONDS + 1), ISSUER, "marque", NOW, "n-1")


@pytest.mark.parametrize(("target", "safe"), [
    ("/requests/rq_1?x=1", "/requests/rq_1?x=1"), ("//evil.example", "/"),
    ("/\t/evil.example", "/"), ("/\\evil.example", "/"), ("https://evil.example", "/"),
    (None, "/"), ("/a b", "/"), ("/requests/ré", "/requests/ré"), ("/\u2028/x", "/"),
])
def test_a_sign_in_returns_only_to_a_path_of_this_site(target: str | None, safe: str) -> None:
    assert safe_next(target) == safe
