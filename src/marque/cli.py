"""The ``marque`` command line: DESIGN §9's contract.

Every command takes ``--json`` and then prints exactly one JSON object on
stdout; streamed events go to stderr as JSON lines. Exit statuses come from
the outcome (0 applied, 4 aborted_not_applied, 5 indeterminate, 6 in_progress)
or from the error class (2 usage, 3 refused) — never from a table kept here.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from marque.change import Budget, Change, Statement
from marque.errors import InvalidInput, MarqueError, Refusal
from marque.outcome import Outcome, Status
from marque.pilot import open_pilot
from marque.pilot.setup import add_target, init_home, trust_issuer
from marque.token import issue_marque, make_proof, new_key, public_jwk

app = typer.Typer(
    help="Marque: run approved database changes exactly once, within budget, honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
keys_app = typer.Typer(help="Ed25519 keys (JWK) for issuers and holders.", no_args_is_help=True)
pilot_app = typer.Typer(help="Set up a Pilot: ledger, trust, targets.", no_args_is_help=True)
target_app = typer.Typer(help="Targets a Pilot serves.", no_args_is_help=True)
ledger_app = typer.Typer(help="Inspect and reap the execution ledger.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(pilot_app, name="pilot")
pilot_app.add_typer(target_app, name="target")
app.add_typer(ledger_app, name="ledger")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
HomeOpt = Annotated[Path, typer.Option("--home", help="The Pilot's home directory.")]

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


# -- plumbing -------------------------------------------------------------------


def _emit_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _fail(exc: MarqueError, as_json: bool, extra: dict[str, Any] | None = None) -> NoReturn:
    body = {**(extra or {}), "error": exc.to_dict()}
    if as_json:
        _emit_json(body)
    else:
        err.print(f"[bold red]{exc.kind}[/]: [bold]{exc.code}[/] — {exc.message}")
    raise typer.Exit(exc.exit_status)


def _guard(as_json: bool, body: Callable[[], None]) -> None:
    """Run a command body, turning Marque errors into their output and exit status."""
    try:
        body()
    except MarqueError as exc:
        _fail(exc, as_json)


def _read_json_file(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidInput(f"{what} {path} does not exist") from exc
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{what} {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} {path} is not a JSON object")
    return data


def _write_private(path: Path, data: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")


_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` → seconds (positive)."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) <= 0:
        raise InvalidInput(f"not a positive duration: {text!r} (use e.g. 90s, 15m, 2h, 1d)")
    return int(match.group(1)) * _UNIT[match.group(2)]


def _redact(dsn: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", dsn)


# -- keys -------------------------------------------------------------------------


@keys_app.command("new")
def keys_new(
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the private JWK.")],
    public: Annotated[bool, typer.Option("--public", help="Print the public JWK.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a new Ed25519 private JWK (issuer or holder); refuses to overwrite."""

    def body() -> None:
        key = new_key()
        try:
            _write_private(out_file, key)
        except FileExistsError as exc:
            raise InvalidInput(f"{out_file} exists; refusing to overwrite a key") from exc
        except OSError as exc:
            raise InvalidInput(f"cannot write {out_file}: {exc}") from exc
        pub = public_jwk(key)
        if as_json:
            _emit_json({"kid": key["kid"], "out": str(out_file), "public_jwk": pub})
        elif public:
            _emit_json(pub)
        else:
            out.print(f"wrote private key {key['kid']} to {out_file}")

    _guard(as_json, body)


@keys_app.command("public")
def keys_public(
    key_file: Annotated[Path, typer.Argument(help="A private or public JWK file.")],
    as_json: JsonOpt = False,
) -> None:
    """Print the public JWK of a key file."""
    _guard(as_json, lambda: _emit_json(public_jwk(_read_json_file(key_file, "key"))))


# -- pilot setup ----------------------------------------------------------------------


@pilot_app.command("init")
def pilot_init(
    home: HomeOpt,
    pilot_id: Annotated[str, typer.Option("--pilot-id", help="This Pilot's id.")],
    ledger: Annotated[
        str | None, typer.Option("--ledger", help="Ledger DSN (default: SQLite in the home).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the ledger and print {pilot_id, incarnation}; never overwrites a ledger."""

    def body() -> None:
        result = init_home(home, pilot_id, ledger)
        if as_json:
            _emit_json(result)
        else:
            out.print(f"Pilot {result['pilot_id']} incarnation {result['incarnation']}")

    _guard(as_json, body)


@pilot_app.command("trust")
def pilot_trust(
    home: HomeOpt,
    issuer_jwk: Annotated[Path, typer.Argument(help="The issuer's public (or private) JWK file.")],
    as_json: JsonOpt = False,
) -> None:
    """Trust an issuer's public key (only its public part is stored)."""

    def body() -> None:
        kid = trust_issuer(home, _read_json_file(issuer_jwk, "issuer key"))
        if as_json:
            _emit_json({"kid": kid})
        else:
            out.print(f"trusting issuer key {kid}")

    _guard(as_json, body)


@target_app.command("add")
def target_add(
    home: HomeOpt,
    name: Annotated[str, typer.Argument(help="The target's name, as marques will name it.")],
    dsn: Annotated[str, typer.Argument(help="sqlite:///path or postgresql://…")],
    as_json: JsonOpt = False,
) -> None:
    """Add (or repoint) a target this Pilot serves."""

    def body() -> None:
        add_target(home, name, dsn)
        if as_json:
            _emit_json({"target": name, "dsn": _redact(dsn)})
        else:
            out.print(f"target {name} → {_redact(dsn)}")

    _guard(as_json, body)


# -- issuing -----------------------------------------------------------------------


@app.command("issue")
def issue(
    issuer_key: Annotated[Path, typer.Option("--issuer-key", help="Issuer private JWK file.")],
    pilot_id: Annotated[str, typer.Option("--pilot-id")],
    incarnation: Annotated[str, typer.Option("--incarnation")],
    target: Annotated[str, typer.Option("--target")],
    holder_key: Annotated[Path, typer.Option("--holder-key", help="Holder public JWK file.")],
    sql: Annotated[list[str], typer.Option("--sql", help="A statement; repeat for more.")],
    executions: Annotated[int, typer.Option("--executions")],
    max_rows: Annotated[int, typer.Option("--max-rows")],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="JSON array of parameters for the n-th --sql."),
    ] = None,
    attempts: Annotated[int, typer.Option("--attempts")] = 3,
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime: 90s, 15m, 2h, 1d.")] = "15m",
    subject: Annotated[str, typer.Option("--sub", help="Who asked (recorded).")] = "local",
    isolation: Annotated[str, typer.Option("--isolation")] = "read_committed",
    as_json: JsonOpt = False,
) -> None:
    """Issue a marque (compact JWS) locally; the Harbourmaster issues the same tokens."""

    def body() -> None:
        params = list(param or [])
        if len(params) > len(sql):
            raise InvalidInput(f"{len(params)} --param given for {len(sql)} --sql")
        statements = []
        for index, text in enumerate(sql):
            values: Any = []
            if index < len(params):
                try:
                    values = json.loads(params[index])
                except json.JSONDecodeError as exc:
                    raise InvalidInput(f"--param {index + 1} is not JSON: {exc}") from exc
                if not isinstance(values, list):
                    raise InvalidInput(f"--param {index + 1} must be a JSON array")
            statements.append(Statement(text, tuple(values)))
        change = Change(tuple(statements), isolation=isolation)
        Change.from_claim(change.to_claim())  # the Pilot's own validation, before signing
        budget = Budget(executions, max_rows, attempts)
        Budget.from_claim(budget.to_claim())
        token = issue_marque(
            _read_json_file(issuer_key, "issuer key"),
            pilot_id=pilot_id,
            incarnation=incarnation,
            target=target,
            holder_jwk=_read_json_file(holder_key, "holder key"),
            change=change,
            budget=budget,
            ttl_seconds=parse_duration(ttl),
            subject=subject,
        )
        if as_json:
            _emit_json({"marque": token, "change_cid": change.change_cid})
        else:
            sys.stdout.write(token + "\n")

    _guard(as_json, body)


# -- executing -----------------------------------------------------------------------

_EVENT_STYLE = {
    "claimed": "cyan",
    "fence_checked": "cyan",
    "statement_started": "blue",
    "statement_finished": "blue",
    "guard_checked": "blue",
    "asserted": "green",
    "committed": "bold green",
    "outcome_recorded": "green",
    "reported": "dim",
    "rolled_back": "bold yellow",
    "outcome_unknown": "bold magenta",
}


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stderr.write(json.dumps(event, sort_keys=True) + "\n")
        sys.stderr.flush()
        return
    kind = event["event"]
    details = {k: v for k, v in event.items()
               if k not in ("event", "marque_id", "nonce", "at")}
    text = " ".join(f"{k}={v}" for k, v in details.items())
    err.print(f"[{_EVENT_STYLE.get(kind, 'white')}]● {kind:<18}[/] [dim]{text}[/]")


def _print_outcome(outcome: Outcome, as_json: bool) -> None:
    if as_json:
        _emit_json(outcome.to_dict())
        return
    colour = {"applied": "green", "aborted_not_applied": "yellow",
              "indeterminate": "magenta", "in_progress": "cyan"}.get(outcome.status, "white")
    line = f"[bold {colour}]{outcome.status}[/] attempt {outcome.attempt}"
    if outcome.rows_affected is not None:
        line += f", rows_affected={outcome.rows_affected}"
    if outcome.replayed:
        line += " [dim](replayed: recorded outcome, nothing ran)[/]"
    out.print(line)
    if outcome.error:
        out.print(f"  error {outcome.error['code']}: {outcome.error['message']}")
    if outcome.result:
        out.print(f"  columns {outcome.result['columns']}")
        for row in outcome.result["rows"]:
            out.print(f"  {row}")


def _refused(marque_id: str | None, nonce: str, pilot: dict[str, Any]) -> dict[str, Any]:
    return {
        "marque_id": marque_id,
        "nonce": nonce,
        "status": "refused",
        "attempt": None,
        "rows_affected": None,
        "replayed": False,
        "pilot": pilot,
    }


def _marque_id_of(token: str) -> str | None:
    """Best-effort jti for a refusal report; the token is not trusted here."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        jti = claims.get("jti")
        return jti if isinstance(jti, str) else None
    except Exception:
        return None


@app.command("exec")
def exec_(
    home: HomeOpt,
    marque_file: Annotated[Path, typer.Option("--marque", help="File holding the marque.")],
    key: Annotated[Path, typer.Option("--key", help="Holder private JWK file.")],
    nonce: Annotated[str, typer.Option("--nonce", help="Execution nonce (your retry key).")],
    pilot_url: Annotated[
        str | None, typer.Option("--pilot", help="A Pilot's URL instead of the embedded one.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Execute a marque once for NONCE, streaming events; a retry returns the outcome."""
    pilot_info: dict[str, Any] = {"id": None, "incarnation": None}
    token = ""
    try:
        if pilot_url is not None:
            raise InvalidInput("the Pilot HTTP service is not available yet; omit --pilot")
        try:
            token = marque_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read marque {marque_file}: {exc}") from exc
        holder = _read_json_file(key, "holder key")
        pilot = open_pilot(home)
        pilot_info = {"id": pilot.pilot_id, "incarnation": pilot.incarnation}
        try:
            proof = make_proof(holder, token, nonce=nonce, pilot_id=pilot.pilot_id)
            outcome = pilot.execute(token, proof, nonce,
                                    on_event=lambda e: _print_event(e, as_json))
        finally:
            pilot.close()
    except Refusal as exc:
        _fail(exc, as_json, _refused(_marque_id_of(token), nonce, pilot_info))
    except MarqueError as exc:
        _fail(exc, as_json)
    _print_outcome(outcome, as_json)
    raise typer.Exit(outcome.exit_status)


@app.command("outcome")
def outcome_(
    home: HomeOpt,
    marque_id: Annotated[str, typer.Argument()],
    nonce: Annotated[str, typer.Argument()],
    as_json: JsonOpt = False,
) -> None:
    """The recorded outcome of a nonce (read-only)."""
    try:
        pilot = open_pilot(home, recover=False)
        try:
            outcome = pilot.outcome(marque_id, nonce)
        finally:
            pilot.close()
    except MarqueError as exc:
        _fail(exc, as_json)
    if outcome is None:
        _fail(InvalidInput(f"nonce {nonce!r} of marque {marque_id} was never claimed here"),
              as_json)
    _print_outcome(outcome, as_json)
    raise typer.Exit(outcome.exit_status)


@app.command("reconcile")
def reconcile(home: HomeOpt, as_json: JsonOpt = False) -> None:
    """Settle what evidence can settle; print what changed."""

    def body() -> None:
        pilot = open_pilot(home, recover=False)
        try:
            changes = pilot.recover()
            left = [
                {"marque_id": r.marque_id, "nonce": r.nonce, "attempt": r.attempt,
                 "status": r.status.value}
                for status in (Status.IN_PROGRESS, Status.INDETERMINATE)
                for r in pilot.ledger.unsettled(status)
            ]
        finally:
            pilot.close()
        if as_json:
            _emit_json({"changed": changes, "still_unsettled": left})
        else:
            for change in changes:
                out.print(f"{change['marque_id']}/{change['nonce']} attempt {change['attempt']}: "
                          f"{change['from']} → {change['to']}")
            if not changes:
                out.print("nothing to settle")

    _guard(as_json, body)


# -- ledger ------------------------------------------------------------------------


@ledger_app.command("stats")
def ledger_stats(home: HomeOpt, as_json: JsonOpt = False) -> None:
    """Ledger size, live marques, unsettled and unreported outcomes."""

    def body() -> None:
        pilot = open_pilot(home, recover=False)
        try:
            stats = pilot.ledger.stats(time.time())
        finally:
            pilot.close()
        if as_json:
            _emit_json(stats)
        else:
            for k, v in stats.items():
                out.print(f"{k:<22} {v}")

    _guard(as_json, body)


@ledger_app.command("reap")
def ledger_reap(home: HomeOpt, as_json: JsonOpt = False) -> None:
    """Delete settled, reported entries of expired marques."""

    def body() -> None:
        pilot = open_pilot(home, recover=False)
        try:
            pilot.report()
            counts = pilot.ledger.reap(time.time() - pilot.options.skew_seconds)
        finally:
            pilot.close()
        if as_json:
            _emit_json({"reaped": counts})
        else:
            out.print(" ".join(f"{k}={v}" for k, v in counts.items()))

    _guard(as_json, body)


# -- demo -----------------------------------------------------------------------------


@app.command("demo")
def demo(as_json: JsonOpt = False) -> None:
    """The whole story on embedded defaults, in a temporary home, narrated."""
    from marque.demo import run_demo

    raise typer.Exit(run_demo(as_json=as_json))


def main() -> None:
    """Console-script entry point."""
    # Driver chatter (e.g. the pool discarding a dropped connection) must not
    # break stderr's JSON-lines contract; outcomes carry what matters.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    logging.getLogger("psycopg").propagate = False
    # typer may vendor its own click: take the exception classes from where it raises them.
    click_errors = sys.modules[typer.BadParameter.__module__]
    try:
        status = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except click_errors.ClickException as exc:
        usage = isinstance(exc, click_errors.UsageError)
        # Errors found by the parser still honour --json's one-object contract.
        if "--json" in sys.argv[1:] and not isinstance(exc, click_errors.NoArgsIsHelpError):
            _emit_json({"error": {"code": InvalidInput.code, "message": exc.format_message(),
                                  "sqlstate": None}})
        else:
            exc.show()
        sys.exit(InvalidInput.exit_status if usage else 1)
    except (KeyboardInterrupt, EOFError):
        sys.exit(130)
    # Without standalone mode a command's typer.Exit comes back as the return value.
    sys.exit(status if isinstance(status, int) else 0)

