"""The built-in ``python`` tool: run model-written code in a contained child process.

Each call starts a fresh interpreter (``python -I -B sandbox_child.py``, the
child side) in its own session, in a new empty working directory that is
removed afterwards. The child sets up its own containment before the model's
code runs, in layers:

* kernel: a new network namespace (no interfaces but a down loopback) and a new
  PID namespace (when its first process exits the kernel kills every process in
  it); as root, the code runs as ``nobody``, so it can write nowhere but the
  working directory, and RLIMIT_NPROC bounds how many processes it may start
  (if nobody cannot read the interpreter's files it keeps the capability to
  read any file, and reads are then not restricted);
* rlimits: CPU seconds, data segment (memory), file size, no core files;
* Python: an audit hook that refuses network calls, starting processes,
  signalling other processes and writing, removing or renaming outside the
  working directory, with a message the model can read;
* parent: a wall-clock deadline, after which the whole process group is killed;
  it is killed at the end of every call in any case.

Which kernel layers are in force depends on the privileges the caller has and
what the kernel permits; ``SandboxResult.isolation`` says which were.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Literal, TypedDict

from rlpost.rollout.agent import sandbox_child
from rlpost.rollout.agent.tool_base import MAX_OUTPUT_CHARS

Status = Literal["ok", "error", "timeout", "killed"]

_CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
}
# Run as a script, not with -m, so no package __init__ runs in the sandbox.
_CHILD_SCRIPT = os.path.abspath(sandbox_child.__file__)


class _Report(TypedDict, total=False):
    """A line the child writes on the status pipe: the isolation in force, or how
    the code's process exited and the CPU time it used."""

    isolation: dict[str, str]
    wait_status: int
    cpu_s: float


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run. ``max_processes`` is RLIMIT_NPROC, which the kernel
    counts per user: as root every sandbox runs as ``nobody``, so concurrent
    sandboxes share it."""

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 256
    max_output_chars: int = MAX_OUTPUT_CHARS
    max_file_mb: int = 8
    max_processes: int = 64
    python_guard: bool = True  # the audit hook; off only to test the kernel layers alone

    def __post_init__(self) -> None:
        bad = [
            f"{name}={getattr(self, name)!r} (must be > 0)"
            for name in ("wall_s", "cpu_s", "memory_mb", "max_output_chars", "max_file_mb")
            if getattr(self, name) <= 0
        ]
        if self.max_processes < 1:
            bad.append(f"max_processes={self.max_processes!r} (must be >= 1)")
        if bad:
            raise ValueError("invalid SandboxLimits: " + ", ".join(bad))


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """``output``: what the code printed (stdout and stderr interleaved), cut to
    ``max_output_chars`` plus a marker line, then an ``error: ...`` line when a
    limit or a rule stopped it. ``returncode`` is negative for a signal and None
    after a timeout. ``isolation`` maps network / processes / filesystem to the
    kernel mechanism in force ("netns"; "pidns", "nproc"; "uid", "uid-read-all")
    or "hook" where only the audit hook stands."""

    output: str
    status: Status
    returncode: int | None
    seconds: float
    isolation: dict[str, str]


def python(code: str) -> str:
    """Run Python code and return what it prints (stdout and stderr, cut to 2000
    characters). The code runs as a fresh script in an empty working directory,
    with no network access and no new processes; files can be written only in the
    working directory; it is stopped after 5 seconds or 256 MB of memory. Use
    print() to see values; an uncaught exception returns its traceback.

    Args:
        code: a complete Python program.
    """
    from rlpost.rollout.agent.tool_base import ToolFailed, ToolTimeout

    result = run_sandboxed(code)
    output = result.output if result.output else "(no output)"
    if result.status == "timeout":
        raise ToolTimeout(output)
    if result.status != "ok":  # an exception, a limit or a refused operation
        raise ToolFailed(output)
    return output


def run_sandboxed(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in a fresh contained interpreter and wait for it (at most
    ``limits.wall_s``). Thread-safe; containment failures are reported in the
    result, and only a sandbox that cannot start at all raises RuntimeError."""
    limits = limits or SandboxLimits()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="rlpost-sandbox-"))
    try:
        return _run_in(workdir, code, limits)
    finally:
        _remove_tree(workdir)


def _run_in(workdir: str, code: str, limits: SandboxLimits) -> SandboxResult:
    ids = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("nobody")
            ids = (pw.pw_uid, pw.pw_gid)
        except KeyError:
            ids = (65534, 65534)
        os.chown(workdir, *ids)
    os.chmod(workdir, 0o700)
    status_r, status_w = os.pipe()
    config = {
        **dataclasses.asdict(limits),
        "workdir": workdir,
        "ids": ids,
        "status_fd": status_w,
        "parent_pid": os.getpid(),
    }
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", _CHILD_SCRIPT, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env={**_CHILD_ENV, "HOME": workdir, "TMPDIR": workdir},
            start_new_session=True,
            pass_fds=(status_w,),
        )
    finally:
        os.close(status_w)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(code.encode("utf-8", "surrogatepass"))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died before reading; its output says why
        clip = _Clip(limits.max_output_chars)
        reports, timed_out = _collect(
            proc, proc.stdout.fileno(), status_r, clip, start + limits.wall_s
        )
    finally:
        _kill_group(proc.pid)
        proc.wait()
        os.close(status_r)
        if proc.stdout is not None:
            proc.stdout.close()
    seconds = time.monotonic() - start
    output = clip.text()
    isolation: dict[str, str] = next((r["isolation"] for r in reports if "isolation" in r), {})
    if not isolation and not timed_out:
        raise RuntimeError(f"the sandbox failed to start (exit {proc.returncode}):\n{output}")
    status, returncode, message = _verdict(reports, timed_out, proc.returncode, limits)
    if message:
        output = (
            f"{output}\n{message}" if output and not output.endswith("\n") else output + message
        )
    return SandboxResult(output, status, returncode, seconds, isolation)


def _collect(
    proc: subprocess.Popen[bytes], out_fd: int, status_fd: int, clip: _Clip, deadline: float
) -> tuple[list[_Report], bool]:
    """Read output and status reports until both pipes close and the child exits,
    or the deadline passes. Returns (reports, timed_out)."""
    status_buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(out_fd, selectors.EVENT_READ)
        sel.register(status_fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in sel.select(remaining):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fd)
                elif key.fd == out_fd:
                    clip.feed(data)
                else:
                    status_buf += data
    clip.finish()
    reports = [json.loads(line) for line in status_buf.splitlines() if line.strip()]
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return reports, True
    return reports, False


def _verdict(
    reports: list[_Report], timed_out: bool, proc_rc: int | None, limits: SandboxLimits
) -> tuple[Status, int | None, str]:
    if timed_out:
        return "timeout", None, f"error: time limit of {limits.wall_s:g} s exceeded"
    exits = [r for r in reports if "wait_status" in r]
    if not exits:  # the supervisor itself was killed (e.g. by the kernel's OOM killer)
        return "killed", proc_rc, f"error: the sandbox was killed (exit {proc_rc})"
    wait_status, cpu_used = exits[0]["wait_status"], exits[0]["cpu_s"]
    if os.WIFEXITED(wait_status):
        rc = os.WEXITSTATUS(wait_status)
        return ("ok" if rc == 0 else "error"), rc, ""
    sig = os.WTERMSIG(wait_status)
    if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu_used >= math.ceil(limits.cpu_s) - 0.1:
        return "killed", -sig, f"error: CPU time limit of {limits.cpu_s:g} s exceeded"
    name = signal.Signals(sig).name
    hint = ""
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGKILL):
        hint = f" (possibly the memory limit of {limits.memory_mb} MB)"
    return "killed", -sig, f"error: the process was killed by {name}{hint}"


class _Clip:
    """Keeps the first and last ``limit`` characters of a byte stream and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.head = ""
        self.tail = ""
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        s = self._decoder.decode(data, final)
        self.total += len(s)
        if len(self.head) < self.limit:
            self.head += s[: self.limit - len(self.head)]
        self.tail = (self.tail + s)[-self.limit :]

    def finish(self) -> None:
        self.feed(b"", final=True)

    def text(self) -> str:
        if self.total <= self.limit:
            return self.head
        n_head = self.limit // 2
        n_tail = self.limit - n_head
        cut = self.total - self.limit
        marker = f"\n[... {cut} characters of output cut ...]\n"
        return self.head[:n_head] + marker + (self.tail[-n_tail:] if n_tail else "")


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def _kill_group(pgid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL every process in the group and wait until none is left running."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not _group_members(pgid):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandbox process group {pgid} survived SIGKILL")
        time.sleep(0.005)


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(func: Callable[[str], object], p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)

    shutil.rmtree(path, onerror=make_writable_and_retry)
