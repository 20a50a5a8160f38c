"""The calculator task's tool served by an MCP server, for ``agent.tools=[mcp:...]``.

    python -m rlpost.main algo=grpo agent=calculator \\
        agent.tools=[mcp:examples/agents/mcp_multiply_server.py]

rlpost starts this script with its own Python for each episode that calls the
tool, and speaks MCP to it over stdio. ``python examples/agents/mcp_multiply_server.py
--http 8000`` serves it over streamable HTTP instead
(``agent.tools=[mcp:http://127.0.0.1:8000/mcp]``).
"""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run(transport="streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
