"""The one rule by which Marque's HTTP clients turn an answer back into a typed error.

Both services answer an error as an RFC 9457 problem document made by
:func:`marque.httpcommon.problem` (DESIGN §10). Both clients read it back the same way:

* An answer **is a problem document** when its body is a JSON object with a string
  ``code``. Anything else — a proxy's error page, an empty body, JSON without a code —
  is not the service speaking its API: :func:`problem_error` gives None, and the
  client decides what such an answer means for the call it made (a Harbourmaster's is
  ``harbour_unavailable`` with ``detail.sent`` true; a Pilot's, see
  :mod:`marque.clients.pilot`).
* Its **class** is the one registered for ``code`` (:func:`marque.errors.lookup`), so
  ``self_approval`` is a :class:`~marque.errors.SelfApproval` on the client exactly as
  in the core. A code this installation does not know (a newer server's) is still an
  error: the base :class:`~marque.errors.MarqueError`, with the code kept in
  ``detail["code"]``.
* Its **message** is the problem's ``detail`` (else its ``title``, else the code); its
  **sqlstate** the problem's ``sqlstate`` when that is a string.
* Its **detail** dict holds the extension members the service added (``rule``,
  ``statement``, the ``id`` of a request stored as failed…), and nothing else: the
  members that are the problem itself (``type``, ``title``, ``status``, ``detail``,
  ``code``, ``sqlstate``: :data:`marque.errors.PROBLEM_MEMBERS`) are never read into
  it. So an error crosses a hop unchanged — a Pilot's refusal the Harbourmaster stores
  on a request carries the detail the Pilot gave it, not the HTTP status it came by
  (the class says the status).

An error line of a Pilot's NDJSON stream (``{"event": "error", "error": {code,
message, sqlstate}}``) is read by the same registry: :func:`error_of`.
"""

from __future__ import annotations

from typing import Any

import httpx

from marque.errors import PROBLEM_MEMBERS, MarqueError, lookup

__all__ = ["error_of", "problem_error"]



def error_of(code: object, message: str, sqlstate: object = None,
             detail: dict[str, Any] | None = None) -> MarqueError:
    """The error ``code`` names, with ``message``: its registered class, or the base class
    (keeping ``code`` in its detail) for a code this installation does not know."""
    extra = dict(detail or {})
    try:
        cls = lookup(code) if isinstance(code, str) else MarqueError
    except KeyError:
        cls = MarqueError
    if cls is MarqueError and isinstance(code, str):
        extra["code"] = code
    return cls(message, sqlstate=sqlstate if isinstance(sqlstate, str) else None,
               detail=extra or None)


def problem_error(response: httpx.Response) -> MarqueError | None:
    """The typed error a problem document stands for; None if ``response`` is not one."""
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return None
    code: str = body["code"]
    message = body.get("detail")
    if message is None:
        message = body.get("title", code)
    return error_of(code, str(message), body.get("sqlstate"),
                    {k: v for k, v in body.items() if k not in PROBLEM_MEMBERS})
