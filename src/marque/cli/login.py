"""``marque login`` / ``marque logout``: a principal's token kept per Harbourmaster URL.

So that ``MARQUE_TOKEN`` is optional: ``marque login --harbour URL`` reads the
token from stdin (or a hidden prompt on a terminal — never from the command
line unless ``--token`` is given on purpose), asks the Harbourmaster whom it
authenticates (``GET /v1/whoami``), and only then keeps it in
``$XDG_CONFIG_HOME/marque/credentials.json`` (default ``~/.config/marque/``),
a file only its owner may read (0600, in a 0700 directory). Commands that
talk to a Harbourmaster use, in order: ``--token``, ``MARQUE_TOKEN``, the
token stored for that URL (normalised: scheme and host in lower case, no
default port, no trailing slash).

The file is rewritten whole through a temporary file and a rename, under an
advisory lock, so two logins at once never leave half a file. A file others
can read is refused rather than used: the token in it may have leaked.

``marque logout`` forgets the entry first, then ends the Harbourmaster's own token of a
sign-in through the identity provider on the server
(:func:`~marque.cli.device_login.end_sign_in`) and revokes at the provider the refresh
token it kept (:func:`~marque.cli.device_login.revoke_sign_in`): a provider or
Harbourmaster that cannot be reached, or refuses, is a warning, never a reason to keep
the entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click

from marque.cli.common import emit_event_json, emit_json, err, guarded, json_option, literal, out
from marque.errors import (
    InvalidInput,
    MarqueError,
    OidcLoginRefused,
    OidcSubjectUnknown,
    Unauthenticated,
)

VERSION = "marque-credentials/0.1"
FILE_NAME = "credentials.json"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/marque`` (an absolute ``XDG_CONFIG_HOME`` only), else
    ``~/.config/marque``."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if base and os.path.isabs(base):
        return Path(base) / "marque"
    try:
        return Path.home() / ".config" / "marque"
    except RuntimeError:  # no HOME and no passwd entry
        raise InvalidInput("no configuration directory: set XDG_CONFIG_HOME or HOME, or give "
                           "the token with MARQUE_TOKEN") from None


def normalise_url(url: str) -> str:
    """The key a Harbourmaster URL is stored under: ``scheme://host[:port][/path]``, the
    scheme and host in lower case, a default port and trailing slashes dropped."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise InvalidInput(f"not a Harbourmaster URL: {url[:200]!r} (use http:// or https://)")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("a Harbourmaster URL must not carry a user name or password")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"not a Harbourmaster URL: {url[:200]!r} ({exc})") from None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


def _path() -> Path:
    return config_dir() / FILE_NAME


def _read(path: Path) -> dict[str, Any]:
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(f"{path} may be read by other users (mode "
                           f"{stat.S_IMODE(info.st_mode):o}); its tokens may have leaked: "
                           "`chmod 600` it, or remove it and log in again")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a readable credentials file ({type(exc).__name__}); "
                           "remove it and log in again") from None
    harbours = data.get("harbours") if isinstance(data, dict) else None
    if not isinstance(harbours, dict):
        raise InvalidInput(f"{path} is not a credentials file of this Marque; remove it and "
                           "log in again")
    return harbours


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    """The credentials file's path, with its directory made (0700) and its lock held."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    fd = os.open(directory / ".credentials.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield directory / FILE_NAME
    finally:
        os.close(fd)


def _write(path: Path, harbours: dict[str, Any]) -> None:
    temporary = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"version": VERSION, "harbours": harbours}, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


#: A sign-in through the identity provider is renewed this long before it would expire
#: (or a quarter of its life, if that is shorter: it may last only a minute).
RENEW_BEFORE_SECONDS = 60


def _renew_at(entry: dict[str, Any]) -> float | None:
    """When the sign-in kept in ``entry`` is renewed; None for a token that is not."""
    expires_at, saved_at = entry.get("expires_at"), entry.get("saved_at")
    if not isinstance(expires_at, int | float):
        return None
    life = expires_at - saved_at if isinstance(saved_at, int | float) else expires_at
    return float(expires_at) - min(RENEW_BEFORE_SECONDS, max(0.0, life) / 4)


def stored_token(url: str) -> str | None:
    """The token ``marque login`` stored for the Harbourmaster at ``url``, or None.

    A sign-in through the identity provider that has (nearly) expired is renewed with the
    provider's refresh token, if one was kept, and the new token stored; without one it is
    ``Unauthenticated`` saying to sign in again (never sent, to be refused). A renewal the
    provider or the Harbourmaster refuses drops the kept sign-in and raises that refusal;
    one that cannot reach them keeps it, to try again."""
    key = normalise_url(url)
    entry = _read(_path()).get(key)
    if not isinstance(entry, dict):
        return None
    token = entry.get("token")
    renew_at = _renew_at(entry)
    if renew_at is not None and time.time() >= renew_at:
        return _renewed(key)
    return token if isinstance(token, str) and token else None


def _renewed(key: str) -> str:
    """Renew the sign-in kept for ``key`` (under the file's lock: one renewal at a time)."""
    from marque.cli.device_login import refresh_sign_in

    with _locked() as path:
        harbours = _read(path)
        found = harbours.get(key)
        entry: dict[str, Any] = found if isinstance(found, dict) else {}
        renew_at = _renew_at(entry)
        if renew_at is not None and time.time() < renew_at:
            return str(entry["token"])  # another command renewed it meanwhile
        refresh = entry.get("refresh_token")
        if not isinstance(refresh, str) or not refresh:
            raise Unauthenticated(f"your sign-in to {key} through the identity provider has "
                                  "expired: run `marque login --oidc` again",
                                  detail={"reason": "expired"})
        try:
            current = entry.get("token")
            signed = refresh_sign_in(key, refresh, current if isinstance(current, str) else None)
        except (OidcLoginRefused, OidcSubjectUnknown, Unauthenticated):
            # Refused (not merely unreachable): the kept sign-in is dropped, never sent again.
            del harbours[key]
            _write(path, harbours)
            raise
        entry = {**entry, "token": signed["token"], "expires_at": float(signed["expires_at"]),
                 "refresh_token": signed.get("refresh_token"), "saved_at": time.time()}
        harbours[key] = entry
        _write(path, harbours)
        return str(signed["token"])


def _read_token(token: str | None) -> str:
    if token is not None:
        return token
    if sys.stdin is not None and sys.stdin.isatty():
        entered: str = click.prompt("Token", hide_input=True, err=True)
        return entered
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line.strip():
        raise InvalidInput("no token on stdin: pipe it in (`marque login --harbour URL < "
                           "token-file`) or run the command on a terminal to be asked for it")
    return line


@click.command("login")
@click.option("--harbour", "harbour_url", envvar="MARQUE_HARBOUR", required=True,
              metavar="URL", help="The Harbourmaster to log in to; default: $MARQUE_HARBOUR.")
@click.option("--token", default=None,
              help="The token itself (discouraged: a command line is visible to other users; "
                   "by default it is read from stdin, or asked for on a terminal).")
@click.option("--oidc", "use_oidc", is_flag=True,
              help="Sign in through the Harbourmaster's identity provider (device "
                   "authorization grant: prints a URL and a code to confirm in a browser).")
@json_option
@guarded
def login(harbour_url: str, token: str | None, use_oidc: bool, as_json: bool) -> None:
    """Check a principal's token with the Harbourmaster, then keep it for that URL.

    Prints whom it authenticates, never the token. A token the Harbourmaster
    does not accept is `unauthenticated` and nothing is stored. With `--oidc`,
    sign in at the identity provider instead; the Harbourmaster's token it
    answers lasts its recheck interval (an hour at most).
    """
    from marque.clients.harbour import HarbourClient

    key = normalise_url(harbour_url)
    expires_at = None
    if use_oidc:
        if token is not None:
            raise InvalidInput("--oidc signs in at the identity provider: give no --token")
        from marque.cli.device_login import device_sign_in

        signed = device_sign_in(key)
        secret, expires_at = str(signed["token"]), float(signed["expires_at"])
        refresh = signed.get("refresh_token")
    else:
        secret = _read_token(token)
    with HarbourClient(harbour_url, secret) as client:
        who = client.whoami()
        secret = client.token or secret
    with _locked() as path:
        harbours = _read(path)
        harbours[key] = {"token": secret, "principal": who.get("name"),
                         "saved_at": time.time()}
        if expires_at is not None:
            harbours[key].update(expires_at=expires_at, via="oidc", refresh_token=refresh)
        _write(path, harbours)
    result = {"harbour": key, "principal": who.get("name"), "roles": who.get("roles"),
              "path": str(path), "expires_at": expires_at}
    if as_json:
        emit_json(result)
        return
    out.say(f"logged in to {literal(key)} as {literal(who.get('name'))} "
            f"({literal(', '.join(who.get('roles') or []))}); token kept in {literal(path)}")


def _asked(key: str, done: str, ask: Callable[[], bool]) -> dict[str, Any]:
    """``{harbour, <done>, code, message}`` of one call made for a forgotten sign-in: what
    ``ask`` answered, or false with the reason it failed (logged out here all the same:
    the caller warns)."""
    try:
        answered = ask()
    except MarqueError as exc:
        return {"harbour": key, done: False, "code": exc.code, "message": exc.message}
    return {"harbour": key, done: answered, "code": None, "message": None}


def _revoked(key: str, entry: Any) -> dict[str, Any] | None:
    """Revoke the provider's refresh token a forgotten sign-in kept (None when it kept
    none): ``{harbour, revoked, code, message}``, the reason when it was not."""
    refresh = entry.get("refresh_token") if isinstance(entry, dict) else None
    if not isinstance(refresh, str) or not refresh:
        return None
    from marque.cli.device_login import revoke_sign_in

    def revoke() -> bool:
        revoke_sign_in(key, refresh)
        return True

    return _asked(key, "revoked", revoke)


def _ended(key: str, entry: Any) -> dict[str, Any] | None:
    """End on the Harbourmaster the session of a forgotten sign-in through the provider
    (None for a principal's token, which has none): ``{harbour, ended, code, message}``;
    ``ended`` false with no code when it had already ended, with the reason when it could
    not be ended."""
    token = entry.get("token") if isinstance(entry, dict) else None
    if not isinstance(token, str) or not token.startswith("mqs_"):
        return None
    from marque.cli.device_login import end_sign_in

    return _asked(key, "ended", lambda: end_sign_in(key, token))


def _warnings(sessions: list[dict[str, Any]],
              revocations: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(code, text)`` of each session not ended and refresh token not revoked."""
    return [*((s["code"], f"the Harbourmaster's token for {s['harbour']} was not ended "
                          f"there ({s['code']}: {s['message']}); it stays valid until it "
                          "expires; you are logged out here all the same")
              for s in sessions if s["code"] is not None),
            *((r["code"], f"the identity provider's refresh token for {r['harbour']} was "
                          f"not revoked ({r['code']}: {r['message']}); you are logged out "
                          "here all the same") for r in revocations if not r["revoked"])]


@click.command("logout")
@click.option("--harbour", "harbour_url", envvar="MARQUE_HARBOUR", default=None,
              metavar="URL", help="The Harbourmaster to forget (default: $MARQUE_HARBOUR; "
                                  "with neither, every stored login).")
@json_option
@guarded
def logout(harbour_url: str | None, as_json: bool) -> None:
    """Forget the token `marque login` kept; a sign-in through the identity provider also
    has its Harbourmaster's token ended on the server and its refresh token revoked at the
    provider (if either fails, a warning: the login is forgotten all the same). A
    principal's token itself stays valid until an admin rotates or revokes it."""
    key = None if harbour_url is None else normalise_url(harbour_url)
    forgotten: dict[str, Any] = {}
    if _path().exists():
        with _locked() as path:
            harbours = _read(path)
            names = sorted(harbours) if key is None else [k for k in harbours if k == key]
            forgotten = {name: harbours.pop(name) for name in names}
            _write(path, harbours)
    removed = sorted(forgotten)
    # Only once forgotten here (and outside the file's lock): being logged out must never
    # depend on the Harbourmaster or the provider answering.
    # The Harbourmaster's session first, then the provider's grant.
    sessions = [found for name in removed
                if (found := _ended(name, forgotten[name])) is not None]
    revocations = [found for name in removed
                   if (found := _revoked(name, forgotten[name])) is not None]
    warnings = _warnings(sessions, revocations)
    if as_json:
        for code, warning in warnings:
            emit_event_json({"event": "warning", "code": code, "message": warning})
        emit_json({"removed": removed, "sessions": sessions, "revocations": revocations})
        return
    if removed:
        out.say(f"logged out of {literal(', '.join(removed))}")
        for done in (s for s in sessions if s["ended"]):
            out.say(f"the Harbourmaster's token for {literal(done['harbour'])} is ended")
        for done in (r for r in revocations if r["revoked"]):
            out.say(f"the identity provider's refresh token for {literal(done['harbour'])} "
                    "is revoked")
    for _, warning in warnings:
        err.say(f"[bold yellow]warning[/]: {literal(warning)}")
    if not removed:
        out.say("no stored login" + ("" if key is None else f" for {literal(key)}"))
