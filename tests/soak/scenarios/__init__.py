"""The rows of the fault matrix, one module each (see ``docs/reliability.md``)."""
