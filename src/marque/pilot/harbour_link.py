"""A Pilot's link to the Harbourmaster it joined: registration, and reports delivered there.

A Pilot whose ``pilot.json`` has a ``harbour`` section (``marque pilot
join``) keeps its Harbourmaster informed in two ways:

* **registration** (``POST /v1/pilots``): who it is, where its service
  answers, its ledger's incarnation and its targets with their dialects.
  ``pilot serve`` registers when it starts and every
  :data:`REGISTER_INTERVAL_SECONDS` after. A Harbourmaster that cannot be
  reached is a warning, never a reason not to serve: marques already issued
  keep working, and the next round tries again. A new incarnation (a wiped
  and re-created ledger) is how the Harbourmaster learns that marques pinned
  to the old one can no longer run.
* **outcome reports** (``POST /v1/reports``): :class:`HarbourSink` is a report
  sink of the :class:`~marque.pilot.core.Pilot`. The ledger's outbox entry
  of an attempt is acknowledged only once the Harbourmaster acknowledged the
  report — until then the reporter retries with backoff, and a report
  delivered twice is one report there (it is idempotent on
  ``(marque_id, nonce, attempt, status)``). The local logbook is written as
  well, first: it is the Pilot's own journal, which ``marque logbook verify
  --home`` reads whether or not a Harbourmaster exists.

Each report goes signed with the Pilot's report key
(:mod:`marque.pilot.report_key`, :mod:`marque.token.reports`), whose public
half every registration carries: the Harbourmaster takes a joined Pilot's
outcomes only under that signature, not on the strength of its token alone.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from marque.dsn import is_sqlite
from marque.errors import Conflict, HarbourUnavailable, MarqueError
from marque.pilot.config import HarbourLink, PilotConfig
from marque.pilot.home import PilotHome

if TYPE_CHECKING:
    from marque.clients.harbour import HarbourClient
    from marque.ledger import OutboxEntry
    from marque.pilot.core import Pilot

__all__ = [
    "REGISTER_INTERVAL_SECONDS",
    "REPORTS_PER_POST",
    "HarbourSink",
    "Registrar",
    "attach_harbour",
    "client_for",
    "dialect_of",
    "open_linked_pilot",
    "register",
    "registration_body",
]

#: How often a serving Pilot registers again (its incarnation and targets may have changed).
REGISTER_INTERVAL_SECONDS = 60.0
#: After a failed registration, the first pause before the next try (doubling up to the
#: interval): a Harbourmaster that was only restarting learns of the Pilot soon.
REGISTER_RETRY_SECONDS = 5.0
#: Reports per ``POST /v1/reports``: the Harbourmaster stores one request per call in one
#: transaction, so a long outbox goes in bounded pieces.
REPORTS_PER_POST = 100
#: One call's patience: a Harbourmaster slower than this is tried again later.
CALL_TIMEOUT_SECONDS = 10.0

Log = Callable[[str], None]


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def dialect_of(dsn: str) -> str:
    """The SQL dialect of a target, as the Harbourmaster's routing reads statements in it."""
    return "sqlite" if is_sqlite(dsn) else "postgres"


def registration_body(
    pilot_id: str, incarnation: str, link: HarbourLink, targets: dict[str, str],
    report_key: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of ``POST /v1/pilots`` for a Pilot serving ``targets`` (``{name: DSN}``),
    with the public half of its ``report_key`` when it has one."""
    from marque.errors import InvalidInput
    from marque.token.keys import ed25519_public

    body: dict[str, Any] = {
        "pilot_id": pilot_id,
        "url": link.pilot_url,
        "incarnation": incarnation,
        "targets": {name: {"dialect": dialect_of(dsn)} for name, dsn in sorted(targets.items())},
    }
    if report_key is not None:
        body["report_key"] = ed25519_public(report_key, InvalidInput, "report key")
    return body


def register(link: HarbourLink, body: dict[str, Any]) -> dict[str, Any]:
    """Register with the Harbourmaster; returns its answer, checked to be about this Pilot.

    A Harbourmaster that answers for another pilot id is ``Conflict`` (the
    token is bound to another Pilot there, or the URL is not the expected
    service); one that answers with no usable JSON is ``HarbourUnavailable``.
    """
    with client_for(link) as client:
        answer = client.register_pilot(body)
    if not isinstance(answer, dict) or answer.get("pilot_id") != body["pilot_id"]:
        got = answer.get("pilot_id") if isinstance(answer, dict) else None
        raise Conflict(
            f"the Harbourmaster at {link.url} answered the registration of Pilot "
            f"{body['pilot_id']} for pilot id {got!r}: its token is bound to another Pilot "
            "there, or the URL is not that Harbourmaster; nothing was changed",
            detail={"pilot_id": body["pilot_id"], "answered_for": got},
        )
    if answer.get("registered") is not True:
        raise HarbourUnavailable(
            f"the Harbourmaster at {link.url} did not confirm the registration of Pilot "
            f"{body['pilot_id']} (no \"registered\": true in its answer)")
    return answer


class HarbourSink:
    """Delivers outcome reports to ``POST /v1/reports``: a report sink of a Pilot.

    :meth:`deliver` returns only once the Harbourmaster acknowledged every
    report it was given; otherwise it raises and the Pilot leaves the outbox
    entries unacknowledged, for the next try. A streak of failures is logged
    once when it starts and once when it ends, not on every retry.
    """

    def __init__(self, link: HarbourLink, pilot_id: str, *,
                 report_key: dict[str, Any] | None = None, log: Log = _stderr) -> None:
        self.link = link
        self.pilot_id = pilot_id
        #: The private key each report is signed with; None delivers them unsigned (a home
        #: without one, which a Harbourmaster takes only from a Pilot with no key there).
        self.report_key = report_key
        self._log = log
        self._failing: str | None = None
        self.delivered = 0

    def deliver(self, entries: list[OutboxEntry]) -> None:
        """Report ``entries`` (their outbox payloads, as queued); raises unless acknowledged."""
        try:
            for start in range(0, len(entries), REPORTS_PER_POST):
                chunk = entries[start:start + REPORTS_PER_POST]
                self._post(chunk)
                self.delivered += len(chunk)
        except MarqueError as exc:
            if self._failing is None:
                self._log(f"warning: outcome reports not delivered to the Harbourmaster at "
                          f"{self.link.url} ({exc.code}: {exc.message}); the outbox keeps "
                          "them and the reporter retries with backoff")
            self._failing = exc.code
            raise
        if self._failing is not None:
            self._log(f"outcome reports delivered to the Harbourmaster at {self.link.url} "
                      "again")
            self._failing = None

    def _post(self, chunk: list[OutboxEntry]) -> None:
        reports = [entry.payload for entry in chunk]
        if self.report_key is not None:
            from marque.token.reports import sign_report

            reports = [{**report, "signature": sign_report(report, self.report_key)}
                       for report in reports]
        with client_for(self.link) as client:
            answer = client.report(self.pilot_id, reports)
        acknowledged = answer.get("acknowledged") if isinstance(answer, dict) else None
        if acknowledged != len(chunk):
            raise HarbourUnavailable(
                f"the Harbourmaster at {self.link.url} acknowledged {acknowledged!r} of "
                f"{len(chunk)} reports; they stay in the outbox")


class Registrar:
    """Registers a serving Pilot with its Harbourmaster now and every interval, in a thread.

    :meth:`register_now` is the one round (used at start, synchronously, so a
    Pilot that says it serves is also known to a reachable Harbourmaster); the
    thread repeats it. Failures are logged and retried sooner (from
    :data:`REGISTER_RETRY_SECONDS`, doubling up to the interval), never raised.
    """

    def __init__(self, pilot: Pilot, link: HarbourLink, targets: dict[str, str], *,
                 interval: float = REGISTER_INTERVAL_SECONDS,
                 report_key: dict[str, Any] | None = None, log: Log = _stderr) -> None:
        self.pilot = pilot
        self.link = link
        self.targets = dict(targets)
        self.report_key = report_key
        self.interval = interval
        self.rounds = 0
        self.last: dict[str, Any] | None = None
        self._log = log
        self._failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="marque-registrar", daemon=True)

    def register_now(self) -> bool:
        """One registration; True if the Harbourmaster confirmed it (else logged)."""
        body = registration_body(self.pilot.pilot_id, self.pilot.incarnation, self.link,
                                 self.targets, self.report_key)
        self.rounds += 1
        try:
            self.last = register(self.link, body)
        except MarqueError as exc:
            self._failures += 1
            self._log(f"warning: could not register Pilot {body['pilot_id']} with the "
                      f"Harbourmaster at {self.link.url} ({exc.code}: {exc.message}); "
                      f"retrying in {self._pause():.0f} s")
            return False
        if self._failures:
            self._log(f"registered Pilot {body['pilot_id']} with the Harbourmaster at "
                      f"{self.link.url} again")
        self._failures = 0
        # It is back (or new): whatever the outbox holds can go now, not after a backoff.
        self.pilot.report_wanted.set()
        return True

    def _pause(self) -> float:
        if not self._failures:
            return self.interval
        return min(self.interval, REGISTER_RETRY_SECONDS * 2 ** (self._failures - 1))

    def start(self) -> Registrar:
        """Start the periodic rounds (the first one after a pause: see :meth:`register_now`)."""
        self._thread.start()
        return self

    def _loop(self) -> None:
        # A little jitter, so Pilots restarted together do not register in lockstep.
        while not self._stop.wait(self._pause() * random.uniform(0.9, 1.0)):
            try:
                self.register_now()
            except Exception as exc:  # never let the loop die: the Pilot must keep serving
                self._log(f"warning: registration round failed: {exc!r}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the rounds."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def attach_harbour(pilot: Pilot, config: PilotConfig, *,
                   report_key: dict[str, Any] | None = None, log: Log = _stderr
                   ) -> HarbourSink | None:
    """Make ``pilot`` report to the Harbourmaster ``config`` names; None without one.

    Must happen before the Pilot first reports (start-up recovery does): an
    outbox entry acknowledged without the Harbourmaster would never reach it.
    Idempotent: a Pilot gets one sink per Harbourmaster URL. Reports are signed
    with ``report_key`` (the home's, :func:`~marque.pilot.report_key.load_report_key`).
    """
    if config.harbour is None:
        return None
    for sink in pilot.report_sinks:
        if isinstance(sink, HarbourSink) and sink.link.url == config.harbour.url:
            return sink
    sink = HarbourSink(config.harbour, pilot.pilot_id, report_key=report_key, log=log)
    pilot.report_sinks.append(sink)
    return sink


def open_linked_pilot(home: str | os.PathLike[str], *, log: Log = _stderr,
                      register_interval: float = REGISTER_INTERVAL_SECONDS) -> Pilot:
    """``open_pilot(home, background=True)``, linked to its Harbourmaster if it joined one.

    The sink is attached before start-up recovery reports anything; the Pilot
    then registers once (a failure is logged, not raised) and a
    :class:`Registrar` repeats it. Without a ``harbour`` section this is
    exactly ``open_pilot(home, background=True)``.
    """
    from marque.pilot import open_pilot
    from marque.pilot.background import start_background

    config = PilotHome(home).load()
    if config.harbour is None:
        return open_pilot(home, background=True)
    from marque.pilot.report_key import ensure_report_key

    # A home joined before Pilots signed their reports gets its key here (open_pilot's
    # sink signs with it), registered by the first round below.
    report_key = ensure_report_key(PilotHome(home))
    pilot = open_pilot(home, recover=False)
    try:
        attach_harbour(pilot, config, report_key=report_key, log=log)
        pilot.check_continuity()
        pilot.recover()
        start_background(pilot)
        pilot_home = PilotHome(home)
        registrar = Registrar(pilot, config.harbour,
                              {name: pilot_home.resolve(dsn)
                               for name, dsn in config.targets.items()},
                              interval=register_interval, report_key=report_key, log=log)
        registrar.register_now()
        pilot.attach(registrar.start())
    except BaseException:
        pilot.close()
        raise
    return pilot


# -- the wire -------------------------------------------------------------------------


def client_for(link: HarbourLink | None = None, *, url: str | None = None) -> HarbourClient:
    """A client for one call (problems come back typed; transport failures and answers
    that are not the API's as ``HarbourUnavailable``)."""
    from marque.clients.harbour import HarbourClient

    if link is not None:
        return HarbourClient(link.url, link.token, timeout=CALL_TIMEOUT_SECONDS)
    assert url is not None
    return HarbourClient(url, timeout=CALL_TIMEOUT_SECONDS)
