"""The CLI's plumbing: one JSON object on stdout, exit statuses from error classes.

Every command module builds on these few pieces, so the contract of DESIGN §9
lives in one place:

* ``--json`` → exactly one JSON object on stdout; streamed events go to
  stderr as JSON lines.
* A :class:`~marque.errors.MarqueError` becomes ``{"error": {code, message,
  sqlstate}}`` (or one readable line on stderr) and the class's exit status.
* Human output is plain text when stdout is not a terminal (no wrapping, no
  colour codes in a pipe or a log file); colour only on a terminal. Anything
  that came from the command line or a file is printed with its control
  characters escaped, so it can never drive the operator's terminal.

This module imports nothing heavy: the CLI's start-up time is part of its
contract with scripts (``marque exec`` runs once per change).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from marque.errors import InvalidInput, MarqueError, MarqueInvalid
from marque.timefmt import iso_time

F = TypeVar("F", bound=Callable[..., Any])

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_ALL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: A style tag of ``say``'s markup; a bracket escaped by :func:`literal` is text, kept.
_MARKUP = re.compile(r"(?<!\\)\[/?[a-z ]*\]")


class CommandExit(Exception):
    """Raised by a command body to end with an exit status (after printing)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


# -- options shared by many commands ---------------------------------------------------

class _JsonWarnings(logging.Handler):
    """Marque's own warnings in a ``--json`` command, as JSON lines on stderr.

    Without it Python would print them as plain text, the one thing on a
    ``--json`` command's stderr that is not a JSON line. A warning may name its
    stable ``code`` (``log.warning(..., extra={"code": ...})``).
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        emit_event_json({"event": "warning", "code": getattr(record, "code", None),
                         "message": record.getMessage(), "logger": record.name})


def _json_warnings(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    logger = logging.getLogger("marque")
    if value and not any(isinstance(h, _JsonWarnings) for h in logger.handlers):
        logger.addHandler(_JsonWarnings())  # this process runs this one command
    return value


json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_json_warnings,
    help="Print exactly one JSON object on stdout.")
home_option = click.option(
    "--home", type=click.Path(path_type=Path), required=True,
    help="The Pilot's home directory (holds pilot.json, the ledger and the logbook).")
harbour_option = click.option(
    "--harbour", "harbour_url", envvar="MARQUE_HARBOUR", default=None, metavar="URL",
    help="The Harbourmaster service (`marque harbour serve`); default: $MARQUE_HARBOUR.")
token_option = click.option(
    "--token", envvar="MARQUE_TOKEN", default=None,
    help="Your principal's bearer token; default: $MARQUE_TOKEN, else the token `marque "
         "login` stored for this Harbourmaster (prefer those: a command line is visible to "
         "other users of the machine).")


def harbour_options(func: F) -> F:
    """``--harbour`` and ``--token`` (with their environment defaults)."""
    return harbour_option(token_option(func))


# -- output -----------------------------------------------------------------------------


def printable(text: object) -> str:
    """``text`` with control characters escaped (``\\x1b`` and the like), newlines kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def emit_json(obj: dict[str, Any]) -> None:
    """The one JSON object of a ``--json`` command, on stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def emit_event_json(event: dict[str, Any]) -> None:
    """One streamed event, as a JSON line on stderr."""
    sys.stderr.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stderr.flush()


class _Stream:
    """Human output on one stream: colour on a terminal, plain text elsewhere."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._console: Any = None

    @property
    def _file(self) -> Any:
        return sys.stdout if self._name == "stdout" else sys.stderr

    def _tty(self) -> bool:
        try:
            return bool(self._file.isatty()) and os.environ.get("NO_COLOR") is None
        except (AttributeError, ValueError):
            return False

    def say(self, markup: str) -> None:
        """Print one line. ``markup`` may use rich's ``[style]…[/]``; values must be escaped
        with :func:`literal` first."""
        if self._tty():
            if self._console is None:
                from rich.console import Console  # only a terminal pays for rich

                self._console = Console(file=self._file, highlight=False, soft_wrap=True)
            self._console.print(markup)
        else:
            self._file.write(_plain(markup) + "\n")
            self._file.flush()


def _plain(markup: str) -> str:
    text = _MARKUP.sub("", markup)
    return text.replace("\\[", "[")


def literal(value: object) -> str:
    """A value for :meth:`_Stream.say`: control characters and markup brackets escaped."""
    return printable(value).replace("[", "\\[")


def one_line(value: object) -> str:
    """Like :func:`literal`, for a value that must stay on its line (an id, a nonce, an
    event field): tabs and newlines are escaped too."""
    text = _CONTROL_ALL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return text.replace("[", "\\[")


out = _Stream("stdout")
err = _Stream("stderr")


def when(epoch: float | None) -> str:
    """An epoch time as an operator reads it: ISO 8601 UTC to the second."""
    return iso_time(epoch)


# -- errors and exit statuses -----------------------------------------------------------


def fail(exc: MarqueError, as_json: bool, extra: dict[str, Any] | None = None) -> NoReturn:
    """Print a Marque error (JSON or one line) and end with its class's exit status.

    With ``--json`` the error object is ``{code, message, sqlstate}`` and, when the
    error knows more than its message (the rule that refused, the target, the attempts
    left unsettled…), ``detail``: a script should not have to parse the message.
    """
    if as_json:
        error = exc.to_dict()
        if detail := exc.json_detail():
            error["detail"] = detail
        emit_json({**(extra or {}), "error": error})
    else:
        err.say(f"[bold red]{exc.kind}[/]: [bold]{exc.code}[/] — {literal(exc.message)}")
    raise CommandExit(exc.exit_status)


def guarded(func: F) -> F:
    """Run a command body; a Marque error becomes its output and exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MarqueError as exc:
            fail(exc, bool(kwargs.get("as_json")))

    return wrapper  # type: ignore[return-value]


def one_shot(func: F) -> F:
    """Run a command body that does one thing and exits with the cyclic collector off.

    ``marque exec`` allocates a few hundred thousand objects while it imports and then
    runs one execution; the collector's passes over them are wasted work in a process
    that ends a moment later (reference counting still frees what it can). The
    collector is on again afterwards, if it was on before.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper  # type: ignore[return-value]


# -- reading inputs -----------------------------------------------------------------------


def read_marque_file(path: Path) -> str:
    """The marque in ``path``, stripped; a file that holds none is ``marque_invalid``.

    A missing or unreadable file is a usage error (the command named the wrong
    thing); a readable file that is empty, binary or otherwise not a marque is
    one answer, ``marque_invalid``, whatever is wrong with it.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise InvalidInput(f"marque file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise InvalidInput(f"marque file {path} is a directory, not a file") from exc
    except OSError as exc:
        raise InvalidInput(f"cannot read marque file {path}: {exc.strerror}") from exc
    token = raw.strip()
    if not token:
        raise MarqueInvalid(f"marque file {path} is empty: it holds no marque")
    if not token.isascii():
        raise MarqueInvalid(f"marque file {path} does not hold a marque: a marque is ASCII "
                            "text (header.payload.signature, as `marque issue` prints it)")
    # Whatever else is in the file is the marque the caller means; the Pilot says if it is one.
    return token.decode("ascii")


def read_json_file(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a file; anything else is ``input_invalid`` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidInput(f"{what} {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise InvalidInput(f"{what} {path} is a directory, not a file") from exc
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{what} {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} {path} is not a JSON object")
    return data


def write_private(path: Path, data: dict[str, Any]) -> None:
    """Write a secret JSON file readable by its owner only; never overwrites."""
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
        raise InvalidInput(f"not a positive duration: \"{printable(text)}\" "
                           "(use e.g. 90s, 15m, 2h, 1d)")
    return int(match.group(1)) * _UNIT[match.group(2)]


def redact(dsn: str) -> str:
    """A DSN with its password replaced by ``***``."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", dsn)
