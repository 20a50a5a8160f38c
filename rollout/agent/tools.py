"""Tools: plain Python functions (sync or async) with type hints and a docstring.

A tool is named by a spec: a registered name (``TOOLS``), ``'path/to/file.py:fn'``
or ``'package.module:fn'``; ``'mcp:<server script or URL>'`` names every tool of
an MCP server (``mcp_tools``). ``run_tool_calls`` runs the calls of one assistant
turn concurrently. Sync tools run in worker processes (``tool_pool``) that are
killed when a call passes its timeout; async tools run on the caller's event
loop and are cancelled at the timeout (an async tool that blocks the loop cannot
be stopped: make blocking tools sync). Every failure a model can cause (unknown
tool, bad arguments, a raise, a bad return value, a timeout) becomes a message
for the model, never an exception.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlpost.rollout.agent.json_types import JSONObject
from rlpost.rollout.agent.parsers import ToolCall
from rlpost.rollout.agent.specs import SPEC_FORMS, load_object
from rlpost.rollout.agent.tool_base import ToolFailed, ToolTimeout
from rlpost.rollout.agent.tool_pool import ToolWorkerPool, default_pool
from rlpost.rollout.agent.tool_schema import SchemaError, check_arguments, tool_schema

# name -> spec; imported on use, so a tool's dependencies stay optional.
TOOLS: dict[str, str] = {
    "calculator": "rlpost.rollout.agent.builtin_tools:calculator",
    "multiply": "rlpost.rollout.agent.builtin_tools:multiply",
    "python": "rlpost.rollout.agent.sandbox:python",
}

Status = Literal["ok", "error", "timeout"]


class ToolError(ValueError):
    """A tool cannot be loaded or described; the message says what to change."""


@dataclass(frozen=True)
class Tool:
    name: str  # what the model calls it: the function's name
    fn: Callable[..., Any]  # sync or async: a call returns the value, or an awaitable of it
    schema: JSONObject  # OpenAI-style function schema, see ``tool_schema``
    spec: str  # how a worker process imports it again
    is_async: bool


@dataclass(frozen=True)
class ToolOutcome:
    call: ToolCall
    status: Status
    text: str  # what the model reads
    seconds: float


def register_tool(name: str, spec: str) -> None:
    """Add a built-in tool name for ``spec`` (a ``module:fn`` a worker can import)."""
    if name in TOOLS and TOOLS[name] != spec:
        raise ToolError(f"tool name {name!r} is already registered for {TOOLS[name]!r}")
    TOOLS[name] = spec


def load_tool(spec: str) -> Tool:
    """Resolve ``spec`` to a ``Tool``; every failure is a ``ToolError`` naming the spec."""
    target = TOOLS.get(spec, spec)
    if ":" not in target:
        raise ToolError(
            f"tool {spec!r} is not a built-in tool ({sorted(TOOLS)}); use a built-in name or "
            f"{SPEC_FORMS}"
        )
    fn = load_object(target, "tool", ToolError)
    if not callable(fn) or isinstance(fn, type):
        raise ToolError(
            f"tool {spec!r}: has type {type(fn).__name__}, not a function; point the spec at a "
            "function with type hints and a docstring"
        )
    try:
        schema = tool_schema(fn)
    except SchemaError as e:
        raise ToolError(f"tool {spec!r}: {e}") from None
    return Tool(schema["function"]["name"], fn, schema, spec, inspect.iscoroutinefunction(fn))


def tool_from_function(fn: Callable[..., object]) -> Tool:
    """A ``Tool`` for a function object: async functions run in-process; a sync one must
    be importable by a worker (a module-level function of an importable module)."""
    try:
        schema = tool_schema(fn)
    except SchemaError as e:
        raise ToolError(f"tool {getattr(fn, '__name__', fn)!r}: {e}") from None
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    spec = f"{module}:{qualname}"
    is_async = inspect.iscoroutinefunction(fn)
    if not is_async and (module in (None, "__main__") or "." in qualname or "<" in qualname):
        raise ToolError(
            f"tool {fn.__name__!r}: a sync tool runs in a worker process that imports it, so it "
            f"must be a module-level function of an importable module (got {spec!r}); put it "
            f"in a file and pass {SPEC_FORMS}"
        )
    return Tool(schema["function"]["name"], fn, schema, spec, is_async)


def load_mcp_server_tools(spec: str) -> list[Tool]:
    """The tools of the MCP server ``mcp:<script or URL>`` (``mcp_tools``), listed now."""
    from rlpost.rollout.agent.mcp_tools import McpError, load_mcp_tools

    try:
        listed = load_mcp_tools(spec)
    except McpError as e:
        raise ToolError(str(e)) from None
    return [Tool(name, fn, schema, spec, True) for name, fn, schema in listed]


def load_tools(specs: Iterable[str]) -> dict[str, Tool]:
    """``{name: Tool}`` for every spec (``mcp:<server>`` gives each of the server's
    tools); one ``ToolError`` lists every problem at once."""
    tools: dict[str, Tool] = {}
    problems: list[str] = []
    for spec in specs:
        try:
            loaded = load_mcp_server_tools(spec) if spec.startswith("mcp:") else [load_tool(spec)]
        except ToolError as e:
            problems.append(str(e))
            continue
        for tool in loaded:
            if tool.name in tools:
                problems.append(
                    f"tool {spec!r}: name {tool.name!r} is already taken by "
                    f"{tools[tool.name].spec!r}"
                )
                continue
            tools[tool.name] = tool
    if problems:
        raise ToolError(f"{len(problems)} tool problem(s):\n  - " + "\n  - ".join(problems))
    return tools


def result_text(value: object) -> tuple[Status, str]:
    """A tool's return value as text for the model: a str as is, else its JSON."""
    if isinstance(value, str):
        return "ok", value
    try:
        return "ok", json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return "error", (
            f"returned a {type(value).__name__}, which is neither a str nor JSON-serialisable"
        )


async def run_tool_calls(
    calls: list[ToolCall],
    tools: Mapping[str, Tool],
    timeout_s: float,
    pool: ToolWorkerPool | None = None,
) -> list[ToolOutcome]:
    """Run one turn's calls concurrently; one outcome per call, in the calls' order.

    Arguments are checked against each tool's schema before any call. A sync call
    past ``timeout_s`` has its worker process killed; an async one is cancelled.
    """
    return list(await asyncio.gather(*(_run(c, tools, timeout_s, pool) for c in calls)))


async def _run(
    call: ToolCall, tools: Mapping[str, Tool], timeout_s: float, pool: ToolWorkerPool | None
) -> ToolOutcome:
    start = time.perf_counter()

    def outcome(status: Status, text: str) -> ToolOutcome:
        return ToolOutcome(call, status, text, time.perf_counter() - start)

    tool = tools.get(call.name)
    if tool is None:
        return outcome("error", f"Error: unknown tool {call.name!r}; available: {sorted(tools)}")
    problems = check_arguments(tool.schema, call.arguments)
    if problems:
        return outcome("error", f"Error: bad arguments for {call.name}: " + "; ".join(problems))
    status: str
    try:
        if tool.is_async:
            status, text = await _run_async(tool, call.arguments, timeout_s)
        else:
            status, text = await (pool or default_pool()).call(tool.spec, call.arguments, timeout_s)
    except asyncio.TimeoutError:
        return outcome(
            "timeout", f"Error: {call.name} timed out after {timeout_s:g} s and was stopped"
        )
    if status == "timeout":
        return outcome("timeout", f"Error: {call.name} stopped at its time limit:\n{text}")
    if status != "ok":
        return outcome("error", f"Error: {call.name} {text}")
    return outcome("ok", text)


async def _run_async(
    tool: Tool, arguments: dict[str, object], timeout_s: float
) -> tuple[Status, str]:
    try:
        value = await asyncio.wait_for(tool.fn(**arguments), timeout_s)
    except asyncio.TimeoutError:
        raise
    except ToolTimeout as e:
        return "timeout", str(e)
    except ToolFailed as e:
        return "error", f"failed:\n{e}"
    except Exception as e:  # the tool's failure is a message to the model
        return "error", f"raised {type(e).__name__}: {e}"
    return result_text(value)


__all__ = [
    "TOOLS",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolOutcome",
    "ToolTimeout",
    "load_tool",
    "load_tools",
    "register_tool",
    "result_text",
    "run_tool_calls",
    "tool_from_function",
]
