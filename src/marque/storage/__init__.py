"""Storage plumbing below every store: what the ledger, the Harbourmaster's store, the
logbook and the target stamps share, and nothing that knows their tables.

    tx.py          one open transaction (``Tx``): the interface every store's SQL runs on
    sqlite.py      opening a SQLite file durably (WAL, ``synchronous=FULL``) and its
                   ``BEGIN IMMEDIATE`` write transaction
    pgpool.py      PostgreSQL connection pools: checkout that reports a refusing server
                   at once, idle connections pinged before use
    migrations.py  the one forward-only migration runner and the ``Schema`` each store
                   describes its versions with

Nothing here imports any other part of Marque, so every wing may stand on it. SQL that
names a table stays in the store that owns the table.
"""
