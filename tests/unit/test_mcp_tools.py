"""agent.tools=[mcp:<server>]: an MCP server's tools, listed through the real
``mcp`` client from a real server (tests/mcp/counter_server.py, over stdio and
over streamable HTTP), called through each episode's own session."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from rlpost.rollout.agent.env import ToolEnv  # noqa: E402
from rlpost.rollout.agent.mcp_tools import MAX_OUTPUT_CHARS  # noqa: E402
from rlpost.rollout.agent.tools import ToolError, load_tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COUNTER = f"mcp:{ROOT / 'tests/mcp/counter_server.py'}"


@pytest.fixture(scope="module")
def tools():
    return load_tools([COUNTER, "multiply"])


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}
    ]}  # fmt: skip


async def episode(tools, *messages, sessions: str = "episode") -> list[str]:
    env = ToolEnv(tools, timeout_s=30, mcp_sessions=sessions)
    try:
        replies = []
        for message in messages:
            out, done, _ = await env.step(message)
            replies += [m["content"] for m in out]
        return replies
    finally:
        await env.close()


def test_the_servers_tools_join_the_episodes_with_their_schemas(tools):
    assert sorted(tools) == ["bump", "divide", "multiply", "shout"]
    bump = tools["bump"].schema["function"]
    assert bump["description"] == "Add to the counter and return its value."
    assert bump["parameters"]["properties"]["by"]["type"] == "integer"
    assert tools["bump"].spec == COUNTER and tools["bump"].is_async


def test_each_episode_has_its_own_session(tools):
    async def two_episodes():
        first = episode(tools, call("bump", by=2), call("bump", by=3))
        second = episode(tools, call("bump", by=10))
        return await asyncio.gather(first, second)

    first, second = asyncio.run(two_episodes())
    # the counter lives in the server: one process per episode, so neither sees the other
    assert first == ["2", "5"] and second == ["10"]


def test_with_run_sessions_every_episode_calls_one_server_process(tools):
    async def three_episodes():
        first = await episode(tools, call("bump", by=2), sessions="run")
        together = episode(tools, call("bump", by=3), sessions="run")
        also = episode(tools, call("bump", by=10), sessions="run")
        return first, await asyncio.gather(together, also)

    first, (a, b) = asyncio.run(three_episodes())
    # one counter for the loop: the later episodes see the earlier ones' bumps
    assert first == ["2"] and sorted([int(a[0]), int(b[0])]) in ([5, 15], [12, 15])
    # a new loop (the next batch of episodes) opens a session of its own
    assert asyncio.run(episode(tools, call("bump", by=1), sessions="run")) == ["1"]


def test_failures_and_long_output_are_what_the_model_reads(tools):
    env = ToolEnv(tools, timeout_s=30)

    async def run():
        try:
            await env.step(call("divide", a=1, b=0))
            await env.step(call("shout", times=MAX_OUTPUT_CHARS + 500))
            await env.step(call("bump", by="x"))  # the schema check, before the server
        finally:
            await env.close()

    asyncio.run(run())
    divided, shouted, bad = env.outcomes
    # the server says what failed (this one keeps the exception to itself)
    assert divided.status == "error" and "Error executing tool divide" in divided.text
    assert shouted.status == "ok"
    assert shouted.text == "A" * MAX_OUTPUT_CHARS + "\n[... 500 more characters cut]"
    assert bad.status == "error" and "bad arguments for bump" in bad.text


def test_a_server_that_cannot_start_or_be_found_is_a_tool_error():
    broken = f"mcp:{ROOT / 'tests/mcp/broken_server.py'}"
    with pytest.raises(ToolError) as info:
        load_tools([broken, "mcp:no/such/server.py", "mcp:"])
    text = str(info.value)
    assert "3 tool problem(s)" in text
    assert f"tool {broken!r}: the MCP server could not be started" in text
    assert "no/such/server.py is not a file" in text
    assert "name a server after 'mcp:'" in text


def test_a_server_reached_by_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(ROOT / "tests/mcp/counter_server.py"),
                               "--http", str(port)], stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"mcp:http://127.0.0.1:{port}/mcp"
        for _ in range(100):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        tools = load_tools([url])
        assert sorted(tools) == ["bump", "divide", "shout"]
        replies = asyncio.run(episode(tools, call("bump", by=4), call("divide", a=9, b=3)))
        assert replies == ["4", "3.0"]
    finally:
        server.terminate()
        server.wait(timeout=10)
    with pytest.raises(ToolError, match="could not be reached"):
        load_tools([url])
