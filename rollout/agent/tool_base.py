"""What every tool shares, beneath the tool runner (``tools``), the python
sandbox and MCP servers' tools: the exceptions a tool raises to say how its call
ended, and how much of a call's output the model reads."""

from __future__ import annotations

MAX_OUTPUT_CHARS = 2000  # a call's output beyond it is cut, with a marker line


class ToolFailed(Exception):
    """Raised by a tool to report a failed call in its own words: the message is
    what the model reads, and the call counts in ``agent/tool_errors``."""


class ToolTimeout(Exception):
    """Raised by a tool that stopped its own work at a time limit: the message is
    what the model reads, and the call counts in ``agent/tool_timeouts``."""
