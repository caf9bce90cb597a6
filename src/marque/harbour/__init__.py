"""The Harbourmaster side: the logbook that outcome reports land in."""
