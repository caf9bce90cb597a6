"""The MCP server: the SDK's low-level :class:`mcp.server.Server` over the agent's tools.

Tools are listed with their JSON schemas (``schemas.py``) and called in a worker
thread (the tools block on HTTP). A Marque error is answered as an MCP *tool
error* (``is_error``), its body ``{error: {code, message, next_step, detail}}``
both as structured content and as JSON text, so a model sees it and can act;
only a fault in this server itself is a protocol error.

Two transports: stdio (an MCP client starts ``marque mcp`` itself) and
streamable HTTP on a loopback address (``--http 127.0.0.1:PORT``, path
``/mcp``). The HTTP endpoint has no authentication of its own — whoever reaches
it acts as the agent — so it binds to loopback only, with the SDK's DNS
rebinding protection on.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext

from marque import __version__
from marque.agents.answers import error_answer
from marque.agents.schemas import TOOLS
from marque.agents.tools import AgentTools
from marque.errors import InvalidInput, MarqueError

__all__ = ["build_server", "run_stdio", "run_http", "loopback_listen", "HTTP_PATH"]

#: Where the streamable HTTP transport answers.
HTTP_PATH = "/mcp"

INSTRUCTIONS = (
    "Marque lets you read and change databases safely. query reads at once. request_change "
    "asks for a change and returns immediately: a human approves it (you never can), so "
    "call wait_for_decision, then execute. execute never applies twice for the same "
    "attempt. Every answer has next_step: follow it."
)


def _tools() -> list[types.Tool]:
    return [types.Tool(name=spec.name, description=spec.description,
                       input_schema=spec.schema,
                       annotations=types.ToolAnnotations(
                           read_only_hint=spec.read_only, destructive_hint=not spec.read_only,
                           idempotent_hint=True, open_world_hint=False))
            for spec in TOOLS]


def _result(body: dict[str, Any], *, error: bool) -> types.CallToolResult:
    text = json.dumps(body, ensure_ascii=False, default=str)
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=json.loads(text), is_error=error)


def build_server(tools: AgentTools) -> Server[Any]:
    """The MCP server answering ``tools/list`` and ``tools/call`` with ``tools``."""

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tools())

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            body = await anyio.to_thread.run_sync(tools.call, params.name, params.arguments)
        except MarqueError as exc:
            return _result(error_answer(exc), error=True)
        return _result(body, error=False)

    return Server("marque", version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run_stdio(tools: AgentTools) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    anyio.run(_serve_stdio, build_server(tools))


def loopback_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` of a loopback address, else ``input_invalid`` (the endpoint acts as the
    agent for whoever reaches it)."""
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        loopback = sep == ":" and (host == "localhost" or ipaddress.ip_address(host).is_loopback)
    except ValueError:
        loopback = False
        port = -1
    if not loopback or not 0 <= port <= 65535:
        raise InvalidInput(f"--http takes a loopback HOST:PORT such as 127.0.0.1:8765, not "
                           f"{listen[:64]!r}: the MCP endpoint has no login of its own, so it "
                           "never listens beyond this machine")
    return host, port


def run_http(tools: AgentTools, listen: str, *, on_ready: Any = None) -> None:
    """Serve MCP over streamable HTTP at ``http://HOST:PORT/mcp`` until stopped.

    ``on_ready(url)`` is called once the socket listens (port 0: the port chosen)."""
    import socket

    import uvicorn

    host, port = loopback_listen(listen)
    server = build_server(tools)
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections queue from here on, before uvicorn accepts them
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    running = uvicorn.Server(config)
    if on_ready is not None:
        on_ready(f"http://{shown}:{bound}{HTTP_PATH}")
    running.run(sockets=[sock])
