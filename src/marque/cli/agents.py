"""``marque mcp``: the MCP server an AI agent uses as a Harbourmaster requester (docs/agents.md).

Over stdio (the default: an MCP client starts this command and speaks MCP on
its stdin/stdout, so nothing else is ever written to stdout), or over
streamable HTTP with ``--http 127.0.0.1:PORT``, when it prints one ready line
``{url}`` and serves until stopped. Before serving it checks that the token is
an ``agent`` principal's and that ``--key`` is that agent's registered key: a
misconfigured server refuses to start rather than fail on the first call.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from marque.cli.common import (
    CommandExit,
    emit_json,
    err,
    guarded,
    harbour_option,
    json_option,
    read_json_file,
)
from marque.errors import InvalidInput, Unauthenticated

__all__ = ["mcp_command"]


def _token(token: str | None, token_file: Path | None) -> str:
    if token and token_file:
        raise InvalidInput("give one of --token and --token-file")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InvalidInput(f"--token-file {token_file}: {exc.strerror}") from exc
    if not token:
        raise Unauthenticated("no token: give --token-file FILE (or $MARQUE_TOKEN) holding the "
                              "token `marque harbour principal add NAME --role agent` printed")
    return token


@click.command("mcp")
@harbour_option
@click.option("--token", envvar="MARQUE_TOKEN", default=None,
              help="The agent principal's bearer token; default: $MARQUE_TOKEN. Prefer "
                   "--token-file: a command line is visible to other users.")
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="A file holding the agent's token.")
@click.option("--key", type=click.Path(path_type=Path), required=True,
              help="The agent's private JWK (it signs the proofs of possession its marques "
                   "need); its public part is the one registered with --key at "
                   "`principal add`.")
@click.option("--pilot", "pilot_url", default=None, metavar="URL",
              help="Execute through this Pilot URL instead of the one the Pilot registered.")
@click.option("--pilot-id", default=None,
              help="The Pilot a tool call uses when it names none.")
@click.option("--target", default=None, help="The target a tool call uses when it names none.")
@click.option("--http", "http_listen", default=None, metavar="HOST:PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp (loopback only) instead of "
                   "stdio.")
@json_option
@guarded
def mcp_command(harbour_url: str | None, token: str | None, token_file: Path | None, key: Path,
                pilot_url: str | None, pilot_id: str | None, target: str | None,
                http_listen: str | None, as_json: bool) -> None:
    """Serve MCP tools through which an AI agent reads, asks for changes, waits for a human's
    approval and executes them — as an agent principal, which can never approve."""
    from marque.agents.server import loopback_listen, run_http, run_stdio
    from marque.agents.tools import AgentConfig, AgentTools

    if not harbour_url:
        raise InvalidInput("no Harbourmaster: give --harbour URL or set MARQUE_HARBOUR")
    if http_listen is not None:
        loopback_listen(http_listen)  # refused before anything is contacted
    config = AgentConfig(harbour_url=harbour_url, token=_token(token, token_file),
                         key=read_json_file(key, "agent key"), pilot_url=pilot_url,
                         pilot_id=pilot_id, target=target)
    tools = AgentTools(config)
    try:
        who = tools.start()
        if http_listen is None:
            err.say(f"[dim]marque mcp: agent {who['name']} on stdio[/]")
            run_stdio(tools)
        else:
            def ready(url: str) -> None:
                if as_json:
                    emit_json({"url": url, "agent": who["name"], "pid": os.getpid()})
                else:
                    click.echo(f"marque mcp: agent {who['name']} at {url}")

            run_http(tools, http_listen, on_ready=ready)
    finally:
        tools.close()
    raise CommandExit(0)
