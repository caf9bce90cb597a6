"""Report signatures (marque.token.reports): only the Pilot's key, only that report."""

from __future__ import annotations

import re

import pytest

from marque.errors import ReportSignatureInvalid
from marque.logbook.audit import SignatureAudit
from marque.token import new_key, public_jwk
from marque.token.reports import REPORT_TYP, sign_report, verify_report

REPORT = {"marque_id": "mq_1", "nonce": "n-1", "attempt": 1, "status": "applied",
          "rows_affected": 1, "error": None, "pilot": {"id": "p1", "incarnation": "inc_1"},
          "cause": "executed"}


def test_a_signature_verifies_under_its_key_for_exactly_its_report() -> None:
    """Signed by the key, over the report: iat comes back; any other claim value is refused,
    naming what differs."""
    key = new_key()
    signature = sign_report(REPORT, key, now=1_800_000_000.5)
    assert verify_report(signature, REPORT, public_jwk(key)) == 1_800_000_000
    with pytest.raises(ReportSignatureInvalid) as caught:
        verify_report(signature, {**REPORT, "status": "aborted_not_applied"}, public_jwk(key))
    assert caught.value.detail["differs"] == ["status"]
    with pytest.raises(ReportSignatureInvalid):
        verify_report(signature, {**REPORT, "extra": 1}, public_jwk(key))


def test_another_key_a_forged_signature_or_another_token_type_is_refused() -> None:
    """A report signed by another key, a signature cut and pasted, or a JWS of another typ."""
    from marque.token.jose import ALG, Registry, sign
    from marque.token.keys import import_private, thumbprint

    key, other = new_key(), new_key()
    with pytest.raises(ReportSignatureInvalid, match="other than the one registered"):
        verify_report(sign_report(REPORT, other), REPORT, public_jwk(key))
    good, bad = sign_report(REPORT, key), sign_report(REPORT, other)
    spliced = ".".join(good.split(".")[:2] + bad.split(".")[2:])
    with pytest.raises(ReportSignatureInvalid, match="signature is not valid"):
        verify_report(spliced, REPORT, public_jwk(key))
    head = {"alg": ALG, "typ": "marque+jwt", "kid": thumbprint(key)}
    token = sign(head, {**REPORT, "iat": 1}, import_private(key, "k"), Registry(algorithms=[ALG]))
    with pytest.raises(ReportSignatureInvalid, match=re.escape(REPORT_TYP)):
        verify_report(token, REPORT, public_jwk(key))
    for junk in (None, "", "a.b", 42):
        with pytest.raises(ReportSignatureInvalid):
            verify_report(junk, REPORT, public_jwk(key))


def test_the_audit_takes_keys_from_registrations_and_names_the_first_bad_outcome() -> None:
    """Outcomes before any key may be unsigned; after it, signed ones count, an unsigned or
    altered one is the problem, by seq."""
    key = new_key()
    audit = SignatureAudit()
    body = {**REPORT, "request": "rq_1"}
    audit.observe({"seq": 1, "kind": "execution.applied", "body": body})
    audit.observe({"seq": 2, "kind": "pilot.registered",
                   "body": {"pilot_id": "p1", "report_key": public_jwk(key)}})
    audit.observe({"seq": 3, "kind": "execution.applied",
                   "body": {**body, "signature": sign_report(REPORT, key)}})
    assert (audit.checked, audit.problem) == (1, None)
    audit.observe({"seq": 4, "kind": "execution.applied",
                   "body": {**body, "rows_affected": 9, "signature": sign_report(REPORT, key)}})
    assert audit.problem is not None
    assert (audit.problem["seq"], audit.problem["kind"]) == (4, "report_signature")
    unsigned = SignatureAudit()
    unsigned.observe({"seq": 1, "kind": "pilot.registered",
                      "body": {"pilot_id": "p1", "report_key": public_jwk(key)}})
    unsigned.observe({"seq": 2, "kind": "execution.applied", "body": body})
    assert unsigned.problem is not None and unsigned.problem["kind"] == "report_unsigned"
