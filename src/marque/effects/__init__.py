"""Effect Sets (DESIGN §7, seed 002): row-level changes previewed, approved as one CID,
dispatched row by row under their own idempotency keys, and accounted for in receipts.

The modules, each one concept, all pure (no connection, no I/O):

* :mod:`~marque.effects.declare` — declarations and their captured input relations;
* :mod:`~marque.effects.cids` — every closed preimage, in the seed's order;
* :mod:`~marque.effects.preview` — the preview object, its verification, freshness;
* :mod:`~marque.effects.dispatch` — the per-row dispatch ledger states and the
  halt/continue planner;
* :mod:`~marque.effects.receipts` — member, set and reconciliation receipts;
* :mod:`~marque.effects.run` — the Run state machine and its ``actql-run-state/0.1``
  projection.
"""
