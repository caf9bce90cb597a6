"""The ``--home`` option every offline ``marque harbour …`` command takes (its own module, so
that the commands' modules and the group that lists them need not import each other)."""

from __future__ import annotations

from pathlib import Path

import click

harbour_home_option = click.option(
    "--home", type=click.Path(path_type=Path), required=True,
    help="The Harbourmaster's home directory (holds harbour.json, the issuer key and, "
         "by default, the store).")
