"""The run timeline: every process's spans, gathered once a step into ``trace.json``.

``trainer.trace`` (``steps`` by default) sets each process's recorder
(``rlpost.runtime.spans``); after each step the controller drains its own and
asks every trainer rank and rollout replica for theirs (one small Ray call
each, answered between their other calls), then appends them to the trace file
(``rlpost.loop.trace_file``). What that costs is logged as ``perf/trace_s``; a
worker that does not answer within ``DRAIN_WAIT_S`` is asked again next step
(``perf/trace_missed_drains`` counts those).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ray

from rlpost.loop.roles import Workers
from rlpost.loop.trace_file import TraceFile
from rlpost.runtime.spans import RECORDER, Event
from rlpost.workers.ray_types import ActorHandle

log = logging.getLogger(__name__)
DRAIN_WAIT_S = 2.0


def trace_level(value: object) -> str:
    """``trainer.trace`` as a level: booleans are ``steps`` and ``off``."""
    if value is True:
        return "steps"
    if value is False or value is None:
        return "off"
    return str(value)


class Timeline:
    def __init__(self, level: str, run_dir: Path, workers: Workers):
        self.level, self.path, self.workers = level, run_dir / "trace.json", workers
        self.file: TraceFile | None = None
        self._pending: list[ray.ObjectRef] = []
        self.missed = 0
        RECORDER.configure(level, "controller")
        RECORDER.drain()  # spans of an earlier run in this process (a notebook)
        if level != "off":
            ray.get([a.trace_events.remote(level, lane) for lane, a in self.lanes()])

    def lanes(self) -> list[tuple[str, ActorHandle]]:
        """Every worker with its lane name (read each time: a restarted rank is new)."""
        w = self.workers
        out = [(f"rollout replica {i}", a) for i, a in enumerate(w.rollout.workers)]
        for role, group in (
            ("policy", w.policy), ("reference", w.reference), ("critic", w.critic),
            ("teacher", w.teacher),
        ):  # fmt: skip
            if group is not None:
                out += [(f"{role} rank {r}", a) for r, a in enumerate(group.workers)]
        return out

    def open(self, resumed_after: int) -> None:
        """Start the trace file (a resumed run keeps the steps up to ``resumed_after``)."""
        if self.level == "off":
            return
        if resumed_after > 0 and self.path.exists():
            self.file = TraceFile.resume(self.path, resumed_after)
        else:
            self.file = TraceFile(self.path)

    def collect(self) -> dict[str, float]:
        """Drain every process's spans into the trace file; returns the cost figures."""
        if self.file is None:
            return {}
        start = time.perf_counter()
        self._pending += [a.trace_events.remote(self.level, lane) for lane, a in self.lanes()]
        ready, self._pending = ray.wait(
            self._pending, num_returns=len(self._pending), timeout=DRAIN_WAIT_S
        )
        events: list[Event] = RECORDER.drain()
        for ref in ready:
            try:
                events += ray.get(ref)
            except ray.exceptions.RayError:  # a dead worker: its recovery is elsewhere
                self.missed += 1
        self.missed += len(self._pending)
        self.file.write(events)
        return {
            "perf/trace_s": time.perf_counter() - start,
            "perf/trace_missed_drains": float(self.missed),
        }

    def close(self, collect: bool = True) -> None:
        """The last spans (``collect``: the workers' too, when they are still up), then
        the file's end."""
        if self.file is None:
            return
        if collect:
            self.collect()
        else:
            self.file.write(RECORDER.drain())
        self.file.close()
        self.file = None
