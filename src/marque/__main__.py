"""``python -m marque``: the same command line as the ``marque`` script."""

from marque.cli import main

main()
