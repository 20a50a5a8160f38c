"""Worker processes that run sync tools, so that a call past its timeout can be stopped.

Each worker is a fresh interpreter (``python -m rollout.agent.tool_pool``) in
its own process group. It re-imports a tool by its spec (a registered name,
``file.py:fn`` or ``module:fn``), calls it and answers with one JSON line. A call
past its timeout gets the worker's whole process group killed (the tool's own
children too) and the worker is replaced on demand; an idle worker is reused.

Why processes and not threads: a thread running Python code cannot be stopped.
Why a pool and not a fork per call: forking a parent that holds a model and
threads is unsafe, and a fresh interpreter per call costs tens of milliseconds;
a pooled call costs a pipe round trip.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

READY = b'{"ready": true}\n'
START_TIMEOUT_S = 60.0


class ToolProcessError(RuntimeError):
    """A worker died or could not start."""


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        # the parent's import path, so 'module:fn' specs resolve in the child as here,
        # and in a checkout its top folder (where rlpost is importable without installing);
        # in an installed rlpost that would be the package folder itself: left out
        top = Path(__file__).resolve().parents[2]
        root = [str(top)] if (top / "rlpost" / "__init__.py").is_file() else []
        env["PYTHONPATH"] = os.pathsep.join([*root, *[p for p in sys.path if p]])
        # The worker's own temporary directory, removed when it is killed: a tool
        # stopped mid-call leaves no temporary files behind. Traversable by all, so
        # a tool may hand a directory inside it to a process of another user.
        self.tmp = tempfile.mkdtemp(prefix="rlpost-tool-")
        os.chmod(self.tmp, 0o711)
        env["TMPDIR"] = self.tmp
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "rlpost.rollout.agent.tool_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # own process group: kill() reaches the tool's children
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdin = self.proc.stdin
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.ready = False

    async def read_line(self) -> bytes:
        """The next line the worker writes; ``ToolProcessError`` if it exits first."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                if not done.done():
                    done.set_exception(ToolProcessError("tool process exited"))
                return
            self.buffer += chunk
            if b"\n" in self.buffer and not done.done():
                done.set_result(None)

        if b"\n" not in self.buffer:
            loop.add_reader(self.fd, on_readable)
            try:
                await done
            finally:
                loop.remove_reader(self.fd)
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def send(self, request: dict[str, object]) -> None:
        self.stdin.write(json.dumps(request).encode() + b"\n")
        self.stdin.flush()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.stdin.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class ToolWorkerPool:
    """Runs ``spec(**arguments)`` in worker processes, at most ``max_workers`` at once.

    ``call`` returns ``(status, text)`` with status ``ok``, ``error`` or ``timeout``;
    the timeout counts from the moment a ready worker receives the call, so waiting
    for a free worker or for a new interpreter to start is not charged to the tool.
    """

    def __init__(self, max_workers: int = 8):
        if max_workers < 1:
            raise ValueError(f"max_workers={max_workers} must be >= 1")
        self.max_workers = max_workers
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.started = 0  # workers started so far (replacements included)
        self.killed = 0  # workers killed on timeout

    def pids(self) -> list[int]:
        return [w.proc.pid for w in [*self._idle, *self._busy]]

    async def call(
        self, spec: str, arguments: dict[str, object], timeout_s: float
    ) -> tuple[str, str]:
        worker = await self._acquire()
        try:
            worker.send({"spec": spec, "arguments": arguments})
            line = await asyncio.wait_for(worker.read_line(), timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            self._discard(worker, killed=True)
            raise
        except (ToolProcessError, BrokenPipeError, OSError) as e:
            code = worker.proc.poll()
            self._discard(worker, killed=False)
            return "error", f"the tool's process died ({e}, exit code {code})"
        self._release(worker)
        reply = json.loads(line)
        return reply["status"], reply["text"]

    async def warm_up(self, count: int) -> None:
        """Start ``count`` workers now (at most ``max_workers``) so first calls are fast."""
        n = min(count, self.max_workers)
        workers = await asyncio.gather(*(self._acquire() for _ in range(n)))
        for w in workers:
            self._release(w)

    def close(self) -> None:
        """Kill every worker; the pool starts new ones if used again."""
        for w in [*self._idle, *self._busy]:
            w.kill()
        self._idle.clear()
        self._busy.clear()

    async def _acquire(self) -> _Worker:
        while True:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    self._busy.add(worker)
                    return worker
                worker.kill()
            if len(self._busy) < self.max_workers:
                worker = _Worker()
                self._busy.add(worker)
                self.started += 1
                try:
                    line = await asyncio.wait_for(worker.read_line(), START_TIMEOUT_S)
                except BaseException:
                    self._discard(worker, killed=False)
                    raise
                if line + b"\n" != READY:
                    self._discard(worker, killed=False)
                    raise ToolProcessError(f"tool worker failed to start: {line[:200]!r}")
                return worker
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _release(self, worker: _Worker) -> None:
        self._busy.discard(worker)
        self._idle.append(worker)
        self._wake()

    def _discard(self, worker: _Worker, *, killed: bool) -> None:
        self._busy.discard(worker)
        worker.kill()
        self.killed += killed
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


_DEFAULT: ToolWorkerPool | None = None


def default_pool() -> ToolWorkerPool:
    """The process-wide pool, started lazily and killed at exit."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ToolWorkerPool()
        atexit.register(_DEFAULT.close)
    return _DEFAULT
