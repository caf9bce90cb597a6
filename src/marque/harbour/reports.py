"""Taking a Pilot's execution reports (``POST /v1/reports``): whose they are, who signed them.

A report writes an outcome into the request's executions and the logbook,
so the Harbourmaster takes one only from the Pilot the marque was issued to,
and — once that Pilot registered a report key — only signed with that key
(:mod:`marque.token.reports`). The bearer token says which Pilot is calling;
the signature says the Pilot itself vouches for the outcome, so a stolen
token alone writes nothing.

A delivery is taken whole or refused whole. Every check runs before the
first report is stored: a single report about another Pilot's marque
(``forbidden``) or without a valid signature (``report_signature_invalid``)
refuses the delivery, and nothing of it is written — no report, no logbook
entry, no request moved. An honest Pilot never sends either (it refuses a
marque issued to another Pilot, and signs everything it delivers), so a
refusal costs it nothing but says loudly that someone else holds its token.

A report about a marque this Harbourmaster never issued (one from another
issuer the Pilot also trusts) is acknowledged and kept nowhere: counted as
``ignored`` in the answer, so the Pilot's outbox does not hold it forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from marque.errors import Forbidden, NotFound, ReportSignatureInvalid
from marque.harbour.intake import read_reports
from marque.harbour.store.base import HarbourStore
from marque.token.reports import verify_report

__all__ = ["ingest"]


def ingest(store: HarbourStore, pilot_id: str, body: Any, *,
           now: Callable[[], float]) -> dict[str, Any]:
    """Store the delivery ``body`` of the Pilot ``pilot_id`` (the calling principal's name).

    Returns ``{acknowledged, new, ignored}``: every report acknowledged, how
    many were stored for the first time, how many were about marques not
    issued here. Raises ``InvalidInput`` for a malformed body, ``Forbidden``
    for a delivery naming another Pilot or holding a report about a marque
    issued to another Pilot, ``ReportSignatureInvalid`` for one whose
    signatures do not hold — in each case before anything is stored.
    """
    delivered_for, reports = read_reports(body)
    if delivered_for != pilot_id or any(r["pilot"]["id"] != pilot_id for r in reports):
        raise Forbidden(f"principal {pilot_id} may report only for the Pilot {pilot_id}",
                        detail={"pilot_id": delivered_for[:64]})
    issued_to = store.marque_pilots([r["marque_id"] for r in reports])
    for index, report in enumerate(reports):
        owner = issued_to.get(report["marque_id"])
        if owner is not None and owner != pilot_id:
            raise Forbidden(f"reports[{index}] is about marque {report['marque_id'][:64]}, "
                            f"which was not issued to Pilot {pilot_id}; nothing of this "
                            "delivery was stored",
                            detail={"index": index, "marque_id": report["marque_id"][:128]})
    ours = [r for r in reports if r["marque_id"] in issued_to]
    if ours:
        check_signatures(store, pilot_id, reports, issued_to)
    new = 0
    for report in ours:
        added, _ = store.ingest_report(report, actor=pilot_id, now=now())
        new += int(added)
    return {"acknowledged": len(reports), "new": new, "ignored": len(reports) - len(ours)}


def check_signatures(store: HarbourStore, pilot_id: str, reports: list[dict[str, Any]],
                     issued_to: dict[str, str]) -> None:
    """Every report about a marque issued here verifies under the Pilot's report key.

    A Pilot that never registered a key (a Marque from before report
    signatures) may report unsigned; once it registered one, an unsigned
    report is refused like a forged one.
    """
    try:
        key = store.get_pilot(pilot_id).report_key
    except NotFound:
        key = None
    for index, report in enumerate(reports):
        if report["marque_id"] not in issued_to:
            continue
        signature = report.get("signature")
        where = {"index": index, "marque_id": report["marque_id"][:128]}
        if key is None and signature is None:
            continue
        if key is None:
            raise ReportSignatureInvalid(
                f"reports[{index}] is signed, but Pilot {pilot_id} registered no report key "
                "here: it registers one when it starts (pilot serve) or joins; nothing of "
                "this delivery was stored", detail=where)
        if signature is None:
            raise ReportSignatureInvalid(
                f"reports[{index}] is not signed, and Pilot {pilot_id} signs its reports (it "
                "registered a report key): nothing of this delivery was stored", detail=where)
        unsigned = {name: value for name, value in report.items() if name != "signature"}
        try:
            verify_report(signature, unsigned, key)
        except ReportSignatureInvalid as exc:
            raise ReportSignatureInvalid(
                f"reports[{index}]: {exc.message}; nothing of this delivery was stored",
                detail={**exc.json_detail(), **where}) from exc
