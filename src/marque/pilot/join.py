"""``marque pilot join``: a Pilot joins a Harbourmaster.

Joining does three things, all or nothing:

1. fetch the Harbourmaster's issuer keys (``GET /.well-known/jwks.json``) and
   check every one is a public Ed25519 JWK;
2. register (``POST /v1/pilots``) with the Pilot's id, service URL,
   incarnation and targets (each with its dialect), and check the
   Harbourmaster answered for this Pilot;
3. only then write ``pilot.json``: the keys trusted (pinned), and the
   ``harbour`` section ``{url, token, pilot_url}`` — written 0600, as the
   token is a secret.

The registration carries the public half of the Pilot's report key
(``report-key.jwk`` in its home, made here if the home has none), which the
Harbourmaster keeps and checks every report's signature against.

A join that fails at any step leaves ``pilot.json`` as it was. Joining again
(the same or another Harbourmaster) replaces the ``harbour`` section and adds
keys; keys trusted before stay trusted until ``marque pilot untrust``.
"""

from __future__ import annotations

import os
from typing import Any

from marque.errors import Conflict, HarbourUnavailable, InvalidInput, MarqueError
from marque.pilot.config import HarbourLink, check_http_url
from marque.pilot.harbour_link import client_for, register, registration_body
from marque.pilot.home import PilotHome
from marque.pilot.home_binding import open_bound_ledger
from marque.pilot.report_key import ensure_report_key

__all__ = ["join", "pinned_keys"]


def pinned_keys(harbour_url: str, jwks: Any) -> list[dict[str, Any]]:
    """The issuer keys of a JWKS, checked: a non-empty list of public Ed25519 JWKs.

    Anything else — no ``keys``, a private key, a key the Pilot cannot verify
    with, two keys claiming one kid — is ``HarbourUnavailable`` (what answered
    does not speak the Harbourmaster's API, as :mod:`marque.clients.harbour`
    says of any such answer): nothing from it is trusted.
    """
    from marque.token import TrustedKeys

    where = f"{harbour_url}/.well-known/jwks.json"
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(keys, list) or not keys:
        raise HarbourUnavailable(
            f"{where} is not a JWKS with issuer keys ({{\"keys\": [JWK, …]}}): is this a "
            "Harbourmaster's URL? Nothing was trusted")
    trusted = TrustedKeys()
    for index, jwk in enumerate(keys):
        if not isinstance(jwk, dict) or "d" in jwk:
            raise HarbourUnavailable(f"{where}: keys[{index}] is not a public JWK (a "
                                     "Harbourmaster publishes public keys only); nothing was "
                                     "trusted")
        try:
            trusted.add(jwk)
        except MarqueError as exc:
            raise HarbourUnavailable(f"{where}: keys[{index}]: {exc.message}; nothing was "
                                     "trusted") from exc
    return trusted.to_jwks()["keys"]


def join(home: str | os.PathLike[str], harbour_url: str, token: str,
         pilot_url: str) -> dict[str, Any]:
    """Join the Harbourmaster at ``harbour_url`` with this Pilot's ``token``; returns
    ``{pilot_id, incarnation, harbour, pilot_url, trusted, report_key,
    previous_incarnation}``.

    ``pilot_url`` is where the Harbourmaster reaches this Pilot's service
    (``marque pilot serve``). ``trusted`` lists the kids of the pinned issuer
    keys; ``report_key`` is the kid of the report key registered;
    ``previous_incarnation`` is what the Harbourmaster knew before (None for a
    first join). Refusals: the Harbourmaster unreachable
    (``harbour_unavailable``), the token unknown there (``unauthenticated``) or
    bound to another Pilot (``forbidden``, or ``conflict`` if it answered for
    another pilot id), an answer that is not a JWKS (``harbour_unavailable``).
    """
    from marque.token import TrustedKeys

    harbour_url = check_http_url(harbour_url, "--harbour")
    pilot_url = check_http_url(pilot_url, "--url")
    # The section's own checks (the token's shape) before anything goes on the wire.
    try:
        link = HarbourLink.from_dict({"url": harbour_url, "token": token,
                                      "pilot_url": pilot_url})
    except MarqueError as exc:
        raise InvalidInput(exc.message.replace("harbour.token", "--token")) from exc
    pilot_home = PilotHome(home)
    config = pilot_home.load()
    ledger = open_bound_ledger(pilot_home, config)
    try:
        pilot_id, incarnation = ledger.pilot_id, ledger.incarnation
    finally:
        ledger.close()

    with client_for(url=harbour_url) as client:
        keys = pinned_keys(harbour_url, client.jwks())
    targets = {name: pilot_home.resolve(dsn) for name, dsn in config.targets.items()}
    report_key = ensure_report_key(pilot_home)
    answer = register(link, registration_body(pilot_id, incarnation, link, targets,
                                              report_key))
    _same_keys(harbour_url, keys, answer)

    trusted = TrustedKeys(config.issuers)
    kids = [trusted.add(jwk) for jwk in keys]
    config.issuers = trusted.to_jwks()["keys"]
    config.harbour = link
    pilot_home.save(config)
    from marque.token.keys import thumbprint

    return {"pilot_id": pilot_id, "incarnation": incarnation, "harbour": harbour_url,
            "pilot_url": pilot_url, "trusted": kids, "report_key": thumbprint(report_key),
            "previous_incarnation": answer.get("previous_incarnation")}


def _same_keys(harbour_url: str, keys: list[dict[str, Any]], answer: dict[str, Any]) -> None:
    """The registration answer names the issuer's keys too: they must be the JWKS's.

    Two answers from one Harbourmaster that disagree about its keys mean the
    URL does not lead to one service (a proxy, a half-finished key rotation);
    pinning either would be a guess.
    """
    from marque.token import thumbprint

    issuer = answer.get("issuer")
    jwks = issuer.get("jwks") if isinstance(issuer, dict) else None
    if jwks is None:
        return
    answered = pinned_keys(harbour_url, jwks)
    if {thumbprint(k) for k in answered} != {thumbprint(k) for k in keys}:
        raise Conflict(
            f"the Harbourmaster at {harbour_url} published one set of issuer keys at "
            "/.well-known/jwks.json and answered the registration with another; nothing was "
            "trusted. Join again once its keys are settled",
        )
