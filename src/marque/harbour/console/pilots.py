"""The Pilots page, and what the console asks Pilots directly (DESIGN §10, §11.5).

The registry (id, URL, incarnation, last seen) comes from the core's
``list_pilots``. What only a Pilot knows — its ledger's unreported outcomes
and its indeterminate and in-progress attempts — comes from its own
``GET /v1/health``, asked with a short timeout, all Pilots at once; a Pilot
that does not answer is shown as *unreachable*, never with figures made up.
An execution's event timeline is the Pilot's stored event log
(``GET /v1/executions/{marque_id}/{nonce}?follow=true``), read for at most
:data:`EVENTS_SECONDS`: a running execution shows the events so far.

Findings are the ``finding.*`` entries of the logbook, each with what it
means and what to do (:data:`FINDINGS`).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from marque.errors import Forbidden
from marque.harbour.principals import Principal

if TYPE_CHECKING:
    from marque.harbour.service import Harbourmaster

__all__ = ["FINDINGS", "execution_events", "pilot_health", "pilots_view"]

#: How long the console waits for one Pilot's health.
HEALTH_SECONDS = 2.0
#: How long the console reads one execution's events.
EVENTS_SECONDS = 1.5
#: The most events shown per execution.
MAX_EVENTS = 200

FINDINGS: dict[str, dict[str, str]] = {
    "finding.ledger_incarnation_changed": {
        "title": "A Pilot's ledger changed incarnation",
        "meaning": "The Pilot registered with a different ledger than before: it was wiped, "
                   "restored from a backup or replaced. What the old ledger knew about "
                   "executions is gone, so every request prepared, executing or in "
                   "reconciliation on that Pilot moved to reconciliation: their outcome is "
                   "unknown until the target's stamps say.",
        "todo": "Find out why the ledger changed. The Harbourmaster's sweep settles the "
                "listed requests from the target's stamps (applied → verified); a request "
                "whose marque provably never ran can be expired by an admin "
                "(`marque expire`). Do not execute those requests again meanwhile.",
    },
    "finding.ledger_regressed": {
        "title": "A Pilot's ledger went back in time",
        "meaning": "The target holds stamps the Pilot's ledger does not know: the ledger was "
                   "restored from an older copy. The Pilot rotated its incarnation so no old "
                   "marque can run twice.",
        "todo": "Check the listed stamps against the requests that issued them; settle "
                "affected requests from the stamps before issuing new marques there.",
    },
    "finding.stamp_contradicts_ledger": {
        "title": "A target stamp contradicts the Pilot's ledger",
        "meaning": "The target records an outcome for an attempt that the ledger records "
                   "differently. The stamp is the target's own word on what committed.",
        "todo": "Treat the stamp as the truth for the target's data; investigate how the "
                "ledger came to disagree before trusting it again.",
    },
    "finding.pilot_report_key_refused": {
        "title": "A Pilot's registration named another report key, and was refused",
        "meaning": "Someone registered this Pilot with a key other than the one its "
                   "execution reports are checked against. Nothing of that registration "
                   "was taken, and reports signed with the other key are refused. "
                   "Expected when the Pilot's home lost its report-key.jwk and made a new "
                   "one; otherwise someone holding the Pilot's token tried to register a "
                   "key of their own, to report outcomes in its name.",
        "todo": "Ask the Pilot's operator whether its key was replaced. If it was, accept "
                "the new key (`marque harbour pilot accept-key PILOT_ID --key PUB.jwk "
                "--reason …`; the offered key is in this entry). If not, revoke the "
                "Pilot's token (`marque harbour principal rotate`) and find who used it.",
    },
}
_GENERIC = {"title": "A finding", "meaning": "Something the Harbourmaster or a Pilot noticed "
            "that needs a person's attention.",
            "todo": "Read its body; see docs/harbour.md for the kinds of finding."}


def explain(kind: str) -> dict[str, str]:
    """What a finding of ``kind`` means and what to do about it."""
    return FINDINGS.get(kind, {**_GENERIC, "title": kind})


def pilot_health(url: str, timeout: float = HEALTH_SECONDS) -> dict[str, Any]:
    """``{reachable: True, health}`` from the Pilot's ``GET /v1/health``, or
    ``{reachable: False, error}`` — never a guess."""
    try:
        response = httpx.get(url.rstrip("/") + "/v1/health", timeout=timeout)
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"reachable": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
    if not isinstance(body, dict) or "pilot_id" not in body:
        return {"reachable": False,
                "error": f"answered {response.status_code} without a Pilot's health"}
    return {"reachable": True, "health": body}


def execution_events(url: str, marque_id: str, nonce: str,
                     seconds: float = EVENTS_SECONDS) -> dict[str, Any]:
    """The Pilot's event log for one nonce: ``{events, complete, error}``.

    ``complete`` is True once the stream reached the outcome; a running
    execution answers the events so far (``complete`` False); an unreachable
    Pilot answers ``error`` and no events.
    """
    events: list[dict[str, Any]] = []
    path = f"/v1/executions/{quote(marque_id, safe='')}/{quote(nonce, safe='')}"
    deadline = time.monotonic() + seconds
    try:
        with httpx.stream("GET", url.rstrip("/") + path, params={"follow": "true"},
                          timeout=httpx.Timeout(seconds)) as response:
            if response.status_code != 200:
                return {"events": [], "complete": False,
                        "error": f"the Pilot answered {response.status_code}"}
            for line in response.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "outcome":
                    return {"events": events, "complete": True, "error": None}
                if len(events) < MAX_EVENTS:
                    events.append(event)
                if time.monotonic() > deadline:
                    break
    except (httpx.HTTPError, ValueError) as exc:
        if not isinstance(exc, httpx.ReadTimeout):
            return {"events": events, "complete": False,
                    "error": f"the Pilot could not be read ({type(exc).__name__})"}
    return {"events": events, "complete": False, "error": None}


def pilots_view(hm: Harbourmaster, principal: Principal) -> dict[str, Any]:
    """Every registered Pilot with its live health, and the findings (or why they are hidden)."""
    pilots = hm.list_pilots(principal)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pilots)))) as pool:
        healths = list(pool.map(lambda p: pilot_health(p["url"]), pilots))
    shown = []
    for pilot, health in zip(pilots, healths, strict=True):
        body = health.get("health") or {}
        ledger = body.get("ledger") if health["reachable"] else None
        reported = body.get("incarnation")
        shown.append({**pilot, "reachable": health["reachable"],
                      "error": health.get("error"), "ledger": ledger,
                      "targets_health": body.get("targets") or {},
                      "live_incarnation": reported,
                      "incarnation_differs": bool(reported and
                                                  reported != pilot["incarnation"])})
    try:
        findings = []
        after = 0
        while True:
            page = hm.logbook(principal, after, 1000, "finding.")["entries"]
            findings.extend(page)
            if len(page) < 1000:
                break
            after = page[-1]["seq"]
        findings = [{**f, "explained": explain(f["kind"])} for f in reversed(findings)]
    except Forbidden:
        findings = None
    return {"pilots": shown, "findings": findings}
