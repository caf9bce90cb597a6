"""The bootstrap routing profile (DESIGN §11.3): what a fresh Harbourmaster adopts.

Without an authored config, ``harbour init`` adopts this profile — reads
allowed; ``write``, ``ddl`` and ``other`` delegated to one approver, who may
not be the requester — for every principal, target and resource. It is
adopted durably by its CID and never re-materialised: a later config replaces
it without merging, and nothing restores it because a config went missing.
The text below is therefore frozen; changing one byte of its meaning changes
:data:`BOOTSTRAP_PROFILE`'s CID, which a test pins.
"""

from __future__ import annotations

from typing import Final

from marque.harbour.routing.config import RoutingConfig, parse_config

__all__ = ["BOOTSTRAP_PROFILE_TOML", "BOOTSTRAP_PROFILE"]

#: The bootstrap profile as TOML.
BOOTSTRAP_PROFILE_TOML: Final = """\
# Marque's bootstrap routing profile: reads are allowed; everything else
# needs one approval by someone other than the requester.
version = "marque-routing/0.1"

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = ["read"]
outcome = "allow"

[[entry]]
principal = "*"
target = "*"
resource = "*"
operation = ["write", "ddl", "other"]
outcome = "delegate"
approvals = 1
self_approval = false
"""

#: The bootstrap profile, parsed (a constant value: parsing has no side effects).
BOOTSTRAP_PROFILE: Final[RoutingConfig] = parse_config(BOOTSTRAP_PROFILE_TOML)
