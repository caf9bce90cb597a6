"""The logbook (DESIGN §11.6): one hash chain, shared by both wings and standing below them.

    chain.py     the chain itself: an entry's hash, and the walk that names the first
                 entry where a chain stops holding (independent of where entries live)
    embedded.py  the Pilot's embedded logbook: the chain kept in one SQLite file
    heads.py     signed heads: a Harbourmaster's word for where its chain ended
    audit.py     a whole logbook verified: a store's or a file's chain, its tail against
                 its head row, its outcomes against their Pilots' signatures
    remote.py    a Harbourmaster's logbook verified from outside, over its HTTP API

The Harbourmaster's store keeps its logbook in its own tables
(``harbour/store/sql.py``) on this chain; which home a command was given, and so
which logbook to audit, is decided above both wings (``cli/logbook_homes.py``).
Nothing here imports ``marque.harbour`` or ``marque.pilot``.
"""
