"""The rows of the fault matrix, one module each (see ``tests/soak/README.md``)."""
