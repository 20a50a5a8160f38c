"""Tools: schemas from hints and docstrings, load errors that say what to change, and
execution where every failure is a message to the model and a timeout kills the process."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Literal, Optional

import pytest

from rlpost.rollout.agent.parsers import ToolCall
from rlpost.rollout.agent.tool_pool import ToolWorkerPool
from rlpost.rollout.agent.tool_schema import check_arguments, tool_schema
from rlpost.rollout.agent.tools import (
    ToolError,
    load_tool,
    load_tools,
    run_tool_calls,
    tool_from_function,
)

TOOLS_PY = '''
import os, subprocess, time

def slow(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return "slept"

def spin(pid_file: str) -> str:
    """Start a child, then loop forever."""
    child = subprocess.Popen(["sleep", "60"])
    with open(pid_file, "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    while True:
        pass

def boom(x: int) -> str:
    """Raise."""
    raise ValueError(f"bad x={x}")

def a_set() -> set:
    """Return something that is not JSON."""
    return {1, 2}

def structured(n: int) -> dict:
    """Return a dict, sent to the model as JSON."""
    return {"n": n, "squares": [i * i for i in range(n)]}

def touch(path: str, count: int) -> str:
    """Create a file (shows whether the tool ran at all)."""
    open(path, "w").close()
    return "touched"

async def nap(seconds: float) -> str:
    """Sleep on the event loop."""
    import asyncio
    await asyncio.sleep(seconds)
    return "napped"
'''


def search(
    query: str,
    limit: int,
    scale: float = 1.0,
    exact: bool = False,
    tags: list[str] | None = None,
    mode: Literal["fast", "deep"] = "fast",
    extra: dict = {},  # noqa: B006
    owner: Optional[int] = None,  # noqa: UP045
) -> str:
    """Search the index for documents.

    Longer text that is not part of the description.

    Args:
        query: What to look for.
        limit (int): How many results
            to return at most.
        scale: Score multiplier.
        mode: Search depth.

    Returns:
        The matches, one per line.
    """
    return ""


def test_schema_from_hints_and_docstring():
    assert tool_schema(search) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index for documents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {
                        "type": "integer",
                        "description": "How many results to return at most.",
                    },
                    "scale": {"type": "number", "description": "Score multiplier."},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
                    "mode": {"type": "string", "enum": ["fast", "deep"], "description": "Search depth."},
                    "extra": {"type": "object"},
                    "owner": {"type": "integer", "nullable": True},
                },
                "required": ["query", "limit"],
            },
        },
    }  # fmt: skip


def test_argument_check_names_every_problem():
    schema = tool_schema(search)
    assert check_arguments(schema, {"query": "x", "limit": 3, "tags": None, "mode": "deep"}) == []
    problems = check_arguments(
        schema, {"limit": True, "mode": "slow", "tags": ["a", 2], "scale": 2, "bogus": 1}
    )
    assert problems == [
        "missing required argument 'query'",
        "unexpected argument 'bogus' (accepted: ['exact', 'extra', 'limit', 'mode', 'owner', "
        "'query', 'scale', 'tags'])",
        "argument 'limit' must be integer, got boolean True",  # a bool is not an integer
        "argument 'mode' must be one of ['fast', 'deep'], got 'slow'",
        "argument 'tags' item 1 must be string, got integer 2",
    ]  # 'scale': 2 passes, an integer is a number


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "my_tools.py"
    path.write_text(TOOLS_PY)
    return path


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The pool, its workers' temporary directories in a folder of this module's own
    (``tempfile.tempdir``), so what a test finds there is this pool's alone, whatever
    else runs on the machine."""
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tool-tmp"))
    pool = ToolWorkerPool(max_workers=4)
    yield pool
    pool.close()
    tempfile.tempdir = saved


def _tools(tools_file: Path) -> dict:
    names = ["slow", "spin", "boom", "a_set", "structured", "touch", "nap"]
    return load_tools([f"{tools_file}:{n}" for n in names] + ["calculator"])


def test_load_errors_name_the_spec_and_the_fix(tmp_path, tools_file):
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    (tmp_path / "bad.py").write_text(
        "X = 3\ndef untyped(a):\n    '''Doc.'''\ndef undocumented(a: int) -> str:\n    return ''\n"
    )
    cases = {
        f"{tmp_path}/missing.py:f": "file '.*missing.py' does not exist; fix the path",
        f"{tmp_path}/broken.py:f": "importing .*broken.py' raised ModuleNotFoundError",
        "no_such_package_xyz.mod:f": "cannot import module 'no_such_package_xyz.mod'",
        f"{tools_file}:nope": "has no attribute 'nope'; it defines \\[.*'slow'",
        f"{tmp_path}/bad.py:X": "has type int, not a function",
        f"{tmp_path}/bad.py:untyped": "parameter 'a' has no type hint; annotate it",
        f"{tmp_path}/bad.py:undocumented": "undocumented has no docstring",
        "web_search": "'web_search' is not a built-in tool",
    }
    for spec, message in cases.items():
        with pytest.raises(ToolError, match=message) as info:
            load_tool(spec)
        assert repr(spec) in str(info.value) or spec in str(info.value)
    # all problems at once, each on its own line
    with pytest.raises(ToolError) as info:
        load_tools([f"{tools_file}:slow", *cases])
    assert str(info.value).startswith(f"{len(cases)} tool problem(s):")
    assert all(spec in str(info.value) for spec in cases)


def test_sync_tool_from_a_local_function_is_refused():
    def local(x: int) -> str:
        """Local."""
        return ""

    with pytest.raises(ToolError, match="must be a module-level function"):
        tool_from_function(local)


def _call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments, f"id_{name}")


def test_one_turns_calls_run_concurrently(tools_file, pool):
    tools = _tools(tools_file)
    asyncio.run(pool.warm_up(3))
    start = time.perf_counter()
    outcomes = asyncio.run(run_tool_calls([_call("slow", seconds=0.3)] * 3, tools, 5.0, pool))
    elapsed = time.perf_counter() - start
    assert [(o.status, o.text) for o in outcomes] == [("ok", "slept")] * 3
    assert elapsed < 0.6, f"3 x 0.3 s calls took {elapsed:.2f} s: they ran one after another"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent has yet to reap it


def test_timeout_kills_the_tool_process_and_its_children(tools_file, pool, tmp_path):
    tools = _tools(tools_file)
    pid_file = tmp_path / "pids"
    calls = [_call("spin", pid_file=str(pid_file)), _call("calculator", expression="6*7")]
    start = time.perf_counter()
    spin, calc = asyncio.run(run_tool_calls(calls, tools, 0.5, pool))
    assert 0.5 <= time.perf_counter() - start < 2.0
    assert spin.status == "timeout" and "timed out after 0.5 s and was stopped" in spin.text
    assert (calc.status, calc.text) == ("ok", "42")  # a built-in tool, by name
    worker_pid, child_pid = map(int, pid_file.read_text().split())
    time.sleep(0.05)
    assert not _alive(worker_pid) and not _alive(child_pid)
    assert worker_pid not in pool.pids()
    # the pool replaces the killed worker on demand
    again = asyncio.run(run_tool_calls([_call("slow", seconds=0.0)], tools, 5.0, pool))
    assert again[0].status == "ok"


def test_failures_are_messages_for_the_model(tools_file, pool, tmp_path):
    tools = _tools(tools_file)
    marker = tmp_path / "touched"
    calls = [
        _call("boom", x=3),
        _call("a_set"),
        _call("structured", n=3),
        _call("touch", path=str(marker)),  # missing 'count': refused before the call
        _call("touch", path=str(marker), count="2", color="red"),
        _call("nonexistent", q=1),
    ]
    outcomes = asyncio.run(run_tool_calls(calls, tools, 5.0, pool))
    assert [o.status for o in outcomes] == ["error", "error", "ok", "error", "error", "error"]
    texts = [o.text for o in outcomes]
    assert texts[0] == "Error: boom raised ValueError: bad x=3"
    assert texts[1] == "Error: a_set returned a set, which is neither a str nor JSON-serialisable"
    assert texts[2] == '{"n": 3, "squares": [0, 1, 4]}'
    assert texts[3] == "Error: bad arguments for touch: missing required argument 'count'"
    assert texts[4] == (
        "Error: bad arguments for touch: unexpected argument 'color' (accepted: "
        "['count', 'path']); argument 'count' must be integer, got string '2'"
    )
    assert texts[5].startswith("Error: unknown tool 'nonexistent'; available: ['a_set', ")
    assert not marker.exists()
    assert [o.call.id for o in outcomes] == [c.id for c in calls]


def test_async_tools_run_in_process_and_are_cancelled(tools_file, pool):
    tools = _tools(tools_file)
    assert tools["nap"].is_async
    pids_before = pool.pids()
    ok, late = asyncio.run(
        run_tool_calls([_call("nap", seconds=0.01), _call("nap", seconds=10)], tools, 0.3, pool)
    )
    assert (ok.status, ok.text) == ("ok", "napped")
    assert late.status == "timeout" and late.seconds < 1.0
    assert pool.pids() == pids_before  # no worker used


def _sandbox_processes() -> list[int]:
    """Live processes running the python tool's sandbox script in a working
    directory under this module's temporary folder (the ``pool`` fixture's): the
    sandboxes this module started, whatever else runs on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (
            entry.name.isdigit()
            and b"rollout/agent/sandbox_child.py" in cmdline
            and cwd.startswith(tempfile.gettempdir())
            and _alive(int(entry.name))
        ):
            found.append(int(entry.name))
    return found


def test_python_tool_containments_are_counted_and_leave_nothing_behind(pool):
    tools = load_tools(["python"])
    assert list(tools) == ["python"]  # the name the model calls
    code = {
        "ok": "print(6 * 7)",
        "network": "import socket\nsocket.create_connection(('10.1.2.3', 80), timeout=1)",
        "write_outside": "open('/etc/rlpost-sandbox-test', 'w')",
        "memory": "x = bytearray(2 << 30)",
        "raise": "1 / 0",
        "sleep": "import time\ntime.sleep(60)",
    }
    calls = [ToolCall("python", {"code": c}, name) for name, c in code.items()]
    outcomes = {o.call.id: o for o in asyncio.run(run_tool_calls(calls, tools, 20.0, pool))}
    assert (outcomes["ok"].status, outcomes["ok"].text) == ("ok", "42\n")
    for name in ("network", "write_outside", "memory", "raise"):
        assert outcomes[name].status == "error", (name, outcomes[name].text)
        assert outcomes[name].text.startswith("Error: python failed:\n"), outcomes[name].text
    assert "ZeroDivisionError" in outcomes["raise"].text
    assert not Path("/etc/rlpost-sandbox-test").exists()
    # the sandbox's own 5 s wall limit: a timeout, counted as one
    sleep = outcomes["sleep"]
    assert sleep.status == "timeout" and "time limit of 5 s exceeded" in sleep.text, sleep.text

    # a call timeout shorter than the sandbox's: the pool kills the worker, and the
    # sandbox's processes and its directory go with it
    before = set(Path(tempfile.gettempdir()).glob("rlpost-*"))
    call = ToolCall("python", {"code": code["sleep"]}, "short")
    (late,) = asyncio.run(run_tool_calls([call], tools, 1.0, pool))
    assert late.status == "timeout" and "timed out after 1 s" in late.text
    deadline = time.monotonic() + 5
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == []
    assert set(Path(tempfile.gettempdir()).glob("rlpost-*")) <= before
