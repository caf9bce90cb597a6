"""What a Marque token's protected header must say before its signature is checked.

Every reader of a Marque token — marques, proofs of possession, preview and
query tokens, signed logbook heads — decides the same two things from the
header, and only from what it allows (RFC 8725 §3.1, §3.11):

* ``alg`` is ``EdDSA``: an allow-list of one, never the token's own choice;
  ``typ`` is the one this reader reads, so one kind of token can never be
  offered as another (:func:`pin_header`);
* the verifying key is the one ``kid`` names in :class:`TrustedKeys` — never
  ``jku``, ``x5u``, ``x5c`` or an embedded ``jwk`` (:func:`trusted_signer`).
  A proof of possession is the exception: it carries its holder key, which its
  reader then matches against the marque's ``cnf.jkt``.

Each reader keeps its own error classes and wording (its refusals' codes are
part of the API); these functions only make the decision the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from joserfc.jwk import OKPKey

from marque.errors import MarqueError
from marque.token.jose import ALG
from marque.token.keys import TrustedKeys

__all__ = ["pin_header", "trusted_signer"]


def pin_header(
    header: dict[str, Any],
    *,
    typ: str,
    what: str,
    error: type[MarqueError],
    typ_first: bool = False,
    offered: Callable[[Any], str] | None = None,
) -> None:
    """Refuse, with ``error``, a header whose ``alg`` is not EdDSA or whose ``typ`` is not ``typ``.

    The refusals read "``what`` alg must be EdDSA" and "``what`` typ must be
    ``typ``", the latter followed by ``offered(the header's typ)`` when given.
    ``typ_first`` checks ``typ`` before ``alg``: the order the proof's and the
    head's readers have always used, so a header wrong in both is refused with
    the same words as before they shared this function.
    """
    got = header.get("typ")
    # One branch decides both orders: a wrong typ is refused first under typ_first, and
    # otherwise only once alg has held. No inner call: read_marque runs this per token.
    if got != typ and (typ_first or header.get("alg") == ALG):
        raise error(f"{what} typ must be {typ}{'' if offered is None else offered(got)}")
    if header.get("alg") != ALG:
        raise error(f"{what} alg must be {ALG}")


def trusted_signer(
    header: dict[str, Any],
    trusted: TrustedKeys,
    *,
    what: str,
    error: type[MarqueError],
    unknown: str,
    empty_is_missing: bool = False,
) -> tuple[str, OKPKey]:
    """The ``kid`` a header names and the trusted key it names; ``error`` otherwise.

    A ``kid`` that is not a string (or, with ``empty_is_missing``, an empty one)
    is refused as "``what`` header has no kid"; one no trusted key has is
    refused with ``unknown``, whose ``{kid}`` is replaced by the ``kid`` (its
    first 64 characters, quoted). :class:`TrustedKeys` never holds an empty
    ``kid``, so an empty one is refused either way; only the words differ.
    """
    kid = header.get("kid")
    if not isinstance(kid, str) or (empty_is_missing and not kid):
        raise error(f"{what} header has no kid")
    key = trusted.get(kid)
    if key is None:
        raise error(unknown.format(kid=repr(kid[:64])))
    return kid, key
