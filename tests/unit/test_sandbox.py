"""The python tool's sandbox, exercised with real processes and real limits.

Each containment check runs twice where the kernel layer exists: with the
audit hook (what the model meets) and with the hook off, so the kernel layer
(network namespace, dropping to nobody, RLIMIT_NPROC / PID namespace) is shown
to hold on its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import textwrap
from collections.abc import Iterator

import pytest

from rlpost.rollout.agent import sandbox
from rlpost.rollout.agent.sandbox import SandboxLimits, run_sandboxed
from rlpost.rollout.agent.sandbox import python as python_tool

KERNEL_ONLY = SandboxLimits(python_guard=False)


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Process-group ids of the sandboxes started during the test (each child leads its own)."""
    started: list[int] = []

    class RecordingPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(sandbox.subprocess, "Popen", RecordingPopen)
    return started


@pytest.fixture(scope="module")
def isolation() -> dict[str, str]:
    return run_sandboxed("pass").isolation


def assert_no_processes_left(groups: list[int]) -> None:
    assert groups, "no sandbox was started"
    for pgid in groups:
        assert sandbox._group_members(pgid) == [], f"processes left in group {pgid}"


def run(code: str, limits: SandboxLimits | None = None) -> sandbox.SandboxResult:
    return run_sandboxed(textwrap.dedent(code), limits)


def test_prints_and_returns() -> None:
    result = run("""
        import sys
        print("hello", 6 * 7)
        print("to stderr", file=sys.stderr)
        print(__name__)
    """)
    assert result.status == "ok" and result.returncode == 0
    assert result.output == "hello 42\nto stderr\n__main__\n"
    assert set(result.isolation) == {"network", "processes", "filesystem"}
    assert python_tool("print('hi')") == "hi\n"
    assert python_tool("x = 1") == "(no output)"


def test_exception_returns_traceback_of_the_code_only() -> None:
    result = run("""
        def f(x):
            return 1 / x
        print("before")
        f(0)
    """)
    assert result.status == "error" and result.returncode == 1
    assert result.output.startswith("before\nTraceback (most recent call last):\n")
    assert 'File "<code>", line 5, in <module>' in result.output
    assert "return 1 / x" in result.output  # source lines are shown
    assert result.output.endswith("ZeroDivisionError: division by zero\n")
    assert "sandbox.py" not in result.output
    assert run("raise SystemExit(3)").returncode == 3
    syntax = run("print(1")
    assert syntax.status == "error" and "SyntaxError" in syntax.output


def test_infinite_loop_is_stopped_at_the_wall_limit(groups: list[int]) -> None:
    limits = SandboxLimits(wall_s=1, cpu_s=30)
    result = run("print('started', flush=True)\nwhile True:\n    pass", limits)
    assert result.status == "timeout" and result.returncode is None
    assert result.output == "started\nerror: time limit of 1 s exceeded"
    assert 1.0 <= result.seconds < 3.0
    assert_no_processes_left(groups)


def test_sleeping_code_is_stopped_at_the_wall_limit(groups: list[int]) -> None:
    # no CPU used, so only the wall timer can stop it
    result = run("import time\ntime.sleep(60)", SandboxLimits(wall_s=0.5))
    assert result.status == "timeout" and result.seconds < 2.5
    assert_no_processes_left(groups)


def test_cpu_bound_loop_hits_the_cpu_limit(groups: list[int]) -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_s=20, cpu_s=1))
    assert result.status == "killed"
    assert result.output.endswith("error: CPU time limit of 1 s exceeded")
    assert result.seconds < 10  # the CPU limit, not the wall limit, stopped it
    assert_no_processes_left(groups)


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(2 * 1024**3)",  # one 2 GB allocation
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))",  # 16 MB at a time
    ],
)
def test_memory_hog_is_contained(code: str) -> None:
    result = run(code)
    assert result.status == "error"
    assert "MemoryError" in result.output
    assert result.output.endswith("error: memory limit of 256 MB exceeded (MemoryError)\n")


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import os\nwhile True:\n    os.fork()", "os.fork"),
        (
            "import subprocess\nwhile True:\n    subprocess.Popen(['sleep', '60'])",
            "subprocess.Popen",
        ),
        ("import os\nos.system('sleep 60 &')", "os.system"),
    ],
)
def test_process_creation_is_refused(code: str, event: str, groups: list[int]) -> None:
    result = run(code)
    assert result.status == "error"
    assert result.output.endswith(
        f"error: starting new processes is not allowed in this sandbox ({event})\n"
    )
    assert_no_processes_left(groups)


def test_fork_loop_without_the_hook_is_bounded_and_reaped(
    groups: list[int], isolation: dict[str, str]
) -> None:
    if not isolation["filesystem"].startswith("uid"):
        pytest.skip("RLIMIT_NPROC binds only after dropping to nobody, which needs root")
    result = run(
        """
        import os, time
        children = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
        print(children)
        """,
        SandboxLimits(python_guard=False, max_processes=16),
    )
    assert result.status == "ok", result.output
    # RLIMIT_NPROC=16 counts every process of nobody, the sandbox itself included
    assert 1 <= int(result.output) <= 15
    assert_no_processes_left(groups)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


def connect_code(port: int) -> str:
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"


def assert_nobody_connected(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


def test_network_connection_fails(listener: socket.socket) -> None:
    result = run(connect_code(listener.getsockname()[1]))
    assert result.status == "error"
    assert result.output.endswith("error: network access is disabled in this sandbox\n")
    assert "connected" not in result.output
    assert_nobody_connected(listener)


def test_network_namespace_alone_blocks_loopback(
    listener: socket.socket, isolation: dict[str, str]
) -> None:
    if isolation["network"] != "netns":
        pytest.skip("the kernel refused a new network namespace here")
    result = run(connect_code(listener.getsockname()[1]), KERNEL_ONLY)
    assert result.status == "error"
    assert "Network is unreachable" in result.output
    assert result.output.endswith("error: network access is disabled in this sandbox\n")
    assert_nobody_connected(listener)


def write_outside_code(tmp_path) -> str:
    return f"""
        import os
        for path in [{str(tmp_path / "new.txt")!r}, "/etc/rlpost-sandbox-probe"]:
            try:
                with open(path, "w") as f:
                    f.write("x")
                print("wrote", path)
            except PermissionError as e:
                print("refused", path)
        for action in (lambda: os.remove({str(tmp_path / "keep.txt")!r}),
                       lambda: os.rename({str(tmp_path / "keep.txt")!r}, "stolen.txt")):
            try:
                action()
                print("changed")
            except PermissionError:
                print("refused")
        open({str(tmp_path / "last.txt")!r}, "a")
    """


@pytest.mark.parametrize("limits", [SandboxLimits(), KERNEL_ONLY], ids=["hook", "kernel"])
def test_writing_outside_the_working_directory_fails(
    limits: SandboxLimits, tmp_path, isolation: dict[str, str]
) -> None:
    if not limits.python_guard and not isolation["filesystem"].startswith("uid"):
        pytest.skip("without root the sandbox cannot drop to nobody")
    (tmp_path / "keep.txt").write_text("mine")
    result = run(write_outside_code(tmp_path), limits)
    lines = result.output.splitlines()
    assert lines[:4] == [
        f"refused {tmp_path / 'new.txt'}",
        "refused /etc/rlpost-sandbox-probe",
        "refused",
        "refused",
    ]
    assert result.status == "error"
    if limits.python_guard:
        assert lines[-1] == (
            f"error: writing outside the working directory is not allowed: {tmp_path / 'last.txt'}"
        )
    else:
        assert f"Permission denied: '{tmp_path / 'last.txt'}'" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert not os.path.exists("/etc/rlpost-sandbox-probe")


def test_writing_inside_the_working_directory_works() -> None:
    result = run("""
        import os, shutil, tempfile
        os.makedirs("data/sub")
        with open("data/sub/a.txt", "w") as f:
            f.write("inside")
        os.rename("data/sub/a.txt", "data/b.txt")
        with tempfile.NamedTemporaryFile("w", delete=False) as f:  # TMPDIR is the working dir
            f.write("tmp")
        print(open("data/b.txt").read(), sorted(os.listdir(".")), os.path.dirname(f.name) == os.getcwd())
        shutil.rmtree("data")
        print(os.getcwd())
    """)
    assert result.status == "ok", result.output
    first, cwd = result.output.splitlines()
    assert first.startswith("inside ['data', 'tmp") and first.endswith("True")
    assert not os.path.exists(cwd)  # the working directory is removed afterwards


def test_file_size_limit() -> None:
    code = "with open('big', 'wb') as f:\n    f.write(bytes(2 << 20))"
    result = run(code, SandboxLimits(max_file_mb=1))
    assert result.status == "error"
    assert result.output.endswith("error: file size limit of 1 MB exceeded\n")


def test_output_is_truncated_with_a_marker() -> None:
    # printed: "START" + 10_000 "x" + "\n" + "END\n" = 5 + 10_000 + 1 + 4 = 10_010 chars
    result = run("print('START' + 'x' * 10_000)\nprint('END')", SandboxLimits(max_output_chars=100))
    assert result.status == "ok"
    head, marker, tail = re.split(
        r"\n(\[\.\.\. \d+ characters of output cut \.\.\.\])\n", result.output
    )
    assert head == "START" + "x" * 45  # the first 50 characters
    assert tail == "x" * 45 + "\nEND\n"  # the last 50
    assert marker == "[... 9910 characters of output cut ...]"  # 10_010 - 100


def test_output_flood_is_drained_not_deadlocked() -> None:
    # 20 MB written by a single call: far beyond any pipe buffer
    result = run("import sys\nsys.stdout.write('y' * (20 << 20))\nprint('done')")
    assert result.status == "ok"
    assert result.output.endswith("ydone\n") and len(result.output) < 2100


def test_concurrent_calls_all_complete(groups: list[int]) -> None:
    async def main() -> list[sandbox.SandboxResult]:
        calls = [
            asyncio.to_thread(run_sandboxed, f"import time\ntime.sleep(0.5)\nprint({i})")
            for i in range(3)
        ]
        calls.append(asyncio.to_thread(run_sandboxed, "while True: pass", SandboxLimits(wall_s=1)))
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert [r.output for r in results[:3]] == ["0\n", "1\n", "2\n"]
    assert all(r.status == "ok" for r in results[:3])
    assert results[3].status == "timeout"
    assert len(groups) == 4
    assert_no_processes_left(groups)


def test_invalid_limits_are_all_reported() -> None:
    with pytest.raises(ValueError, match=r"wall_s=0 .*memory_mb=-1 .*max_processes=0"):
        SandboxLimits(wall_s=0, memory_mb=-1, max_processes=0)
