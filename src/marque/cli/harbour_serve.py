"""``marque harbour serve``: the Harbourmaster's HTTP service (DESIGN §10, §11) on uvicorn."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from marque.cli.common import emit_json, err, guarded, json_option, literal, parse_duration
from marque.cli.harbour import harbour_home_option
from marque.cli.serve import GRACEFUL_SECONDS, _bind, _is_loopback, _server_class, parse_listen
from marque.errors import InvalidInput, MarqueError

if TYPE_CHECKING:
    from marque.harbour.http import HarbourService
    from marque.harbour.notifications.delivery import Deliverer, DeliveryPolicy
    from marque.harbour.preparation import RetrySchedule
    from marque.harbour.service import Harbourmaster

log = logging.getLogger(__name__)

#: How often requests in ``reconciliation`` are offered to their Pilot's stamps.
SWEEP_SECONDS = 30.0
#: How often the outbox is looked at for deliveries that are due.
WEBHOOK_ROUND_SECONDS = 0.5
#: The shortest and longest console session ``--console-session`` accepts. Under a
#: minute nobody can finish reading a change; past a week a lost laptop is a standing
#: approval session.
CONSOLE_SESSION_BOUNDS = (60, 7 * 86_400)


class _Periodic:
    """A daemon thread that runs :meth:`round` every ``every`` seconds until stopped; a round
    that fails is logged and the next one comes anyway (each must outlive a bad moment of
    the store). ``first_at_once`` runs the first round at start instead of after a period."""

    name = "marque-harbour-periodic"
    first_at_once = False

    def __init__(self, harbourmaster: Harbourmaster, every: float) -> None:
        self._harbourmaster = harbourmaster
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        """Begin the rounds."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the round in progress, if any."""
        self._stop.set()
        self._thread.join(timeout=GRACEFUL_SECONDS)

    def round(self) -> None:
        """One round of the work."""
        raise NotImplementedError

    def _run(self) -> None:
        if not self.first_at_once and self._stop.wait(self._every):
            return
        while not self._stop.is_set():
            try:
                self.round()
            except Exception:
                log.exception("%s: a round failed", self.name)
            self._stop.wait(self._every)


class ReconciliationSweep(_Periodic):
    """A thread that settles requests in ``reconciliation`` from stamps, periodically (the
    first sweep waits one period).

    Several processes of one Harbourmaster may sweep at once: settling is the
    core's compare-and-set on the request's version, so the loser re-reads and
    changes nothing. A Pilot that cannot be reached leaves its requests as
    they are until a later sweep.
    """

    name = "marque-harbour-sweep"

    def __init__(self, harbourmaster: Harbourmaster, every: float = SWEEP_SECONDS) -> None:
        super().__init__(harbourmaster, every)

    def sweep(self) -> int:
        """Offer every request in ``reconciliation`` to its stamps once; how many were tried."""
        waiting = self._harbourmaster.store.list_requests("reconciliation")
        for stored in waiting:
            if self._stop.is_set():
                break
            try:
                self._harbourmaster.settle_from_stamps(stored.id)
            except MarqueError as exc:  # unreachable Pilot, a race lost: try again later
                log.info("reconciliation of %s not settled: %s", stored.id, exc.message)
        return len(waiting)

    def round(self) -> None:
        self.sweep()


class PreparationRetry(_Periodic):
    """A thread that tries again the previews of requests left ``preparing`` because their
    Pilot could not be reached, as their schedule comes due (``harbour.preparation``). The
    first look comes at once: a restart picks up what a dead process left.

    Each attempt is claimed by a compare-and-set on the request's version, so several
    processes may run this at once and each attempt is made by one; an attempt this
    process dies in is claimed again by another (or by this one restarted).
    """

    name = "marque-harbour-preparation"
    first_at_once = True

    def __init__(self, harbourmaster: Harbourmaster) -> None:
        # Often enough for the shortest delay to be kept to within about half of it.
        shortest = min(harbourmaster.retry_schedule.delays, default=5.0)
        super().__init__(harbourmaster, max(0.2, min(5.0, shortest / 2)))

    def round(self) -> None:
        self._harbourmaster.retry_preparations()


class WebhookDelivery(_Periodic):
    """A thread that posts the outbox's due deliveries (``harbour.notifications.delivery``);
    the first look comes at once, so a restart picks up what a dead process left. Each
    attempt is claimed by a compare-and-set on its lease, so several processes may run this
    at once and none posts a delivery another is posting."""

    name = "marque-harbour-webhooks"
    first_at_once = True

    def __init__(self, harbourmaster: Harbourmaster, deliverer: Deliverer) -> None:
        super().__init__(harbourmaster, WEBHOOK_ROUND_SECONDS)
        self._deliverer = deliverer

    def round(self) -> None:
        self._deliverer.round()

    def stop(self) -> None:
        super().stop()
        self._deliverer.close()


def webhook_policy(retry: str, give_up: str) -> DeliveryPolicy:
    """``--webhook-retry FIRST,MAX`` and ``--webhook-give-up DURATION`` as a policy."""
    from marque.harbour.notifications.delivery import DeliveryPolicy

    parts = [part.strip() for part in retry.split(",")]
    if len(parts) != 2 or not all(parts):
        raise InvalidInput(f"--webhook-retry takes two durations, FIRST,MAX (such as 2s,10m), "
                           f"not {retry.strip()[:80]!r}")
    first, longest = (parse_duration(part) for part in parts)
    if not 1 <= first <= longest:
        raise InvalidInput("--webhook-retry's first delay is at least 1s and at most its MAX")
    return DeliveryPolicy(first_delay=float(first), max_delay=float(longest),
                          give_up_after=float(parse_duration(give_up)))


def retry_schedule(text: str) -> RetrySchedule:
    """``--preview-retry``: comma-separated durations (``15s,30s,60s``), 1 to 20 of them."""
    from marque.harbour.preparation import RetrySchedule

    parts = [part.strip() for part in text.split(",")]
    if not 1 <= len(parts) <= 20 or not all(parts):
        raise InvalidInput(f"--preview-retry takes 1 to 20 durations separated by commas, "
                           f"not {text.strip()[:80]!r}")
    return RetrySchedule.of([parse_duration(part) for part in parts])


def console_session_seconds(text: str) -> int:
    """``--console-session``'s duration in seconds, within :data:`CONSOLE_SESSION_BOUNDS`."""
    seconds = parse_duration(text)
    shortest, longest = CONSOLE_SESSION_BOUNDS
    if not shortest <= seconds <= longest:
        raise InvalidInput(f"--console-session must be between 1m and 7d, not {text.strip()!r}",
                           detail={"seconds": seconds, "min": shortest, "max": longest})
    return seconds


@click.command("serve")
@harbour_home_option
@click.option("--listen", default="127.0.0.1:8760", show_default=True, metavar="HOST:PORT",
              help="Where to listen; port 0 picks a free port (printed once listening).")
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None,
              help="PEM certificate: serve HTTPS (with --tls-key).")
@click.option("--tls-key", type=click.Path(path_type=Path), default=None,
              help="PEM private key of --tls-cert.")
@click.option("--console-session", default="8h", show_default=True, metavar="DURATION",
              help="How long a console login lasts (1m to 7d; no sliding renewal).")
@click.option("--preview-retry", default="15s,30s,60s", show_default=True,
              metavar="DURATIONS",
              help="When a preview that could not reach its Pilot is tried again (after each "
                   "failed attempt); after the last the request ends failed.")
@click.option("--public-url", default=None, metavar="URL",
              help="The address people open this Harbourmaster at (behind a proxy, say): "
                   "notifications link to its console there (default: the listening URL).")
@click.option("--webhook-retry", default="2s,10m", show_default=True, metavar="FIRST,MAX",
              help="A failed webhook delivery is tried again after FIRST, doubled each time "
                   "up to MAX.")
@click.option("--webhook-give-up", default="3d", show_default=True, metavar="DURATION",
              help="A delivery still failing this long after its event ends failed (shown "
                   "on the console and in /metrics).")
@json_option
@guarded
def harbour_serve(home: Path, listen: str, tls_cert: Path | None, tls_key: Path | None,
                  console_session: str, preview_retry: str, public_url: str | None,
                  webhook_retry: str, webhook_give_up: str, as_json: bool) -> None:
    """Serve this Harbourmaster over HTTP until SIGTERM or SIGINT.

    Once listening it prints {url, harbour_id, console} (one JSON line with --json;
    console is the web console's address).
    SIGTERM stops taking requests, lets those in progress finish, then exits.
    Several processes may serve one PostgreSQL-backed home at once.
    """
    import uvicorn

    from marque.harbour.home import HarbourHome
    from marque.harbour.http import HarbourService
    from marque.harbour.service import Harbourmaster

    host, port = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("--tls-cert and --tls-key go together")
    session_seconds = console_session_seconds(console_session)
    schedule = retry_schedule(preview_retry)
    policy = webhook_policy(webhook_retry, webhook_give_up)
    if public_url is not None:
        from marque.harbour.notifications.endpoints import check_url

        check_url(public_url, allow_http=True)
    # Opened before anything is bound: a bad home or an unreachable store is one clear error.
    harbourmaster = Harbourmaster.open(HarbourHome(home), retry_schedule=schedule)
    sock: socket.socket | None = None
    try:
        sock = _bind(host, port)
        url = _served_url(host, sock, tls_cert)
        service = HarbourService(harbourmaster, console_session_seconds=session_seconds)
        server = _server_class()(uvicorn.Config(
            service.app, log_level="warning", lifespan="off", access_log=False,
            timeout_graceful_shutdown=GRACEFUL_SECONDS,
            ssl_certfile=str(tls_cert) if tls_cert else None,
            ssl_keyfile=str(tls_key) if tls_key else None,
        ))
        server.on_started = _announcer(url, harbourmaster.store.harbour_id, as_json)
        _serve_with_workers(harbourmaster, service, server, sock, public_url or url, policy)
    finally:
        if sock is not None:
            sock.close()
        harbourmaster.close()


def _served_url(host: str, sock: socket.socket, tls_cert: Path | None) -> str:
    """The URL the bound socket serves at; warns when it is not loopback and not TLS."""
    scheme = "https" if tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown_host}:{sock.getsockname()[1]}"
    if not _is_loopback(host) and tls_cert is None:
        err.say(f"[bold yellow]warning[/]: listening on {literal(host)} without TLS: "
                "tokens, marques and previews cross the network in clear text (use "
                "--tls-cert/--tls-key)")
    return url


def _announcer(url: str, harbour_id: str, as_json: bool) -> Callable[[], None]:
    """What the server calls once listening: the line (or JSON) that says where."""
    def announce() -> None:
        if as_json:
            emit_json({"url": url, "harbour_id": harbour_id, "console": f"{url}/"})
        else:
            err.say(f"Harbourmaster {literal(harbour_id)} serving on {literal(url)}")
            err.say(f"Console: {literal(url + '/')}")
        sys.stdout.flush()

    return announce


def _serve_with_workers(harbourmaster: Harbourmaster, service: HarbourService, server: Any,
                        sock: socket.socket, console_url: str,
                        policy: DeliveryPolicy) -> None:
    """Run the server with its background workers (reconciliation sweep, preparation
    retry, webhook delivery), stopping them after it, in reverse order."""
    from marque.harbour.notifications.delivery import Deliverer

    sweep = ReconciliationSweep(harbourmaster)
    sweep.start()
    retry = PreparationRetry(harbourmaster)
    retry.start()
    delivery = WebhookDelivery(harbourmaster, Deliverer(
        harbourmaster.store, console_url=console_url, policy=policy,
        on_attempt=service.notifications.attempted))
    delivery.start()
    try:
        server.run(sockets=[sock])
    finally:
        delivery.stop()
        retry.stop()
        sweep.stop()
        service.close()

