"""Marque: preview, approve and execute database changes exactly once, within budget.

The public API is curated here (``__all__``, pinned by a test); everything
else is importable for the curious but may change.
"""

__version__ = "0.1.0"
