"""Parts the test tiers share, below all of them.

* :mod:`support.wait` — :func:`~support.wait.wait_until`, the one poll-until-true loop;
* :mod:`support.net` — a free loopback port;
* :mod:`support.pgcluster` — a throwaway PostgreSQL cluster, and databases in it;
* :mod:`support.pgproxy` — a TCP proxy in front of PostgreSQL that can lose a COMMIT
  (the ``pg_proxy`` fixture in ``tests/conftest.py`` makes them for a test);
* :mod:`support.harbour` — Harbourmaster homes, ``harbour serve`` and ``pilot serve``
  processes, and :class:`~support.harbour.HarbourWorld`, a Harbourmaster with a Pilot
  joined to it (the stack the Harbourmaster's end-to-end and browser tests share);
* :mod:`support.world` — :class:`~support.world.PilotWorld`, what the end-to-end and
  PostgreSQL tiers' Pilot worlds share (keys, issuing defaults, reading the bank);
* :mod:`support.effects_world` — an in-process Pilot world for Effect Sets.

Nothing here imports a tier's own helpers, so every tier (and the soak and the
benchmarks, which put ``tests/`` on ``sys.path``) can use it.
"""
