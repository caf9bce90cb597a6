"""Command groups whose subcommands are imported only when they run (click's lazy group).

A fresh ``marque`` process pays for every module it imports. A group built with
:class:`LazyGroup` names its subcommands as ``"module:attribute"`` strings and
imports one only when click asks for it by name — to run it, or to list the
group's commands in ``--help``. So ``marque exec`` imports the modules of
``exec`` and nothing of ``harbour serve``'s web stack, while ``marque --help``
still lists (and so imports) every command.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A :class:`click.Group` that also knows subcommands by ``"module:attribute"``."""

    def __init__(self, *args: Any, lazy_subcommands: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands: dict[str, str] = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every subcommand's name, the lazy ones included, sorted as click sorts them."""
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The subcommand ``cmd_name``, importing its module the first time it is asked for."""
        if cmd_name in self.lazy_subcommands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _load(self, cmd_name: str) -> click.Command:
        module_name, _, attribute = self.lazy_subcommands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}:{attribute} is not a click command")
        # Kept from now on as an ordinary subcommand: imported once per process.
        self.add_command(command, cmd_name)
        del self.lazy_subcommands[cmd_name]
        return command
