"""Tools served by an MCP server: ``agent.tools=[mcp:<server>]``.

``<server>`` is a Python script (``mcp:servers/search.py``), started with the
run's Python and spoken to over stdio, or a URL (``mcp:http://host:8000/mcp``),
reached over streamable HTTP. The server's tools (names, descriptions, input
schemas) join the episode's tools, so the chat template shows them to the model,
and the model's calls of them are executed by the server through the MCP client.

**When it is checked.** ``load_mcp_tools`` connects once, lists the tools and
disconnects; it runs where ``agent.tools`` is loaded for the config checks, so
a server that does not start, or a URL that does not answer, is a config error
before Ray starts.

**Sessions.** By default each episode has its own MCP session per server
(``EpisodeSessions``): a script is started for the episode and stopped at its
end, a URL gets a session of its own, so a stateful server never carries one
episode's state into another. A session opens on the episode's first call of
one of the server's tools. A script is a process per episode, though: seconds
of CPU each, which a step of a hundred episodes on a few cores cannot afford.
With ``agent.mcp_sessions=run`` every episode of a rollout worker calls through
one session per server (``RunSessions``), opened on first use and kept for the
run: right for servers that keep no state between calls, as a calculator or a
search API.

**Limits.** A call runs under ``agent.tool_timeout_s`` like any tool; its text
is cut at ``tool_base.MAX_OUTPUT_CHARS`` (as the python sandbox's output) with
a marker line. A result the server flags as an error, non-text content, or a
server that dies mid-episode is a failed call the model reads about, counted in
``agent/tool_errors``: never fatal to the run.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlpost.rollout.agent.tool_base import MAX_OUTPUT_CHARS, ToolFailed

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

PREFIX = "mcp:"
CONNECT_TIMEOUT_S = 60.0


class McpError(ValueError):
    """An MCP server that cannot be used; the message says what to change."""


def is_mcp_spec(spec: str) -> bool:
    return spec.startswith(PREFIX)


@dataclass(frozen=True)
class McpServer:
    """One ``mcp:`` spec: a script to start over stdio, or a URL."""

    spec: str

    @property
    def target(self) -> str:
        return self.spec[len(PREFIX) :]

    @property
    def is_url(self) -> bool:
        return self.target.startswith(("http://", "https://"))

    def client(self) -> Client:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        server: StdioServerParameters | str = self.target
        if not self.is_url:
            script = str(Path(self.target).resolve())
            server = StdioServerParameters(command=sys.executable, args=[script])
        return Client(server, read_timeout_seconds=CONNECT_TIMEOUT_S)


@dataclass(frozen=True)
class McpToolFn:
    """A call of tool ``name`` on ``server`` outside an episode: its own session,
    opened and closed for the call. Within an episode ``EpisodeSessions.bind``
    replaces it with one that uses the episode's session."""

    server: McpServer
    name: str

    async def __call__(self, **arguments: object) -> str:
        async with self.server.client() as client:
            return await call_tool(client, self.name, arguments)


async def call_tool(client: Client, name: str, arguments: dict[str, object]) -> str:
    """The text of one call; a result the server flags as an error, or one that is
    not text, raises ``ToolFailed`` with what the model should read."""
    result = await client.call_tool(name, arguments)
    texts, other = [], []
    for part in result.content:
        text = getattr(part, "text", None)
        if isinstance(text, str):
            texts.append(text)
        else:
            other.append(getattr(part, "type", type(part).__name__))
    text = "\n".join(texts)
    if len(text) > MAX_OUTPUT_CHARS:
        cut = len(text) - MAX_OUTPUT_CHARS
        text = f"{text[:MAX_OUTPUT_CHARS]}\n[... {cut} more characters cut]"
    if result.is_error:
        raise ToolFailed(text or "the server reported an error")
    if other:
        raise ToolFailed(f"returned content of type {', '.join(other)}; only text is passed on")
    return text


def load_mcp_tools(spec: str) -> list[tuple[str, McpToolFn, dict]]:
    """``(name, fn, OpenAI-style function schema)`` for each tool of the server
    ``spec`` names, listed now; raises ``McpError`` naming the spec when the
    server cannot be reached or started."""
    server = McpServer(spec)
    if not server.target:
        raise McpError(f"tool {spec!r}: name a server after 'mcp:' (a .py script or a URL)")
    if not server.is_url and not Path(server.target).is_file():
        raise McpError(
            f"tool {spec!r}: {server.target} is not a file; give an MCP server script "
            "(started with this Python over stdio) or an http(s):// URL"
        )
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise McpError(f"tool {spec!r}: MCP tools need the mcp package (pip install mcp)") from None

    async def listed() -> list:
        async with server.client() as client:
            return list((await client.list_tools()).tools)

    try:
        tools = _run_apart(asyncio.wait_for(listed(), CONNECT_TIMEOUT_S))
    except Exception as exc:  # any failure to start or reach it is the config's
        how = "reached" if server.is_url else "started (its own output, above, may say why)"
        raise McpError(
            f"tool {spec!r}: the MCP server could not be {how} "
            f"({type(exc).__name__}: {_first_error(exc)})"
        ) from None
    if not tools:
        raise McpError(f"tool {spec!r}: the MCP server lists no tools")
    out = []
    for tool in tools:
        parameters = {
            "type": "object",
            "properties": {},
            "required": [],
            **(tool.input_schema or {}),
        }
        function = {"name": tool.name, "parameters": parameters}
        if tool.description:
            function["description"] = tool.description
        out.append(
            (tool.name, McpToolFn(server, tool.name), {"type": "function", "function": function})
        )
    return out


class EpisodeSessions:
    """One episode's MCP sessions, one per server, opened on the episode's first
    call of that server's tools and closed with the episode (``aclose``). Open
    and close them from the episode's own task: the client's scopes belong to it."""

    def __init__(self) -> None:
        self._stack = AsyncExitStack()
        self._clients: dict[McpServer, Client] = {}

    async def open(self, servers: set[McpServer]) -> None:
        for server in servers - set(self._clients):
            self._clients[server] = await self._stack.enter_async_context(server.client())

    def bind(self, fn: McpToolFn):  # noqa: ANN201 - an async callable like the tool's
        async def call(**arguments: object) -> str:
            client = self._clients.get(fn.server)
            if client is None:  # opened by ``open`` before the turn's calls run
                return await fn(**arguments)
            return await call_tool(client, fn.name, arguments)

        return call

    async def aclose(self) -> None:
        self._clients.clear()
        await self._stack.aclose()


class RunSessions:
    """One session per server for every episode on an event loop, opened on first use
    by a task of its own (the client's scopes belong to it) and kept until the loop
    ends. ``EpisodeSessions``' interface, so an episode does not know which it has."""

    _open: dict[tuple[int, McpServer], asyncio.Future[Client]] = {}  # (loop, server) -> client

    async def open(self, servers: set[McpServer]) -> None:
        loop = asyncio.get_running_loop()
        for server in servers:
            key = (id(loop), server)
            if key not in RunSessions._open:
                RunSessions._open[key] = loop.create_future()
                loop.create_task(self._hold(key, server, RunSessions._open[key]))
            await asyncio.shield(RunSessions._open[key])

    @staticmethod
    async def _hold(
        key: tuple[int, McpServer], server: McpServer, ready: asyncio.Future[Client]
    ) -> None:
        """Open the session, hand it out, and hold it until the loop cancels this task
        (its end); a session that fails to open is tried again by the next episode."""
        try:
            async with server.client() as client:
                ready.set_result(client)
                await asyncio.Event().wait()
        except Exception as exc:  # the episode's calls report it to the model
            if not ready.done():
                ready.set_exception(exc)
        finally:
            RunSessions._open.pop(key, None)

    def bind(self, fn: McpToolFn):  # noqa: ANN201 - an async callable like the tool's
        async def call(**arguments: object) -> str:
            key = (id(asyncio.get_running_loop()), fn.server)
            opened = RunSessions._open.get(key)
            if opened is None or not opened.done() or opened.exception() is not None:
                return await fn(**arguments)  # a session of its own, as outside an episode
            return await call_tool(opened.result(), fn.name, arguments)

        return call

    async def aclose(self) -> None:
        """Nothing to end: the sessions outlive the episode."""


def _run_apart(coro: Coroutine[object, object, list]) -> list:
    """Run ``coro`` to completion on a loop of its own, in a thread when the caller
    is already inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: list = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.extend(asyncio.run(coro))
        except BaseException as exc:  # handed back to the caller
            failure.append(exc)

    thread = threading.Thread(target=target, name="rlpost-mcp-list")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result


def _first_error(exc: BaseException) -> str:
    """The innermost message of an exception group (anyio wraps a failed connect)."""
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup's
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return str(exc) or type(exc).__name__
