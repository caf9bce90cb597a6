"""The Harbourmaster's web console (DESIGN §12): server-rendered pages at ``/``.

Approvers read the exact stored preview and decide, on-call engineers see
what is stuck and why, auditors check the logbook. The pages are Jinja2
templates (``templates/``) with one stylesheet and a few lines of progressive
JavaScript (``static/``); every action is a plain form that works without it.

    app.py        routes: session, CSRF, one core call, one template
    sessions.py   login sessions kept in the store (HttpOnly, SameSite=Strict cookies)
    csrf.py       per-session CSRF tokens
    oidc.py       signing in through the identity provider; back-channel logout
    views.py      the core's answers shaped for pages; states by word and colour
    pilots.py     the Pilots page: their live health, execution timelines, findings
    logbook.py    logbook pages and the chain's verification
    highlight.py  SQL highlighting that escapes every character

The console calls the same :class:`~marque.harbour.service.Harbourmaster`
methods the HTTP API calls, so access is the core's decision everywhere.
"""

from __future__ import annotations

from marque.harbour.console.app import Console

__all__ = ["Console"]
