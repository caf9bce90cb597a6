"""Signing in through the company's identity provider (OpenID Connect), for the console and
the command line (docs/console.md, "Signing in with OIDC").

    config.py    the settings `harbour oidc set` checks and the store keeps
    admin.py     `harbour oidc set|show|clear`, checked against the provider's discovery
    provider.py  discovery, the JWKS (one rate-limited refetch on an unknown kid), token and
                 revocation calls, on one kept HTTP client per provider
    tokens.py    ID token and logout token checks (joserfc for the signature)
    signin.py    the code flow with PKCE, the command line's exchange, who signed in
    recheck.py   a console session checked again at the provider every recheck interval

The console's routes are in ``harbour/console/oidc.py``; what must hold across processes
(one-time states, tokens exchanged once) is in ``harbour/store/oidc_sql.py``.
"""
