"""An MCP server for the tests, run over stdio (or streamable HTTP with --http
PORT): a counter whose state lives in the server process, a tool that fails and
one that prints more than a tool's output limit."""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("counter")
state = {"n": 0}


@server.tool()
def bump(by: int = 1) -> str:
    """Add to the counter and return its value."""
    state["n"] += by
    return str(state["n"])


@server.tool()
def divide(a: int, b: int) -> str:
    """Divide a by b."""
    return str(a / b)


@server.tool()
def shout(times: int) -> str:
    """Say A, many times."""
    return "A" * times


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run(transport="streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
