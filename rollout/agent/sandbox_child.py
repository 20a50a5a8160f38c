"""The sandbox's child side: the contained interpreter that runs the model's code.

``sandbox.py`` (the parent) starts ``python -I -B sandbox_child.py CONFIG`` with
the code on stdin. This process enters new network and PID namespaces where the
kernel allows it and forks; it waits for the forked process (the first of the
new PID namespace) and reports how it exited on the status pipe. The forked
process sets the rlimits, drops to ``nobody`` when started as root, reports
which kernel layers are in force, installs the audit hook and executes the
code as ``__main__``; an exception prints a traceback of the code's own frames
and the rule or limit behind it, in words the model can read.

Standard library only: ``-I`` leaves the script's directory and the
environment's paths out of ``sys.path``, and this file's frames are the ones
cut from tracebacks.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ctypes
    import traceback
    from collections.abc import Callable
    from typing import NotRequired, TypedDict

    class ChildConfig(TypedDict):
        """What the parent (``sandbox._run_in``) passes, as JSON: the ``SandboxLimits``
        fields, then where and as whom the code runs and where to report."""

        wall_s: float
        cpu_s: float
        memory_mb: int
        max_output_chars: int
        max_file_mb: int
        max_processes: int
        python_guard: bool
        workdir: str
        ids: list[int] | None  # (uid, gid) to drop to: nobody's, when started as root
        status_fd: int
        parent_pid: int
        read_all: NotRequired[bool]  # set here: nobody kept CAP_DAC_READ_SEARCH

    # sys.addaudithook's hook: an event's arguments are whatever that event passes.
    AuditHook = Callable[[str, tuple[Any, ...]], None]
    # What the audit hook sees as a path: a descriptor, or a str, bytes or path-like name.
    PathArg = int | str | bytes | os.PathLike[str] | os.PathLike[bytes]

_CODE_NAME = "<code>"

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


def _child_main(config: ChildConfig) -> int:
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


def _unshare(libc: ctypes.CDLL) -> set[str]:
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


def _drop_privileges(libc: ctypes.CDLL, uid: int, gid: int) -> str:
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


def _make_guard(workdir: str) -> AuditHook:
    root = os.path.realpath(workdir)
    me = os.getpid()

    def resolve(path: PathArg, dir_fd: object) -> str:
        if isinstance(path, int):
            return os.readlink(f"/proc/self/fd/{path}")
        path = os.fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)

    def check_path(path: PathArg, dir_fd: object = None) -> None:
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


def _run_user_code(code: str, config: ChildConfig) -> int:
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


def _strip_sandbox_frames(te: traceback.TracebackException | None) -> None:
    """Drop this file's frames (the exec call, the audit hook) from a traceback."""
    import traceback

    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        frames = [f for f in te.stack if f.filename != __file__]
        te.stack = traceback.StackSummary.from_list(frames)
        te = te.__cause__ or te.__context__


def _explain(chain: list[BaseException], config: ChildConfig) -> str:
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
