"""Reward calls in worker processes: concurrent, each bounded by a timeout.

A user's reward function can be slow (a code judge, a model call), hang, or
crash its interpreter. ``RewardPool`` runs calls in ``num_workers`` processes
that load the function by its spec; each worker has one call at a time, so a
call that passes ``timeout_s`` is stopped by killing its worker (which is then
replaced) and a worker that dies takes only its own call with it. Either is
reported as a failed call, like a raise; nothing reaches the driver but
outcomes.

Workers are fresh interpreters (``python -m rlpost.rewards.pool``), not forks:
the driver has Ray's threads, and forking a threaded process can deadlock the
child; nor ``multiprocessing``'s spawn, which re-runs the user's script in
each worker when it lacks an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from rlpost.rewards.loading import RewardFn

Status = Literal["ok", "error", "timeout", "crash"]
# One sample's extras: {"messages": a multi-turn episode's whole conversation}.
SampleExtras = dict[str, list[dict]]


class CallPlan(Protocol):
    """How a worker calls the function it loaded (``rlpost.rewards.scoring.CallPlan``);
    it crosses to the worker pickled."""

    def call(self, fn: RewardFn, completion: str, row: dict, extras: SampleExtras) -> object: ...


@dataclass
class Outcome:
    """One call's result: ``value`` when ``status == "ok"``, else ``error`` (a traceback
    or a line saying why it was stopped)."""

    status: Status
    value: object = None
    error: str = ""


def _serve(conn: Connection) -> None:
    """Worker loop: receive ``(spec, plan)``, load the function once, then answer
    ``(index, completion, row, extras)`` messages with ``(index, status, value_or_traceback)``."""
    from rlpost.rewards.loading import load_reward_fn

    # The driver decides when to stop: Ctrl-C in a terminal (SIGINT to the whole
    # process group) or a scheduler's SIGTERM to every process must not end a call
    # in flight; the driver closes its workers, and a driver that dies leaves them
    # an EOF on the socket.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    spec, plan = conn.recv()
    fn = load_reward_fn(spec)
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        index, completion, row, extras = msg
        try:
            value = plan.call(fn, completion, row, extras)
            pickle.dumps(value)  # an unpicklable return fails this call, not the worker
            conn.send((index, "ok", value))
        except Exception:
            conn.send((index, "error", traceback.format_exc()))


class _Worker:
    """One worker interpreter, talking over a socket pair."""

    def __init__(self, spec: str, plan: CallPlan):
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlpost.rewards.pool", str(child.fileno())],
            pass_fds=[child.fileno()],
            env=env,
            start_new_session=True,  # out of the terminal's process group: Ctrl-C is the driver's
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.conn.send((spec, plan))
        self.index: int | None = None  # the call it is running
        self.started = 0.0
        self.ready = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        self.conn.close()


class RewardPool:
    """``num_workers`` processes running one reward function (by ``spec``), called
    through ``plan`` (a ``rlpost.rewards.scoring.CallPlan``)."""

    def __init__(self, spec: str, plan: CallPlan, num_workers: int, timeout_s: float):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: a pool needs at least one worker")
        self.spec, self.plan, self.timeout_s = spec, plan, timeout_s
        self.workers = [_Worker(spec, plan) for _ in range(num_workers)]
        self.restarts = 0

    def map(
        self, completions: list[str], rows: list[dict], extras: list[SampleExtras]
    ) -> list[Outcome]:
        """Outcomes in input order. Never raises for a call's sake: a raise, a timeout
        and a crashed worker are each an outcome."""
        out: list[Outcome | None] = [None] * len(completions)
        todo = list(range(len(completions)))[::-1]  # popped from the end: input order
        while todo or any(w.index is not None for w in self.workers):
            for k, w in enumerate(self.workers):
                if w.index is None and w.ready and todo:
                    i = todo.pop()
                    try:
                        w.conn.send((i, completions[i], rows[i], extras[i]))
                    except OSError:  # died while idle: the call goes to its replacement
                        todo.append(i)
                        self._replace(k)
                        continue
                    w.index, w.started = i, time.monotonic()
            busy = [w for w in self.workers if w.index is not None or not w.ready]
            deadline = min(
                (w.started + self.timeout_s for w in busy if w.index is not None),
                default=time.monotonic() + self.timeout_s,
            )
            ready = wait([w.conn for w in busy], timeout=max(deadline - time.monotonic(), 0))
            for k, w in enumerate(self.workers):
                if w.conn in ready:
                    self._receive(k, w, out)
                elif w.index is not None and time.monotonic() - w.started > self.timeout_s:
                    out[w.index] = Outcome(
                        "timeout", error=f"stopped after reward.timeout_s={self.timeout_s:g} s"
                    )
                    self._replace(k)
        return [o if o is not None else Outcome("crash", error="lost") for o in out]

    def _receive(self, k: int, w: _Worker, out: list[Outcome | None]) -> None:
        try:
            index, status, payload = w.conn.recv()
        except (EOFError, OSError):  # the process died: its call is the one lost
            code = w.proc.wait(timeout=5)
            if w.index is not None:
                out[w.index] = Outcome("crash", error=f"the reward process died (exit code {code})")
            elif not w.ready:
                raise RuntimeError(
                    f"reward worker for {self.spec!r} died while loading the function "
                    f"(exit code {code}); its error is in the log above"
                ) from None
            self._replace(k)
            return
        if index == "ready":
            w.ready = True
            return
        out[index] = (
            Outcome("ok", value=payload) if status == "ok" else Outcome(status, error=payload)
        )
        w.index = None

    def _replace(self, k: int) -> None:
        self.workers[k].kill()
        self.workers[k] = _Worker(self.spec, self.plan)
        self.restarts += 1

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self.workers:
            try:
                w.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers = []


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
