"""A Harbourmaster's OpenID Connect settings (docs/console.md, "Signing in with OIDC").

``marque harbour oidc set`` checks these and keeps them in the store (one row, logged),
so every ``harbour serve`` sharing a store signs people in the same way. The client
secret is not in the store: its **file** is named, and read when a sign-in needs it, so
a copy of the store holds nothing a provider would accept — the same rule as tokens. (The
refresh tokens kept with console sessions for their checks are redeemed only with that
secret: the console is a confidential client.)

The checks are those a reviewer would make: an issuer is ``https`` (plain ``http`` only
on a loopback address, for a provider on this machine), a client id and secret file are
given, the secret file is readable by its owner only, the subject claim is a plain claim
name, a groups mapping names only the console's roles (never ``pilot``: a machine's role
is granted by an admin, not by a group), and ``require`` is only allowed with a working
configuration. A setting that fails a check is :class:`~marque.errors.OidcConfigInvalid`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from marque.errors import OidcConfigInvalid
from marque.harbour.principals import Role

VERSION = "marque-oidc-config/0.1"
#: Roles a group may grant. ``pilot`` is not one: only an admin makes a Pilot principal.
GROUP_ROLES = frozenset({Role.REQUESTER, Role.APPROVER, Role.AUDITOR, Role.ADMIN})
DEFAULT_SCOPES = ("openid", "email")
#: How often a sign-in is checked again at the provider (docs/console.md), by default, and
#: the bounds a setting must keep: not so often that every page waits on the provider, and
#: never longer than a console session lasts (then it would never be checked).
RECHECK_SECONDS = 300
RECHECK_BOUNDS = (60, 8 * 3600)
_CLAIM = re.compile(r"^[A-Za-z0-9_:./-]{1,64}$")
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,64}$")
_MAX_SECRET_BYTES = 4096


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_issuer(issuer: str) -> str:
    """The issuer URL as given, if it can be one: https, or http on a loopback host; no
    query, fragment or credentials (OpenID Connect Discovery §3)."""
    parts = urlsplit(issuer)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise OidcConfigInvalid(f"the issuer must be an https URL, got {issuer[:200]!r}",
                                detail={"setting": "issuer"})
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise OidcConfigInvalid("the issuer must use https (plain http is allowed only for a "
                                f"provider on a loopback address), got {issuer[:200]!r}",
                                detail={"setting": "issuer"})
    if parts.query or parts.fragment or parts.username or parts.password:
        raise OidcConfigInvalid("the issuer URL must not carry a query, a fragment or "
                                "credentials", detail={"setting": "issuer"})
    return issuer


def check_redirect_uri(uri: str) -> str:
    """An absolute http(s) URL ending in ``/oidc/callback`` (where the console listens)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("https", "http") or not parts.hostname \
            or not parts.path.endswith("/oidc/callback") or parts.query or parts.fragment:
        raise OidcConfigInvalid("the redirect URI must be the console's absolute URL ending "
                                f"in /oidc/callback, got {uri[:200]!r}",
                                detail={"setting": "redirect_uri"})
    return uri


def read_secret(path: str) -> str:
    """The client secret in ``path``: one line, the file readable by its owner only."""
    file = Path(path)
    try:
        info = file.stat()
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise OidcConfigInvalid(f"the client secret file {path} may be read by other users "
                                    f"(mode {stat.S_IMODE(info.st_mode):o}): `chmod 600` it",
                                    detail={"setting": "client_secret_file"})
        raw = file.read_bytes()[:_MAX_SECRET_BYTES + 1]
    except FileNotFoundError:
        raise OidcConfigInvalid(f"the client secret file {path} does not exist",
                                detail={"setting": "client_secret_file"}) from None
    except OSError as exc:
        raise OidcConfigInvalid(f"cannot read the client secret file {path}: {exc.strerror}",
                                detail={"setting": "client_secret_file"}) from None
    try:
        secret = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        secret = ""
    if not secret or len(raw) > _MAX_SECRET_BYTES or any(c.isspace() for c in secret):
        raise OidcConfigInvalid(f"the client secret file {path} must hold the secret on one "
                                "line", detail={"setting": "client_secret_file"})
    return secret


def _check_claim(name: str, setting: str) -> str:
    if not isinstance(name, str) or not _CLAIM.match(name):
        raise OidcConfigInvalid(f"{setting} must be a claim name (letters, digits, _:./-), "
                                f"got {str(name)[:80]!r}", detail={"setting": setting})
    return name


def parse_group_role(text: str) -> tuple[str, Role]:
    """``GROUP=ROLE`` as given to ``--group-role``."""
    group, sep, role = text.rpartition("=")
    if not sep or not group or not role:
        raise OidcConfigInvalid(f"--group-role takes GROUP=ROLE, got {text[:120]!r}",
                                detail={"setting": "group_roles"})
    try:
        parsed = Role(role)
    except ValueError:
        parsed = None
    if parsed not in GROUP_ROLES:
        allowed = ", ".join(sorted(r.value for r in GROUP_ROLES))
        raise OidcConfigInvalid(f"a group may grant only {allowed}; got {role[:40]!r}",
                                detail={"setting": "group_roles"})
    assert parsed is not None
    return group, parsed


@dataclass(frozen=True)
class OidcConfig:
    """The settings, checked. ``group_roles`` maps a group to the roles it grants."""

    issuer: str
    client_id: str
    client_secret_file: str
    subject_claim: str = "sub"
    groups_claim: str | None = None
    group_roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    require: bool = False
    cli_client_id: str | None = None
    redirect_uri: str | None = None
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    recheck_seconds: int = RECHECK_SECONDS

    def __post_init__(self) -> None:
        check_issuer(self.issuer)
        for setting in ("client_id", "cli_client_id"):
            value = getattr(self, setting)
            if value is None and setting == "cli_client_id":
                continue
            if not isinstance(value, str) or not value.strip() or len(value) > 256:
                raise OidcConfigInvalid(f"{setting} must be a non-empty string",
                                        detail={"setting": setting})
        if not os.path.isabs(self.client_secret_file):
            raise OidcConfigInvalid("the client secret file must be an absolute path (every "
                                    "`harbour serve` reads it)",
                                    detail={"setting": "client_secret_file"})
        _check_claim(self.subject_claim, "subject_claim")
        if self.groups_claim is not None:
            _check_claim(self.groups_claim, "groups_claim")
        if bool(self.groups_claim) != bool(self.group_roles):
            raise OidcConfigInvalid("a groups claim and at least one --group-role go together: "
                                    "give both, or neither", detail={"setting": "group_roles"})
        for group, roles in self.group_roles.items():
            for role in roles:
                parse_group_role(f"{group}={role}")
        if self.redirect_uri is not None:
            check_redirect_uri(self.redirect_uri)
        if "openid" not in self.scopes or not all(_SCOPE.match(s) for s in self.scopes):
            raise OidcConfigInvalid("the scopes must include openid and be plain scope tokens",
                                    detail={"setting": "scopes"})
        low, high = RECHECK_BOUNDS
        if not isinstance(self.recheck_seconds, int) or isinstance(self.recheck_seconds, bool) \
                or not low <= self.recheck_seconds <= high:
            raise OidcConfigInvalid(f"the recheck interval must be {low} to {high} seconds, "
                                    f"got {str(self.recheck_seconds)[:40]!r}",
                                    detail={"setting": "recheck_seconds"})

    @property
    def roles_from(self) -> str:
        """``groups`` when a groups claim grants the roles, else ``principal``."""
        return "groups" if self.groups_claim else "principal"

    def roles_for(self, groups: Any) -> frozenset[Role]:
        """The roles the claim's groups grant (none for a claim that is not a list of
        strings: a malformed claim grants nothing)."""
        if not isinstance(groups, list):
            return frozenset()
        granted: set[Role] = set()
        for group in groups:
            if isinstance(group, str):
                granted.update(Role(r) for r in self.group_roles.get(group, ()))
        return frozenset(granted)

    def to_dict(self) -> dict[str, Any]:
        """The settings as stored and shown (no secret: only its file's path)."""
        return {"version": VERSION, "issuer": self.issuer, "client_id": self.client_id,
                "client_secret_file": self.client_secret_file,
                "subject_claim": self.subject_claim, "groups_claim": self.groups_claim,
                "group_roles": {g: list(r) for g, r in sorted(self.group_roles.items())},
                "require": self.require, "cli_client_id": self.cli_client_id,
                "redirect_uri": self.redirect_uri, "scopes": list(self.scopes),
                "recheck_seconds": self.recheck_seconds}

    @classmethod
    def from_dict(cls, data: Any) -> OidcConfig:
        """The stored settings; anything else is ``oidc_config_invalid`` (never a guess)."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise OidcConfigInvalid("the stored OIDC settings are not this Marque's: set them "
                                    "again with `marque harbour oidc set`")
        try:
            return cls(issuer=data["issuer"], client_id=data["client_id"],
                       client_secret_file=data["client_secret_file"],
                       subject_claim=data["subject_claim"], groups_claim=data["groups_claim"],
                       group_roles={g: tuple(r) for g, r in data["group_roles"].items()},
                       require=bool(data["require"]), cli_client_id=data["cli_client_id"],
                       redirect_uri=data["redirect_uri"], scopes=tuple(data["scopes"]),
                       # Settings kept before the interval existed get the default.
                       recheck_seconds=data.get("recheck_seconds", RECHECK_SECONDS))
        except (KeyError, TypeError, AttributeError) as exc:
            raise OidcConfigInvalid(f"the stored OIDC settings lack {exc}: set them again with "
                                    "`marque harbour oidc set`") from None
