"""``marque mcp``: an MCP server through which an AI agent asks for changes (docs/agents.md).

The server acts as one Harbourmaster principal of the role ``agent``: it may
request, read its own requests and execute its own approved marques. What an
agent may not do is refused by the Harbourmaster itself, never only by the
tool list here, so a tool this server lacks is no gap in the rules.

    schemas.py   the tools: names, descriptions, JSON schemas
    nonces.py    the execution nonce derived from a request and an attempt
    answers.py   request objects and errors as an agent reads them (with the next step)
    tools.py     the tools' behaviour, synchronous, over the Harbourmaster and Pilot clients
    server.py    the MCP SDK's low-level server over stdio or streamable HTTP

(The package is not named ``mcp``: that is the SDK's.)
"""
