"""An MCP server script that fails before it serves anything."""

raise SystemExit("this server needs a database that is not there")
