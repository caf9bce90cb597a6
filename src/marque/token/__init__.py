"""Marques and their proofs of possession: issuing them and deciding whether to honour them.

A marque (DESIGN §2) is the only thing that lets a Pilot touch a target
database, so this package is where a forged, stale, misdirected or stolen one
must be stopped. It turns the approved work (:class:`Change`, :class:`Budget`,
defined in :mod:`marque.change` and re-exported here) into a signed compact
JWS, and turns a received token back into a :class:`Marque` only after every
rule of DESIGN §2 and RFC 8725 has held:

* only ``EdDSA`` over Ed25519 is accepted — an allow-list, never the token's own
  ``alg`` — and ``typ`` must say what the token is (``marque+jwt``);
* the verifying key is found by ``kid`` in :class:`TrustedKeys` and nowhere
  else: ``jku``, ``x5u``, ``x5c`` and an embedded ``jwk`` never confer trust;
* the claims are checked for shape before any of them is believed, and the
  change must hash to the ``change_cid`` it claims (the CID approval signed);
* the validity window, Pilot identity, ledger incarnation and target are then
  checked, each refusal with its own stable code.

Each execution request also carries an RFC 9449-style proof of possession
signed by the holder key the marque is bound to (``cnf.jkt``); :func:`verify_proof`
checks it and consults the caller's replay cache last, so a refused proof never
burns a ``jti``.

Signatures are made and checked by joserfc; this package only decides *which*
key and algorithm to allow and what the claims must say. Every refusal is a
:mod:`marque.errors` class; foreign exceptions never cross this boundary.

One concept a module:

    jose.py     the one algorithm, its joserfc registry, strict reading of a compact JWS
    claims.py   the shapes claims must have before they are believed
    keys.py     Ed25519 JWKs, thumbprints, the trusted issuer keys
    header.py   what a header must say: alg and typ pinned, the signer found by kid
    marques.py  issuing, reading and checking marques
    proofs.py   proofs of possession and the jti replay window
    service_tokens.py  preview and query tokens: a trusted issuer's short-lived asks

The names below are the package's API; the other Marque tokens (preview and query
tokens in :mod:`marque.token.service_tokens`, signed logbook heads) build on the
modules themselves.
"""

from __future__ import annotations

from marque.change import GUARD_WHEN, ISOLATION_LEVELS, Budget, Change, Guard, Statement
from marque.token.jose import ALG
from marque.token.keys import TrustedKeys, new_key, public_jwk, thumbprint
from marque.token.marques import MARQUE_TYP, Marque, issue_marque, verify_marque
from marque.token.proofs import POP_TYP, make_proof, verify_proof

# Imported by name across Marque but never part of ``*``: redundant aliases keep both so.
from marque.token.marques import check_marque as check_marque  # isort: skip
from marque.token.marques import read_marque as read_marque  # isort: skip
from marque.token.marques import unverified_claims as unverified_claims  # isort: skip
from marque.token.proofs import jti_forget_after as jti_forget_after  # isort: skip

__all__ = [
    "ALG",
    "MARQUE_TYP",
    "POP_TYP",
    "ISOLATION_LEVELS",
    "GUARD_WHEN",
    "Budget",
    "Statement",
    "Guard",
    "Change",
    "Marque",
    "TrustedKeys",
    "new_key",
    "public_jwk",
    "thumbprint",
    "issue_marque",
    "verify_marque",
    "make_proof",
    "verify_proof",
]
