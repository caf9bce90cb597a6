"""Marque's HTTP clients, below both wings: one per service, one rule for their errors.

    pilot.py     :class:`~marque.clients.pilot.PilotClient`, a Pilot service's client
                 (``exec --pilot``, a Harbourmaster's previews)
    harbour.py   :class:`~marque.clients.harbour.HarbourClient`, the Harbourmaster's
                 (the control-plane CLI, a joined Pilot's reports)
    problems.py  how an answer becomes a typed error, the same for both
"""
