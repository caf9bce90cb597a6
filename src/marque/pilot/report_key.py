"""A Pilot's report key: the Ed25519 key it signs the reports it delivers with.

The key lives in the Pilot's home as ``report-key.jwk`` (a private JWK,
readable by its owner only, like the bearer token in ``pilot.json``). It is
made by ``pilot init``, or by the first ``pilot join`` or ``pilot serve`` of
a home that has none, and never replaced by Marque: its public half is what
the Pilot registers with its Harbourmaster, which from then on takes only
reports signed with it (:mod:`marque.harbour.reports`). Losing or replacing
the file means registering a new key, which the Harbourmaster logs as a
finding.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from marque.errors import ConfigInvalid, InvalidInput
from marque.pilot.home import PilotHome

__all__ = ["REPORT_KEY_FILE", "ensure_report_key", "load_report_key"]

#: The report key's file in a Pilot's home.
REPORT_KEY_FILE = "report-key.jwk"


def load_report_key(pilot_home: PilotHome) -> dict[str, Any] | None:
    """The home's private report key, or None if it has none; ``ConfigInvalid`` if the
    file is there but is not a private Ed25519 JWK."""
    from marque.token.keys import import_private

    path = pilot_home.path / REPORT_KEY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalid(f"cannot read the report key {path}: {exc}") from exc
    try:
        jwk = json.loads(text)
        import_private(jwk, "report key")
    except (ValueError, InvalidInput) as exc:
        raise ConfigInvalid(f"{path} is not a private Ed25519 JWK; restore it, or remove it "
                            "and let `marque pilot join` make and register a new one") from exc
    return dict(jwk)


def ensure_report_key(pilot_home: PilotHome) -> dict[str, Any]:
    """The home's report key, made (0600, never overwriting one made meanwhile) if missing."""
    from marque.token.keys import new_key

    held = load_report_key(pilot_home)
    if held is not None:
        return held
    path = pilot_home.path / REPORT_KEY_FILE
    jwk = new_key()
    try:
        # Written whole beside it, then linked into place: a reader never sees half a key,
        # and a key another process linked first is never overwritten.
        fd, tmp = tempfile.mkstemp(dir=pilot_home.path, prefix=".report-key.", suffix=".jwk")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), 0o600)
                json.dump(jwk, handle, indent=2, sort_keys=True)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
    except FileExistsError:
        made = load_report_key(pilot_home)
        if made is None:
            raise ConfigInvalid(f"{path} appeared and vanished while it was made") from None
        return made
    except OSError as exc:
        raise InvalidInput(f"cannot write the report key {path}: {exc.strerror}") from exc
    return jwk
