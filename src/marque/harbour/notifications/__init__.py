"""Notifications: signed webhooks to the people who decide (docs/notifications.md).

A request's move that a human should hear about — it waits for approval, it was
approved or rejected, it executed, it needs reconciling — writes an event to
the store's outbox in the same transaction as the move (``events.py`` says
which moves, ``store/webhook_sql.py`` writes them). ``delivery.py`` posts each
event to every configured endpoint that wants it, signed as the Standard
Webhooks specification describes (``signing.py``), in the generic JSON shape
or as a Slack incoming-webhook message (``formats.py``), at least once, with
retries and backoff; ``endpoints.py`` checks what an operator configures and
``admin.py`` is what ``marque harbour webhooks`` runs.
"""
