"""The built-in ``python`` tool: run model-written code in a contained child process.

Each call starts a fresh interpreter (``python -I -B`` running this file) in its
own session, in a new empty working directory that is removed afterwards. The
child sets up its own containment before the model's code runs, in layers:

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
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "killed"]

_CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
}
_CODE_NAME = "<code>"


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run. ``max_processes`` is RLIMIT_NPROC, which the kernel
    counts per user: as root every sandbox runs as ``nobody``, so concurrent
    sandboxes share it."""

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 256
    max_output_chars: int = 2000
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
    from rlpost.rollout.agent.tools import ToolFailed, ToolTimeout

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
            [sys.executable, "-I", "-B", os.path.abspath(__file__), json.dumps(config)],
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
) -> tuple[list[dict[str, Any]], bool]:
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
    reports: list[dict[str, Any]], timed_out: bool, proc_rc: int | None, limits: SandboxLimits
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
    def make_writable_and_retry(func: Any, p: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)

    shutil.rmtree(path, onerror=make_writable_and_retry)


# ---------------------------------------------------------------------------
# Child side: runs as ``python -I -B sandbox.py CONFIG`` with the code on stdin.

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_PR_SET_NO_NEW_PRIVS = 38
_CAP_DAC_READ_SEARCH = 2
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# audit event -> indices of (path, dir_fd) argument pairs that name something modified
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((1, 3),),
    "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.truncate": ((0, None),),
    "os.mkfifo": ((0, 2),),
    "os.mknod": ((0, 3),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
}
_PROCESS_EVENTS = {
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "subprocess.Popen",
}
_NETWORK_EVENTS = {
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
}
_NETWORK_ERRNOS = {101, 99, 113}  # ENETUNREACH, EADDRNOTAVAIL, EHOSTUNREACH


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the code does something the sandbox forbids."""


SandboxViolation.__module__ = "builtins"  # tracebacks show a bare name to the model


def _child_main(config: dict[str, Any]) -> int:
    import ctypes
    import io
    import resource

    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    libc = ctypes.CDLL(None, use_errno=True)
    # Die with the caller: a caller killed mid-call (a tool worker past its
    # timeout) cannot end this session's processes itself.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != config["parent_pid"]:
        return 1  # the caller died before the line above took effect
    namespaces = _unshare(libc)
    status_fd = config["status_fd"]

    pid = os.fork()  # the child is the first process of the new PID namespace, if there is one
    if pid:
        _, wait_status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        os.write(status_fd, json.dumps({"wait_status": wait_status, "cpu_s": cpu}).encode() + b"\n")
        return 0

    cpu_s = math.ceil(config["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    memory = config["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    file_size = config["max_file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nproc = config["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises EFBIG instead
    dropped = _drop_privileges(libc, *config["ids"]) if config["ids"] else ""
    config["read_all"] = dropped == "uid-read-all"
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    isolation = {
        "network": "netns" if "net" in namespaces else "hook",
        "processes": "pidns" if "pid" in namespaces else ("nproc" if dropped else "hook"),
        "filesystem": dropped or "hook",
    }
    os.write(status_fd, json.dumps({"isolation": isolation}).encode() + b"\n")
    os.close(status_fd)

    for stream in (sys.stdout, sys.stderr):
        assert isinstance(stream, io.TextIOWrapper)
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    if config["python_guard"]:
        sys.addaudithook(_make_guard(config["workdir"]))
    return _run_user_code(code, config)


def _unshare(libc: Any) -> set[str]:
    """Enter new network and PID namespaces where the kernel allows it."""
    attempts = [(_CLONE_NEWNET | _CLONE_NEWPID, {"net", "pid"}), (_CLONE_NEWNET, {"net"})]
    if os.geteuid() != 0:
        attempts = [(flags | _CLONE_NEWUSER, got) for flags, got in attempts] + attempts
    uid, gid = os.getuid(), os.getgid()
    for flags, got in attempts:
        if libc.unshare(flags) == 0:
            if flags & _CLONE_NEWUSER:  # map ourselves, or files cannot be created
                for name, text in (
                    ("setgroups", "deny"),
                    ("uid_map", f"{uid} {uid} 1"),
                    ("gid_map", f"{gid} {gid} 1"),
                ):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
            return got
    return set()


def _drop_privileges(libc: Any, uid: int, gid: int) -> str:
    """Become ``uid`` (nobody), which may write only in the working directory.

    If nobody cannot read the interpreter's own files (it may live under a
    0700 /root), keep CAP_DAC_READ_SEARCH so imports still work: then every
    file root can read stays readable. Returns "uid", "uid-read-all", or ""
    where the kernel refuses."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    def set_caps(mask: int) -> None:
        header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
        if libc.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset failed after dropping to nobody")

    if libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        return ""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    set_caps(1 << _CAP_DAC_READ_SEARCH)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    # access() checks with the real uid and without capabilities: what nobody alone may do
    if all(os.access(p, os.R_OK | os.X_OK) for p in sys.path if os.path.isdir(p)):
        set_caps(0)
        return "uid"
    return "uid-read-all"


def _make_guard(workdir: str) -> Any:
    root = os.path.realpath(workdir)
    me = os.getpid()

    def resolve(path: Any, dir_fd: Any) -> str:
        if isinstance(path, int):
            return os.readlink(f"/proc/self/fd/{path}")
        path = os.fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)

    def check_path(path: Any, dir_fd: Any = None) -> None:
        real = resolve(path, dir_fd)
        if real != root and not real.startswith(root + os.sep):
            shown = path if isinstance(path, int) else os.fsdecode(path)
            raise SandboxViolation(f"writing outside the working directory is not allowed: {shown}")

    def guard(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, _mode, flags = args
            if isinstance(flags, int) and flags & _WRITE_FLAGS and not isinstance(path, int):
                check_path(path)
        elif event in _PATH_EVENTS:
            for i, j in _PATH_EVENTS[event]:
                check_path(args[i], None if j is None else args[j])
        elif event in _PROCESS_EVENTS:
            raise SandboxViolation(
                f"starting new processes is not allowed in this sandbox ({event})"
            )
        elif event in _NETWORK_EVENTS:
            raise SandboxViolation("network access is disabled in this sandbox")
        elif event in ("os.kill", "os.killpg") and args[0] not in (me, 0):
            raise SandboxViolation("signalling other processes is not allowed in this sandbox")

    return guard


def _run_user_code(code: str, config: dict[str, Any]) -> int:
    import builtins
    import linecache
    import traceback
    import types

    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = [_CODE_NAME]
    linecache.cache[_CODE_NAME] = (len(code), None, code.splitlines(True), _CODE_NAME)
    reserve: bytearray | None = bytearray(1 << 20)  # freed to report a MemoryError
    try:
        exec(compile(code, _CODE_NAME, "exec"), module.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: B036 - the model's code may raise anything
        reserve = None
        chain = _exception_chain(exc)
        if any(isinstance(e, MemoryError) for e in chain):
            module.__dict__.clear()
            traceback.clear_frames(exc.__traceback__)
        sys.stdout.flush()
        te = traceback.TracebackException.from_exception(exc)
        _strip_sandbox_frames(te)
        sys.stderr.write("".join(te.format()))
        message = _explain(chain, config)
        if message:
            sys.stderr.write(f"error: {message}\n")
        return 1
    del reserve
    return 0


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _strip_sandbox_frames(te: Any) -> None:
    """Drop this file's frames (the exec call, the audit hook) from a traceback."""
    import traceback

    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        frames = [f for f in te.stack if f.filename != __file__]
        te.stack = traceback.StackSummary.from_list(frames)
        te = te.__cause__ or te.__context__


def _explain(chain: list[BaseException], config: dict[str, Any]) -> str:
    """The sandbox rule or limit behind an exception, if any, in words for the model."""
    for e in chain:
        if isinstance(e, SandboxViolation):
            return str(e)
        if isinstance(e, MemoryError):
            return f"memory limit of {config['memory_mb']} MB exceeded (MemoryError)"
        if isinstance(e, OSError) and e.errno == 27:  # EFBIG
            return f"file size limit of {config['max_file_mb']} MB exceeded"
        if isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS:
            return "network access is disabled in this sandbox"
        # with CAP_DAC_READ_SEARCH every read succeeds, so a denial is a write
        if isinstance(e, PermissionError) and isinstance(e.filename, str) and config["read_all"]:
            real = os.path.realpath(e.filename)
            if not real.startswith(config["workdir"] + os.sep):
                return f"writing outside the working directory is not allowed: {e.filename}"
    return ""


if __name__ == "__main__":
    sys.exit(_child_main(json.loads(sys.argv[1])))
